"""Stop rules and limits inside accepted runs, under greedy speculation:
EOS, stop token ids and stop strings that fall in the middle of a run truncate
it there; ``max_model_len`` trims k near the end; preemption while
speculating recomputes and still gives the exact tokens.

The self-draft (the target as its own draft) accepts every proposal, so with
k = 4 each decode step emits a run of 5 tokens at output indices 1-5, 6-10, ...
(index 0 comes from the prefill); a stop at an index that does not end a run
is inside an accepted run, and the request's metrics confirm it: more tokens
were emitted than kept.
"""

from __future__ import annotations

import pytest

from greedy_compare import check_all_greedy, check_greedy
from spec_helpers import StepProbe, run, token_ids
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

BLOCK = 4


def spec(draft, scorer="mqa", k=4, proposer="draft_model"):
    options = {"model": str(draft)} if proposer == "draft_model" else {}
    return {"proposer": proposer, "proposer_options": options, "scorer": scorer, "num_speculative_tokens": k}


def emitted(metrics: dict) -> int:
    """Tokens the request's verify steps emitted (accepted + bonus), before stop truncation."""
    return round(metrics["mean_accepted_length"] * metrics["num_steps"])


def mid_run_index(tokens: list[int], k: int, lo: int = 2) -> int:
    """First output index >= lo whose token occurs there for the first time and
    that is not the last token of a self-draft run (runs end at multiples of k + 1)."""
    return next(j for j in range(lo, len(tokens)) if tokens[j] not in tokens[:j] and j % (k + 1) != 0)


PROMPT = random_prompts([10], seed=21)[0]


@pytest.fixture(scope="module")
def ref_tokens(hf_reference):
    return hf_reference("llama").greedy(PROMPT, 16).tokens


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_stop_token_inside_accepted_run(scorer, llama_dir, ref_tokens):
    k = 4
    j = mid_run_index(ref_tokens, k)
    llm = LLM(model=str(llama_dir), block_size=BLOCK, speculative=spec(llama_dir, scorer, k))
    (out,) = run(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[ref_tokens[j]]))
    c = out.outputs[0]
    assert c.token_ids == ref_tokens[: j + 1]
    assert (c.finish_reason, c.stop_reason) == ("stop", ref_tokens[j])
    assert 1 + emitted(out.metrics) > len(c.token_ids), "the stop token did not truncate a run"


def test_eos_inside_accepted_run(eos_case, hf_reference):
    """A real EOS (the model's eos_token_id) in the middle of an accepted run."""
    j = eos_case.eos_index
    k = 4 if j % 5 else 3  # make j not the last index of a run
    model = str(eos_case.model_dir)
    ref = hf_reference(model).greedy(eos_case.prompt, 24, stop_at_eos=True)
    assert ref.tokens == eos_case.tokens[: j + 1]
    results = {}
    for scorer in ("mqa", "batch_expansion"):
        llm = LLM(model=model, block_size=BLOCK, speculative=spec(model, scorer, k))
        (out,) = run(llm, [eos_case.prompt], SamplingParams(temperature=0, max_tokens=24))
        check_greedy(out.outputs[0].token_ids, ref, f"eos/{scorer}")
        assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", None)
        assert 1 + emitted(out.metrics) > j + 1, "EOS did not truncate a run"
        results[scorer] = out.outputs[0].token_ids
    assert results["mqa"] == results["batch_expansion"] == eos_case.tokens[: j + 1]


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_stop_string_inside_accepted_run(scorer, llama_dir, ref_tokens):
    k = 4
    plain = LLM(model=str(llama_dir), block_size=BLOCK)
    tok = plain.tokenizer
    stop = None
    for j in range(2, len(ref_tokens)):
        if j % (k + 1) == 0:
            continue
        prefix = tok.decode(ref_tokens[: j + 1], skip_special_tokens=True)
        before = tok.decode(ref_tokens[:j], skip_special_tokens=True)
        cand = prefix[-2:]
        if len(prefix) - len(before) >= 1 and "\ufffd" not in cand and cand.strip() and \
                prefix.find(cand) == len(prefix) - 2:
            stop = cand
            break
    assert stop is not None, "no usable stop string in the reference output"
    params = SamplingParams(temperature=0, max_tokens=16, stop=[stop])
    (base,) = run(plain, [PROMPT], params)
    llm = LLM(model=str(llama_dir), block_size=BLOCK, speculative=spec(llama_dir, scorer, k))
    (out,) = run(llm, [PROMPT], params)
    c, b = out.outputs[0], base.outputs[0]
    assert c.token_ids == b.token_ids == ref_tokens[: j + 1]
    assert c.text == b.text == prefix[:-2]
    assert (c.finish_reason, c.stop_reason) == (b.finish_reason, b.stop_reason) == ("stop", stop)
    assert 1 + emitted(out.metrics) > j + 1, "the stop string did not truncate a run"


