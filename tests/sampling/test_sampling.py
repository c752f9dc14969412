"""Sampling end to end on a tiny Llama: seeded reproducibility whatever the
batch, log-probabilities against HF's logits, and the stop rules (stop strings,
stop token ids, max_tokens, max_model_len, EOS / ignore_eos).

Log-probability tolerance 1e-4: the engine's fp32 logits differ from HF's by
~3e-5 at most on these models (oneDNN-packed linears, paged attention
summation order; see ``greedy_compare``), and a wrong position, temperature or
filter moves log-probabilities by far more.
"""

from __future__ import annotations

import math

import pytest
import torch

from speculant import LLM, SamplingParams
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

LOGPROB_ATOL = 1e-4
PROMPT = random_prompts([9], seed=21)[0]
OTHERS = random_prompts([20, 3, 14, 6], seed=22)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=8)


@pytest.fixture(scope="module")
def llm_other_layout(llama_dir):
    """Same model, different block size, budget and chunking: different batches."""
    return LLM(str(llama_dir), block_size=16, max_num_batched_tokens=64, max_num_seqs=4,
               enable_chunked_prefill=False)


def _tokens(out) -> list[int]:
    return out.outputs[0].token_ids


def _gen(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


SAMPLED = {
    "temperature": SamplingParams(temperature=0.9, seed=11, max_tokens=16, ignore_eos=True),
    "top_k": SamplingParams(temperature=1.0, top_k=20, seed=12, max_tokens=16, ignore_eos=True),
    "top_p": SamplingParams(temperature=1.0, top_p=0.8, seed=13, max_tokens=16, ignore_eos=True),
    "min_p": SamplingParams(temperature=1.3, min_p=0.05, seed=14, max_tokens=16, ignore_eos=True),
    "all_filters": SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02, seed=15, max_tokens=16,
                                  ignore_eos=True),
}


# --- seeds -------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SAMPLED))
def test_seeded_sampling_ignores_batch_composition(name, llm, llm_other_layout):
    params = SAMPLED[name]
    alone = _tokens(_gen(llm, [PROMPT], params)[0])
    assert len(alone) == 16
    assert _tokens(_gen(llm, [PROMPT], params)[0]) == alone, "same seed, same engine, different tokens"
    neighbours = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True),  # unseeded
        SamplingParams(temperature=0.5, top_k=5, seed=999, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=params.temperature, seed=params.seed + 1, max_tokens=16, ignore_eos=True),
    ]
    prompts = OTHERS[:2] + [PROMPT] + OTHERS[2:]
    batch = _gen(llm, prompts, neighbours[:2] + [params] + neighbours[2:])
    assert _tokens(batch[2]) == alone, "a seeded request's tokens changed when other requests joined its batch"
    assert _tokens(_gen(llm_other_layout, [PROMPT] + OTHERS, [params] + neighbours)[0]) == alone, \
        "a seeded request's tokens changed with the block size / chunking layout"


def test_different_seeds_give_different_tokens(llm):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=16, ignore_eos=True) for s in range(4)]
    outs = [tuple(_tokens(o)) for o in _gen(llm, [PROMPT] * 4, params)]
    assert len(set(outs)) == 4, outs


def test_unseeded_identical_requests_differ(llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    a, b = _gen(llm, [PROMPT, PROMPT], params)
    assert _tokens(a) != _tokens(b)


def test_unseeded_requests_follow_the_engine_seed(llama_dir):
    """Requests without a seed draw one from model.seed: two fresh engines with
    the same seed reproduce each other; another engine seed changes the draws."""
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)

    def run(seed):
        engine = LLM(str(llama_dir), seed=seed, block_size=16, max_num_batched_tokens=64, max_num_seqs=4)
        return [_tokens(o) for o in _gen(engine, [PROMPT, PROMPT], params)]

    first = run(5)
    assert run(5) == first
    assert run(6) != first


