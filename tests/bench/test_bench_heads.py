"""``speculant bench --medusa / --mlp-speculator / --eagle``: hidden-state head rows."""

from __future__ import annotations

import json

import pytest

from speculant.cli import main

HEAD_METHODS = ("medusa", "mlp_speculator", "eagle", "eagle_adaptive", "eagle_suffix")


@pytest.fixture(scope="module")
def heads_result(tmp_path_factory, llama_dir, random_heads_dirs, one_thread):
    """--quick at concurrency 1 and 2, --k 5 while the random heads predict 4 tokens."""
    out = tmp_path_factory.mktemp("bench_heads") / "r.json"
    code = main(["bench", "--quick", "--no-hf", "--target", str(llama_dir), "--k", "5", "--concurrency", "1,2",
                 "--medusa", str(random_heads_dirs["medusa"]),
                 "--mlp-speculator", str(random_heads_dirs["mlp_speculator"]),
                 "--eagle", str(random_heads_dirs["eagle"]), "--out", str(out)])
    return code, json.loads(out.read_text()) if out.is_file() else None


def test_head_rows_run_at_every_concurrency(heads_result):
    code, data = heads_result
    assert code == 0
    rows = {(r["method"], r["concurrency"]): r for r in data["rows"]}
    for method in HEAD_METHODS:
        for c in (1, 2):
            r = rows[(method, c)]
            assert r["engine"] == "speculant" and r["status"] == "ok", r
            assert r["matches_no_spec"] is True, r
            assert r["num_tokens"] == 2 * 8  # 2 prompts one by one at c=1, 2 requests at once at c=2
            assert 0.0 <= r["acceptance_rate"] <= 1.0
    for c in (1, 2):  # only the adaptive row plans its draft lengths
        assert 0.0 <= rows[("eagle_adaptive", c)]["mean_planned_draft_length"] <= 5.0
        assert rows[("eagle", c)]["mean_planned_draft_length"] == 5.0  # the fixed policy plans --k
    assert rows[("medusa", 1)]["itl_p50_ms"] > 0 and rows[("medusa", 2)]["itl_p50_ms"] is None
    assert data["settings"]["medusa"] and data["settings"]["mlp_speculator"] and data["settings"]["eagle"]


def test_head_rows_cap_k_to_what_the_heads_predict(heads_result):
    _, data = heads_result
    for r in data["rows"]:
        if r["method"] in ("medusa", "mlp_speculator"):
            assert r["k"] == 4 and r["heads_max_k"] == 4, r
            assert r["note"] == "k=4: --k 5 capped to the 4 tokens these heads predict", r
        elif r["method"] == "eagle":  # drafts autoregressively: no cap
            assert r["k"] == 5 and r["heads_max_k"] is None and "note" not in r, r
        elif r["method"] == "ngram":
            assert "note" not in r  # other rows keep chunked prefill and --k


def test_head_rows_keep_k_when_heads_suffice(tmp_path, llama_dir, random_heads_dirs):
    from speculant.bench.heads import head_method

    m = head_method("medusa", str(random_heads_dirs["medusa"]), str(llama_dir), 3, 10)
    assert m.speculative["num_speculative_tokens"] == 3 and m.fields == {"k": 3, "heads_max_k": 4}
    assert m.engine_kwargs == {} and m.note is None  # chunked prefill stays on
    assert m.speculative["proposer_options"] == {"path": str(random_heads_dirs["medusa"])}  # no threshold option


def test_eagle_rows_get_the_draft_confidence(llama_dir, random_heads_dirs):
    from speculant.bench.heads import head_methods

    m, adaptive, hybrid = head_methods({"eagle": str(random_heads_dirs["eagle"])}, str(llama_dir), 4, 10,
                                       confidence=0.3)
    assert m.speculative["proposer_options"] == {"path": str(random_heads_dirs["eagle"]),
                                                 "confidence_threshold": 0.3}
    assert m.fields == {"k": 4, "heads_max_k": None}
    # the eagle_adaptive row: the same head and k, the adaptive draft-length policy
    assert adaptive.name == "eagle_adaptive" and adaptive.speculative == {**m.speculative,
                                                                           "draft_length": {"policy": "adaptive"}}
    # the eagle_suffix row: the same head behind suffix decoding
    assert (hybrid.name, hybrid.speculative["proposer"]) == ("eagle_suffix", "eagle_suffix")
    assert hybrid.speculative["proposer_options"] == {"eagle": m.speculative["proposer_options"]}
    assert hybrid.speculative["num_speculative_tokens"] == 4


def test_a_proposer_without_chunked_prefill_gets_an_unchunked_engine(llama_dir, random_heads_dirs, monkeypatch):
    from speculant.bench.heads import head_method
    from speculant.interfaces import ProposerCapabilities
    from speculant.proposers.heads.mlp_speculator import MLPSpeculatorProposer

    monkeypatch.setattr(MLPSpeculatorProposer, "capabilities", ProposerCapabilities(
        needs_target_hidden_states=True, supports_chunked_prefill=False, draft_probs="full"))
    long = head_method("mlp_speculator", str(random_heads_dirs["mlp_speculator"]), str(llama_dir), 3, 600)
    assert long.engine_kwargs == {"enable_chunked_prefill": False, "max_num_batched_tokens": 600}
    assert "chunked prefill off" in long.note


@pytest.mark.parametrize(("option", "kind", "expect"), [
    ("--medusa", "mlp_speculator", "model_type"),  # the other head kind's directory
    ("--mlp-speculator", "medusa", "model_type"),
    ("--medusa", None, "no such directory"),
    ("--medusa", "empty", "no config.json"),
    ("--medusa", "narrow", "hidden_size 32"),
])
def test_bad_head_directory_is_a_clear_error(tmp_path, llama_dir, random_heads_dirs, capsys, option, kind, expect):
    from speculant.proposers.heads.common import save_heads
    from speculant.proposers.heads.medusa import MedusaHeads, medusa_config

    if kind == "empty":
        path = tmp_path / "empty"
        path.mkdir()
    elif kind == "narrow":
        path = tmp_path / "narrow"
        cfg = medusa_config(32, 384, 2)
        save_heads(MedusaHeads.from_config(cfg), cfg, path)
    else:
        path = random_heads_dirs[kind] if kind else tmp_path / "missing"
    code = main(["bench", "--quick", "--no-hf", "--target", str(llama_dir), option, str(path),
                 "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert option in err and expect in err, err
    assert not (tmp_path / "x.json").exists()