MML_PROMPTS = random_prompts([9, 12], seed=5)
MML = 12 + 8  # max_model_len: room for 11 and 8 output tokens, below max_tokens=16


@pytest.mark.parametrize("proposer,scorer", [("draft_self", "mqa"), ("draft_self", "batch_expansion"),
                                             ("draft_noisy", "mqa"), ("ngram", "batch_expansion")])
def test_k_trimmed_by_max_model_len(proposer, scorer, llama_dir, spec_noisy_draft_dir, hf_reference):
    k = 4
    if proposer == "ngram":
        cfg = spec(None, scorer, k, proposer="ngram")
    else:
        cfg = spec(llama_dir if proposer == "draft_self" else spec_noisy_draft_dir, scorer, k)
    llm = LLM(model=str(llama_dir), block_size=BLOCK, max_model_len=MML, speculative=cfg)
    probe = StepProbe(llm)
    outs = run(llm, MML_PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    hf = hf_reference("llama")
    refs = [hf.greedy(p, MML - len(p)) for p in MML_PROMPTS]
    check_all_greedy(token_ids(outs), refs, f"max_model_len/{proposer}/{scorer}")
    for o, p in zip(outs, MML_PROMPTS):
        assert len(p) + len(o.outputs[0].token_ids) == MML
        assert o.outputs[0].finish_reason == "length"
    probe.check_invariants(k)
    if proposer == "draft_self":
        assert llm.get_metrics()["acceptance_rate"] == 1.0
    ks = [x for s in probe.steps for x in s["k"]]
    assert any(0 < x < k for x in ks), "k was never trimmed near max_model_len"


PREEMPT_PROMPTS = random_prompts([9, 12, 7, 14], seed=8)


@pytest.mark.parametrize("proposer,scorer,chunked", [
    ("draft_self", "mqa", True), ("ngram", "batch_expansion", True), ("draft_noisy", "batch_expansion", False)])
def test_preemption_while_speculating(proposer, scorer, chunked, llama_dir, spec_noisy_draft_dir, hf_reference):
    k = 3
    if proposer == "ngram":
        cfg = spec(None, scorer, k, proposer="ngram")
    else:
        cfg = spec(llama_dir if proposer == "draft_self" else spec_noisy_draft_dir, scorer, k)
    # each request needs up to ceil((14 + 16 + 3) / 4) = 9 blocks; 4 of them cannot share 10
    # (the pool must hold one max_model_len sequence: 36 / 4 = 9 blocks)
    llm = LLM(model=str(llama_dir), block_size=BLOCK, num_blocks=10, max_model_len=36, max_num_batched_tokens=16,
              max_num_seqs=4,
              enable_chunked_prefill=chunked, speculative=cfg)
    probe = StepProbe(llm)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = run(llm, PREEMPT_PROMPTS, params)
    hf = hf_reference("llama")
    check_all_greedy(token_ids(outs), [hf.greedy(p, 16) for p in PREEMPT_PROMPTS], f"preempt/{proposer}/{scorer}")
    assert sum(o.metrics["num_preemptions"] for o in outs) > 0, "nothing was preempted"
    assert any(s["preempted"] for s in probe.steps) and probe.spec_steps > 0
    probe.check_invariants(k, chunked)
    if proposer == "draft_self":  # the draft's own KV cache was rebuilt correctly after each preemption
        assert llm.get_metrics()["acceptance_rate"] == 1.0
