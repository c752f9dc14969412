"""`speculant batch` on one local engine: input order, error records, resume, equality with LLM.generate."""

from __future__ import annotations

import json

import pytest

from batch_helpers import chat_model, expected_texts, greedy_rows, read_jsonl, write_jsonl
from speculant import LLM, SamplingParams
from speculant.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model(llama_dir, tmp_path_factory):
    return chat_model(llama_dir, tmp_path_factory.mktemp("batch-model"))


@pytest.fixture(scope="module")
def reference(model):
    return LLM(str(model))


def run_batch(src, out, model, *extra: str) -> dict:
    """Run the command; its one-line JSON summary."""
    return main(["batch", str(src), "--output", str(out), "--model", str(model), "--no-progress", *extra])


def test_greedy_records_in_input_order_equal_llm_generate(tmp_path, model, reference, capsys):
    rows = greedy_rows(20)
    assert run_batch(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", model,
                     "--set", "scheduler.max_num_seqs=3") == 0  # 6 in flight at a time: finishing order != input
    records = read_jsonl(tmp_path / "out.jsonl")
    assert [r["id"] for r in records] == [r["id"] for r in rows]
    assert {r["id"]: r["text"] for r in records} == expected_texts(reference, rows)
    for row, rec in zip(rows, records):
        assert rec["finish_reason"] == "length"
        assert rec["usage"]["completion_tokens"] == row["max_tokens"]
        assert rec["usage"]["total_tokens"] == rec["usage"]["prompt_tokens"] + row["max_tokens"]
        assert set(rec) == {"id", "text", "finish_reason", "usage", "speculant"}
    assert json.loads(capsys.readouterr().out) | {"seconds": 0} == \
        {"written": 20, "errors": 0, "skipped": 0, "seconds": 0}


def test_bad_lines_become_error_records_and_the_rest_runs(tmp_path, model, reference, capsys):
    good = greedy_rows(3)
    rows = [good[0],
            "{not json",
            {"prompt": "no id"},
            {"id": "no-prompt", "max_tokens": 3},
            {"id": "both", "prompt": "a", "messages": [{"role": "user", "content": "b"}]},
            good[1],
            {"id": "bad-top-p", "prompt": "a", "top_p": 1.5},
            {"id": "bad-temp", "prompt": "a", "temperature": "hot"},
            {"id": "unknown", "prompt": "a", "best_of": 2},
            {"id": "bad-token", "prompt": [1, 999999]},
            {"id": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
             "max_completion_tokens": 4, "temperature": 0, "ignore_eos": True},
            {"id": "bad-role", "messages": [{"role": "robot", "content": "hi"}]},
            good[0] | {"prompt": "dup"},
            good[2]]
    assert run_batch(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", model) == 0
    records = read_jsonl(tmp_path / "out.jsonl")
    assert len(records) == len(rows)
    errors = {(r["id"], r.get("line")): r["error"] for r in records if "error" in r}
    assert errors == {
        (None, 2): "line 2: not valid JSON (Expecting property name enclosed in double quotes at column 2); each "
                   "line must be one JSON object such as {\"id\": \"a\", \"prompt\": \"...\"}",
        (None, 3): "line 3: 'id' must be a string or an integer, unique in the file (a rerun skips the ids "
                   "already answered), got None",
        ("no-prompt", None): "line 4 (id 'no-prompt'): give exactly one of 'prompt' (a string) or 'messages' (a "
                             "list of {'role', 'content'}), got neither",
        ("both", None): "line 5 (id 'both'): give exactly one of 'prompt' (a string) or 'messages' (a list of "
                        "{'role', 'content'}), got both",
        ("bad-top-p", None): "line 7 (id 'bad-top-p'): SamplingParams.top_p=1.5 must be in (0, 1]; use 1.0 to "
                             "disable nucleus sampling.",
        ("bad-temp", None): "line 8 (id 'bad-temp'): SamplingParams.temperature='hot' must be a real number, got "
                            "str; use 0 for greedy decoding or a positive value.",
        ("unknown", None): "line 9 (id 'unknown'): unknown field(s) 'best_of'; a line takes id, "
                           "ignore_eos, include_stop_str_in_output, max_completion_tokens, max_tokens, messages, "
                           "min_p, prompt, seed, speculative, stop, stop_token_ids, temperature, top_k, top_p",
        ("bad-role", None): "line 12 (id 'bad-role'): conversation 0 message 0: role='robot' is not one of "
                            "system, user, assistant, tool",
        ("r0", None): "line 13: id 'r0' is already used on line 1; ids must be unique (a rerun skips the ids "
                      "already answered), so this line was not run",
        ("bad-token", None): errors.get(("bad-token", None), "<missing>"),
    }
    assert errors[("bad-token", None)].startswith("line 10 (id 'bad-token'): ") and "999999" in \
        errors[("bad-token", None)]
    ok = {r["id"]: r["text"] for r in records if "text" in r}
    assert ok.keys() == {"r0", "r1", "r2", "chat"}
    assert {k: ok[k] for k in ("r0", "r1", "r2")} == expected_texts(reference, good)
    chat = reference.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4, temperature=0,
                                                                               ignore_eos=True), use_tqdm=False)
    assert ok["chat"] == chat[0].outputs[0].text
    assert json.loads(capsys.readouterr().out)["errors"] == 10