def test_top_k_beyond_the_vocabulary_filters_nothing(llm):
    unfiltered = SamplingParams(temperature=1.0, seed=9, max_tokens=12, ignore_eos=True)
    huge_k = SamplingParams(temperature=1.0, top_k=10_000, seed=9, max_tokens=12, ignore_eos=True)
    assert _tokens(_gen(llm, [PROMPT], huge_k)[0]) == _tokens(_gen(llm, [PROMPT], unfiltered)[0])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.5, top_k=1, seed=3, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=1.5, min_p=1.0, seed=3, max_tokens=16, ignore_eos=True),
], ids=["top_k=1", "min_p=1"])
def test_filters_that_keep_only_the_argmax_equal_greedy(params, llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert _tokens(_gen(llm, [PROMPT], params)[0]) == _tokens(_gen(llm, [PROMPT], greedy)[0])


def test_seeded_sampling_survives_preemption(llama_dir, llm):
    """Preemption recomputes a request; its seeded draws must not change."""
    prompts = random_prompts([9, 14, 21, 26, 30, 12], seed=23)
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=100 + i, max_tokens=24, ignore_eos=True)
              for i in range(len(prompts))]
    small = LLM(str(llama_dir), block_size=4, num_blocks=16, max_model_len=64, max_num_batched_tokens=16,
                max_num_seqs=6)
    outs = _gen(small, prompts, params)
    assert sum(o.metrics["num_preemptions"] for o in outs) > 0, "the pool was meant to force preemption"
    for prompt, p, out in zip(prompts, params, outs):
        assert _tokens(out) == _tokens(_gen(llm, [prompt], p)[0])


# --- logprobs ----------------------------------------------------------------

def _reference_logprobs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """log_softmax of the distribution a request samples from: logits / T, then
    top-k, then top-p (smallest set whose mass reaches top_p), then min-p
    (tokens with prob >= min_p * max prob); greedy reports the plain softmax."""
    if p.temperature == 0:
        return logits.double().log_softmax(-1)
    scaled = logits.double() / p.temperature
    keep = torch.ones_like(scaled, dtype=torch.bool)
    if p.top_k > 0:
        keep &= scaled >= scaled.topk(p.top_k).values[-1]
    if p.top_p < 1:
        probs = scaled.masked_fill(~keep, -math.inf).softmax(-1)
        sorted_probs, order = probs.sort(descending=True)
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        keep_sorted = mass_before < p.top_p
        keep &= torch.zeros_like(keep).scatter(0, order, keep_sorted)
    if p.min_p > 0:
        probs = scaled.masked_fill(~keep, -math.inf).softmax(-1)
        keep &= probs >= p.min_p * probs.max()
    return scaled.masked_fill(~keep, -math.inf).log_softmax(-1)


def _check_logprobs(out, prompt, params, hf, num: int):
    tokens = _tokens(out)
    entries = out.outputs[0].logprobs
    assert entries is not None and len(entries) == len(tokens)
    hf_logits = hf.logits_along(prompt, tokens)  # [N, V]
    for j, (tok, entry) in enumerate(zip(tokens, entries)):
        ref = _reference_logprobs(hf_logits[j], params)
        where = f"output token {j} ({tok})"
        assert tok in entry, f"{where}: chosen token missing from its logprobs entry"
        assert math.isfinite(entry[tok]), f"{where} was sampled from outside the filtered support"
        assert abs(entry[tok] - float(ref[tok])) <= LOGPROB_ATOL, \
            f"{where}: chosen log-prob {entry[tok]} vs HF {float(ref[tok])}"
        # top-N over the tokens the filters kept (filtered tokens are no alternatives)
        num_kept = min(num, int(torch.isfinite(ref).sum()))
        assert len(entry) in (num_kept, num_kept + 1), f"{where}: {len(entry)} entries for logprobs={num}"
        outside_top = len(entry) == num_kept + 1  # the chosen token is added when not among the top-N
        top = sorted((v for k, v in entry.items() if not (outside_top and k == tok)), reverse=True)
        ref_top = ref.topk(num_kept).values.tolist()
        assert len(top) == num_kept
        for got, want in zip(top, ref_top):
            assert got == want or abs(got - want) <= LOGPROB_ATOL, f"{where}: top-{num} {top} vs HF {ref_top}"
        for k, v in entry.items():
            assert v == float(ref[k]) or abs(v - float(ref[k])) <= LOGPROB_ATOL, \
                f"{where}: log-prob of token {k}: {v} vs HF {float(ref[k])}"


LOGPROB_PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=5),
    "temperature": SamplingParams(temperature=0.7, seed=5, max_tokens=12, ignore_eos=True, logprobs=5),
    "top_k": SamplingParams(temperature=1.3, top_k=3, seed=6, max_tokens=12, ignore_eos=True, logprobs=5),
    "top_p": SamplingParams(temperature=1.2, top_p=0.85, seed=7, max_tokens=12, ignore_eos=True, logprobs=5),
    "min_p": SamplingParams(temperature=1.0, min_p=0.1, seed=8, max_tokens=12, ignore_eos=True, logprobs=5),
}


@pytest.mark.parametrize("name", list(LOGPROB_PARAMS))
def test_logprobs_equal_log_softmax_of_hf_logits(name, llm, hf_reference):
    """The chosen token's log-prob and the top-N equal log_softmax of HF's logits
    at the same position, of the distribution actually sampled from (after
    temperature and filters). Prompts are chunked (budget 8) across steps."""
    params = LOGPROB_PARAMS[name]
    prompts = [PROMPT] + OTHERS[:2]
    outs = _gen(llm, prompts, params)
    for prompt, out in zip(prompts, outs):
        _check_logprobs(out, prompt, params, hf_reference("llama"), num=5)


def test_logprobs_zero_and_none(llm):
    zero = _gen(llm, [PROMPT], SamplingParams(temperature=0.8, seed=1, max_tokens=6, logprobs=0))[0].outputs[0]
    assert [list(e) for e in zero.logprobs] == [[t] for t in zero.token_ids]
    none = _gen(llm, [PROMPT], SamplingParams(temperature=0.8, seed=1, max_tokens=6))[0].outputs[0]
    assert none.logprobs is None
    assert none.token_ids == zero.token_ids


# --- stop rules ----------------------------------------------------------------

GREEDY24 = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _stop_candidate(llm, prompts, spanning: bool):
    """A 2-letter substring of some prompt's greedy text (first occurrence at
    index >= 2), either inside one token or straddling two tokens."""
    for prompt in prompts:
        out = _gen(llm, [prompt], GREEDY24)[0].outputs[0]
        text, tokens = out.text, out.token_ids
        # where each token's text ends, by incremental decoding like the engine
        ends = [len(llm.tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)) for i in range(len(tokens))]
        for idx in range(2, len(text) - 1):
            cand = text[idx: idx + 2]
            if not cand.isascii() or not cand.isalpha() or text.find(cand) != idx:
                continue
            if (idx + 1 in ends) == spanning:
                return prompt, out, cand, idx
    pytest.fail("no prompt produced a usable stop string; change the prompts")


@pytest.mark.parametrize("spanning", [False, True], ids=["inside-token", "across-tokens"])
@pytest.mark.parametrize("include", [False, True], ids=["excluded", "included"])
def test_stop_string_truncates(spanning, include, llm):
    prompts = random_prompts([5, 8, 11, 13, 17, 19], seed=24)
    prompt, full, stop, idx = _stop_candidate(llm, prompts, spanning)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=["@@never@@", stop],
                            include_stop_str_in_output=include)
    out = _gen(llm, [prompt], params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[: idx + (len(stop) if include else 0)]
    # generation stopped at the token that completed the stop string
    n = len(out.token_ids)
    assert out.token_ids == full.token_ids[:n]
    decode = lambda ids: llm.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    assert stop in decode(out.token_ids) and stop not in decode(out.token_ids[:-1])


def test_stop_string_never_produced_runs_to_length(llm):
    out = _gen(llm, [PROMPT], SamplingParams(temperature=0.0, max_tokens=10, stop=["@@never@@"]))[0].outputs[0]
    assert out.finish_reason == "length" and out.stop_reason is None and len(out.token_ids) == 10


def test_stop_token_ids(llm):
    full = _tokens(_gen(llm, [PROMPT], GREEDY24)[0])
    i = next(i for i in range(3, len(full)) if full[i] not in full[:i])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[full[i], 383])
    out = _gen(llm, [PROMPT], params)[0].outputs[0]
    assert out.token_ids == full[: i + 1]
    assert out.finish_reason == "stop" and out.stop_reason == full[i]


def test_max_tokens_gives_length(llm):
    full = _tokens(_gen(llm, [PROMPT], GREEDY24)[0])
    out = _gen(llm, [PROMPT], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    assert out.token_ids == full[:5]
    assert out.finish_reason == "length" and out.stop_reason is None


def test_max_model_len_gives_length(llm):
    prompt = random_prompts([250], seed=25)[0]  # max_model_len is 256
    out = _gen(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_eos_stops_unless_ignore_eos(eos_case):
    llm = LLM(str(eos_case.model_dir), block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    idx, eos = eos_case.eos_index, eos_case.eos_token_id
    stopped = _gen(llm, [eos_case.prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0]
    assert stopped.token_ids == eos_case.tokens[: idx + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason is None
    ignored = _gen(llm, [eos_case.prompt], GREEDY24)[0].outputs[0]
    assert len(ignored.token_ids) == 24 and ignored.finish_reason == "length"
    assert ignored.token_ids[: idx + 1] == stopped.token_ids and ignored.token_ids[idx] == eos