def test_rerun_skips_answered_ids_and_drops_a_partly_written_line(tmp_path, model, capsys):
    rows = greedy_rows(9)
    whole = tmp_path / "whole.jsonl"
    assert run_batch(write_jsonl(tmp_path / "all.jsonl", rows), whole, model) == 0
    out = tmp_path / "out.jsonl"
    assert run_batch(write_jsonl(tmp_path / "first.jsonl", rows[:4]), out, model) == 0
    with open(out, "a") as f:  # the job stopped while writing line 5
        f.write(json.dumps(read_jsonl(whole)[4])[:25])
    capsys.readouterr()
    assert run_batch(tmp_path / "all.jsonl", out, model) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["skipped"], summary["written"]) == (4, 5)
    assert out.read_text() == whole.read_text()
    assert run_batch(tmp_path / "all.jsonl", out, model) == 0  # nothing left: nothing runs, nothing added
    assert json.loads(capsys.readouterr().out)["skipped"] == 9
    assert out.read_text() == whole.read_text()


def test_speculative_records_carry_the_summary_and_the_same_text(tmp_path, model, reference):
    rows = [{"id": i, "prompt": "a b a b a b a b", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            for i in range(3)]
    assert run_batch(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", model,
                     "--set", "speculative.proposer=ngram", "--set", "speculative.num_speculative_tokens=3") == 0
    records = read_jsonl(tmp_path / "out.jsonl")
    want = reference.generate(["a b a b a b a b"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                              use_tqdm=False)[0].outputs[0].text
    assert [r["id"] for r in records] == [0, 1, 2] and all(r["text"] == want for r in records)
    spec = records[0]["speculant"]
    assert spec["spec_steps"] > 0 and spec["draft_tokens"] > 0
    assert len(spec["acceptance_per_position"]) == 3


def test_usage_errors_exit_2(tmp_path, model, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", greedy_rows(1))
    assert main(["batch", str(src), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "pass --config FILE (TOML/YAML) or --model DIR|FILE.gguf" in capsys.readouterr().err
    assert run_batch(src, tmp_path / "o.jsonl", model, "--replicas", "2") == 2
    assert "--replicas only apply with --ray; add --ray or drop them" in capsys.readouterr().err
    assert run_batch(tmp_path / "missing.jsonl", tmp_path / "o.jsonl", model) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_speculative_field_per_line(tmp_path, model, reference):
    """A line's ``speculative`` field is its ``SamplingParams.speculative``:
    off equals the same text with nothing verified, and a setting the engine
    cannot honour is that line's error record, naming the field."""
    line = {"prompt": "a b a b a b a b", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    rows = [{"id": "off", **line, "speculative": {"enabled": False}},
            {"id": "k1", **line, "speculative": {"num_speculative_tokens": 1, "adaptive": False}},
            {"id": "too-many", **line, "speculative": {"num_speculative_tokens": 9}},
            {"id": "typo", **line, "speculative": {"enable": False}}]
    assert run_batch(write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl", model,
                     "--set", "speculative.proposer=ngram", "--set", "speculative.num_speculative_tokens=3") == 0
    records = {r["id"]: r for r in read_jsonl(tmp_path / "out.jsonl")}
    want = reference.generate(["a b a b a b a b"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                              use_tqdm=False)[0].outputs[0].text
    assert records["off"]["text"] == records["k1"]["text"] == want
    assert records["off"]["speculant"]["spec_steps"] == 0 and records["off"]["speculant"]["spec_off_steps"] == 11
    k1 = records["k1"]["speculant"]
    assert k1["spec_steps"] > 0 and k1["draft_tokens"] == k1["spec_steps"]  # one proposal per verify step
    assert len(k1["accepted_length_histogram"]) <= 2
    assert "SamplingParams.speculative.num_speculative_tokens=9 exceeds the engine's " \
           "speculative.num_speculative_tokens=3" in records["too-many"]["error"]
    assert "SamplingParams.speculative has unknown key(s) 'enable'" in records["typo"]["error"]
