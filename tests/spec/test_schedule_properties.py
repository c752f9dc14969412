"""Randomized schedules (hypothesis): whatever the batch, budget, pool, chunking,
speculation config, arrival order and aborts, every request that survives
produces what it produces alone (tests/spec/schedule_check.py has the checks).

Each example draws:

- an engine: block size 1/2/4/8/16; ``max_num_seqs`` 1..6 and a token budget
  from ``max_num_seqs`` up (configs the checker refuses are never drawn: the
  budget is at least ``max_num_seqs``, and with chunking off at least the
  longest prompt); chunked prefill on/off; ``max_model_len`` just above the
  longest request or cutting some requests short; a KV pool either a few
  blocks above one ``max_model_len`` sequence (so requests preempt) or large;
  speculation off, or ``ngram`` / ``suffix`` (with or without its global
  cache) / ``draft_model`` (a noisy copy of the target,
  ``spec_noisy_draft_dir``) with k 1..4, scorer ``mqa`` / ``batch_expansion``,
  acceptance ``rejection`` (sometimes ``typical``), draft-length policy
  ``fixed`` (sometimes ``adaptive``), sometimes
  ``disable_by_batch_size`` and, for the draft, a confidence threshold;
- 1..6 requests: prompts of 1..80 tokens (random, or periodic so that n-gram
  lookup finds matches; in the shared-prefix variant, a common prefix cut
  anywhere, at block boundaries or inside blocks, plus a tail of its own, so
  prefix caching hits on blocks of finished, running and preempted requests),
  ``max_tokens`` 1..24, greedy or seeded sampling (temperature, top-k, top-p,
  min-p), stop token ids and stop strings taken from what the model often
  emits, EOS on or off (the target's EOS is patched to a token the model often
  emits, so it really stops requests), sometimes
  log-probs, an arrival step and sometimes an abort step; in the structured
  variant, half the requests also carry a grammar (a JSON schema, a regex or a
  Lark grammar: ``STRUCTURED``), mixed with free ones.

The target and the draft are the tiny llama test models (hidden 64). Solo
results are cached per (request, speculation config) across examples.
The default profile is small and derandomized (reproducible in CI); the
``slow`` variants draw more examples (the hybrids ``eagle_suffix`` /
``draft_suffix`` have a slow variant of their own, with the same budget):
``pytest -m slow tests/spec/test_schedule_properties.py``. The suffix, hybrid,
shared-prefix, structured and slow tests count the examples that preempted or
aborted a request (shared-prefix: or hit the prefix cache) and fail when the
drawn schedules include no preemption, no abort or no hit (``check_schedules``).
"""

from __future__ import annotations

import math
import os
import zlib
from collections import Counter
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, seed, settings
from hypothesis import strategies as st

from schedule_check import Req, ScheduleChecker, Setup
from speculant import LLM, SamplingParams
from tiny_models import copy_model, random_prompts, set_eos_token

MAX_PROMPT = 80
MAX_TOKENS = 24
MAX_REQUESTS = 6
# Examples per round of check_schedules (in 20-example rounds over eight seeds, 0-11 suffix and
# 1-11 hybrid examples preempted, 3-15 aborted)
SUFFIX_EXAMPLES = 12
HYBRID_EXAMPLES = 12
SHARED_PREFIX_EXAMPLES = 16
SLOW_EXAMPLES = 300
HYBRIDS = ("eagle_suffix", "draft_suffix")

COMMON = dict(deadline=None, derandomize=True, database=None, print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])


@dataclass(frozen=True)
class Pools:
    """Values worth drawing stop rules from: tokens and text the model emits often."""

    eos_token_id: int
    stop_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]


@pytest.fixture(scope="module")
def schedule_models(tmp_path_factory, llama_dir, spec_noisy_draft_dir, random_heads_dirs):
    """(checker, pools): the target is a copy of the tiny llama whose EOS is a
    token its greedy and sampled text often contains; stop ids and strings are
    drawn from other frequent tokens and text."""
    llm = LLM(model=str(llama_dir), block_size=16, num_blocks=64, max_num_batched_tokens=512, max_num_seqs=16)
    lengths = [1, 3, 7, 12, 20, 33, 50, 80]
    prompts = random_prompts(lengths, seed=2024)
    params = ([SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)] * len(prompts)
              + [SamplingParams(temperature=1.0, seed=i, max_tokens=MAX_TOKENS, ignore_eos=True)
                 for i in range(len(prompts))])
    outs = llm.generate(prompts + prompts, params, use_tqdm=False)
    counts = Counter(t for o in outs for t in o.outputs[0].token_ids)
    frequent = [t for t, _ in counts.most_common(16)]
    texts = Counter()
    for o in outs:
        text = o.outputs[0].text
        texts.update(text[i:i + 2] for i in range(len(text) - 1))
    strings = [llm.tokenizer.decode([t]) for t in frequent[3:9]] + [s for s, _ in texts.most_common(6)]
    strings = tuple(dict.fromkeys(s for s in strings if s and "\ufffd" not in s))
    pools = Pools(eos_token_id=frequent[2], stop_token_ids=tuple(frequent[3:12]) + (2, 200),
                  stop_strings=strings)
    target = set_eos_token(copy_model(llama_dir, tmp_path_factory.mktemp("llama_sched_eos")), pools.eos_token_id)
    return ScheduleChecker(target, spec_noisy_draft_dir, random_heads_dirs["eagle"]), pools


# --- strategies -----------------------------------------------------------------

@st.composite
def prompts(draw, max_len: int = MAX_PROMPT) -> list[int]:
    # short prompts half the time: several requests then fit the pool together and
    # preempt each other as their outputs grow
    n = draw(st.one_of(st.integers(1, 16), st.integers(1, max_len)))
    seed = draw(st.integers(0, 2**16))
    period = draw(st.one_of(st.none(), st.integers(1, 8)))
    base = torch.randint(2, 384, (period or n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return (base * (n // len(base) + 1))[:n]


STRUCTURED = (
    {"json_schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                                      "s": {"type": "string", "maxLength": 6}},
                     "required": ["n", "s"], "additionalProperties": False}},
    {"json_schema": {"type": "array", "items": {"enum": ["x", "yy", "zzz"]}, "maxItems": 5}},
    {"regex": "[a-z]{1,4}(-[0-9]{1,3}){1,4}"},
    {"grammar": 'start: "(" item ("," item)* ")"\nitem: /[a-z]{1,3}/ | "0"'},
)


@st.composite
def sampling_params(draw, pools: Pools, structured: bool = False) -> SamplingParams:
    sampled = draw(st.booleans())
    kw = dict(
        max_tokens=draw(st.one_of(st.integers(1, MAX_TOKENS), st.integers(MAX_TOKENS - 8, MAX_TOKENS))),
        stop_token_ids=draw(st.lists(st.sampled_from(pools.stop_token_ids), max_size=2, unique=True)),
        stop=draw(st.lists(st.sampled_from(pools.stop_strings), max_size=2, unique=True)),
        ignore_eos=draw(st.booleans()),
        include_stop_str_in_output=draw(st.booleans()),
        logprobs=draw(st.sampled_from([None, None, None, None, 0, 2])),
    )
    if structured and draw(st.booleans()):
        kw["structured"] = draw(st.sampled_from(STRUCTURED))
    if not sampled:
        return SamplingParams(temperature=0.0, **kw)
    return SamplingParams(
        temperature=draw(st.sampled_from([0.7, 1.0, 1.5])), top_k=draw(st.sampled_from([0, 0, 1, 5, 40])),
        top_p=draw(st.sampled_from([1.0, 1.0, 0.9, 0.6])), min_p=draw(st.sampled_from([0.0, 0.0, 0.05])),
        seed=draw(st.integers(0, 2**31 - 1)), **kw)


@st.composite
def shared_prefix_prompts(draw, common: list[int]) -> list[int]:
    """``common`` cut at a block multiple (of 1..16), anywhere, or whole, plus a tail of 0..12 own tokens."""
    cut = draw(st.one_of(st.sampled_from([len(common), 16, 32, 48, 8, 4]), st.integers(1, len(common))))
    tail = draw(prompts(max_len=12)) if draw(st.booleans()) else []
    return (common[:cut] + tail)[:MAX_PROMPT] or common[:1]


@st.composite
def requests(draw, pools: Pools, shared_prefix: bool = False, structured: bool = False) -> list[Req]:
    n = draw(st.integers(1, MAX_REQUESTS))
    common = torch.randint(2, 384, (draw(st.integers(24, MAX_PROMPT)),),
                           generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16)))).tolist() \
        if shared_prefix else []
    out = []
    for _ in range(n):
        prompt = draw(shared_prefix_prompts(common)) if shared_prefix else draw(prompts())
        params = draw(sampling_params(pools, structured))
        arrive_at = draw(st.sampled_from([0, 0, 0, 1, 2, 5, 9]))
        abort_after = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, 25)))
        out.append(Req(prompt, params, arrive_at, None if abort_after is None else arrive_at + abort_after))
    return out


@st.composite
def setups(draw, reqs: list[Req], proposers: tuple = (None, "ngram", "suffix", "draft_model", "eagle"),
           trees: bool = False) -> Setup:
    """``trees``: token trees (tree_width 2-3, up to 2-8 nodes, the MQA scorer and rejection sampling)."""
    proposer = draw(st.sampled_from(proposers))
    spec: dict = {}
    if trees:
        spec = dict(proposer=proposer, k=draw(st.integers(1, 4)), tree_width=draw(st.integers(2, 3)),
                    max_tree_tokens=draw(st.sampled_from([2, 4, 8])),
                    disable_by_batch_size=draw(st.one_of(st.none(), st.none(), st.integers(1, 3))),
                    draft_length=draw(st.sampled_from(["fixed", "fixed", "adaptive"])))
        if proposer == "suffix":
            spec["suffix_cache"] = draw(st.booleans())
    elif proposer is not None:
        spec = dict(proposer=proposer, k=draw(st.integers(1, 4)),
                    scorer=draw(st.sampled_from(["mqa", "batch_expansion"])),
                    acceptance=draw(st.sampled_from(["rejection", "rejection", "rejection", "typical"])),
                    disable_by_batch_size=draw(st.one_of(st.none(), st.none(), st.none(), st.integers(1, 3))))
        # 0.01: the random tiny eagle head stops some runs, not all
        if proposer in ("draft_model", "eagle", "eagle_suffix", "draft_suffix"):
            spec["draft_confidence"] = draw(st.sampled_from([0.0, 0.0, 0.01, 0.3]))
        if proposer in ("suffix", "eagle_suffix", "draft_suffix"):
            spec["suffix_cache"] = draw(st.booleans())
        spec["draft_length"] = draw(st.sampled_from(["fixed", "fixed", "fixed", "adaptive"]))
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    longest_prompt = max(len(r.prompt) for r in reqs)
    longest_request = max(len(r.prompt) + r.params.max_tokens for r in reqs)
    if draw(st.booleans()) or longest_request - 1 <= longest_prompt + 1:
        max_model_len = longest_request + draw(st.integers(0, 4))  # no request reaches it
    else:  # some requests stop at max_model_len
        max_model_len = draw(st.integers(longest_prompt + 1, longest_request - 1))
    one_sequence = math.ceil(max_model_len / block_size)
    num_blocks = one_sequence + draw(st.sampled_from([0, 0, 1, 1, 2, 3, 4 * one_sequence]))
    max_num_seqs = draw(st.integers(1, 6))
    budget = max_num_seqs + draw(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 21, 34, 512]))
    chunked = draw(st.booleans())
    if not chunked:
        budget = max(budget, longest_prompt)  # whole prompts only: the longest must fit a step
    return Setup(block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len,
                 max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, enable_chunked_prefill=chunked, **spec)


def run_example(data, schedule_models, shared_prefix: bool = False, structured: bool = False,
                **setup_kw) -> tuple[str | None, bool, bool, bool]:
    """Draw and check one schedule (prompts sharing prefixes with ``shared_prefix``, grammars on
    some requests with ``structured``); (proposer, whether a request was preempted, whether one
    was aborted, whether the prefix cache was hit)."""
    checker, pools = schedule_models
    reqs = data.draw(requests(pools, shared_prefix, structured), label="requests")
    setup = data.draw(setups(reqs, **setup_kw), label="setup")
    trace = checker.check(setup, reqs)
    note(f"steps={trace.num_steps} aborted={sorted(trace.aborted)} preempted={sorted(trace.preempted)} "
         f"trimmed={sorted(trace.trimmed)}")
    event(f"proposer={setup.proposer}")
    event("preempted" if trace.preempted else "no preemption")
    event("aborted" if trace.aborted else "no abort")
    event("prefix cache hit" if trace.prefix_hit_tokens else "no prefix cache hit")
    for reason in sorted(set(checker.events)):
        event(reason)
    return setup.proposer, bool(trace.preempted), bool(trace.aborted), trace.prefix_hit_tokens > 0


ANY = "any proposer"
ROUNDS = 5


def counts(seen: Counter, proposer: str | None) -> dict[str, int]:
    """Examples, and those that preempted / aborted a request / hit the prefix cache, of ``proposer``
    (``ANY``: all)."""
    return {what: sum(n for (w, p), n in seen.items() if w == what and proposer in (ANY, p))
            for what in ("examples", "preempted", "aborted", "prefix cache hit")}


def check_schedules(schedule_models, name: str, max_examples: int, need: tuple, structured: bool = False,
                    shared_prefix: bool = False, **setup_kw) -> None:
    """Rounds of ``max_examples`` examples of ``run_example`` (round r seeded from ``name`` and r,
    so every run draws the same examples) until the drawn schedules include a preemption and
    an abort (with ``shared_prefix``, also a prefix cache hit) for each proposer of ``need``
    (``ANY``: any proposer), at most ``ROUNDS`` rounds;
    then assert that they do. ``event()`` alone would not fail if they stopped happening.
    Hypothesis draws correlated examples, so one round can miss either (one of eight seeds drew
    no preemption in 20 suffix examples); further rounds keep that from failing the test when
    a hypothesis upgrade changes the draws, while a scheduler or strategy that never preempts
    or aborts still fails after ``ROUNDS`` rounds."""
    wanted = ("preempted", "aborted") + (("prefix cache hit",) if shared_prefix else ())
    seen: Counter = Counter()
    for r in range(ROUNDS):
        @seed(zlib.crc32(f"{name}/{r}".encode()))
        @settings(max_examples=max_examples, **COMMON)
        @given(data=st.data())
        def schedules_match_solo_runs(data):
            proposer, preempted, aborted, hit = run_example(data, schedule_models, structured=structured,
                                                            shared_prefix=shared_prefix, **setup_kw)
            seen.update([("examples", proposer)] + [("preempted", proposer)] * preempted
                        + [("aborted", proposer)] * aborted + [("prefix cache hit", proposer)] * hit)

        schedules_match_solo_runs()
        if all(counts(seen, p)[w] for p in need for w in wanted):
            return
    missing = {p: counts(seen, p) for p in need}
    pytest.fail(f"in {ROUNDS} rounds of {max_examples} examples the drawn schedules never did one of "
                f"{wanted}: {missing}")


@settings(max_examples=40, **COMMON)
@given(data=st.data())
def test_schedules_match_solo_runs(data, schedule_models):
    run_example(data, schedule_models)


def test_suffix_schedules_match_solo_runs(schedule_models):
    """The suffix proposer (with and without its global cache, under both
    draft-length policies) gets examples of its own in the default run."""
    check_schedules(schedule_models, "suffix", SUFFIX_EXAMPLES, ("suffix",), proposers=("suffix",))


def test_hybrid_schedules_match_solo_runs(schedule_models):
    """The suffix hybrids (suffix drafts where the match is strong, the EAGLE head
    or the draft model elsewhere) under random schedules."""
    check_schedules(schedule_models, "hybrid", HYBRID_EXAMPLES, (ANY,), proposers=HYBRIDS)


def test_shared_prefix_schedules_match_solo_runs(schedule_models):
    """Prompts sharing prefixes (prefix caching on, as by default): cached
    blocks of finished, running, preempted and aborted requests are reused,
    and every request still equals its solo run without caching; the drawn
    schedules hit the cache, preempt and abort (``check_schedules``)."""
    check_schedules(schedule_models, "shared-prefix", SHARED_PREFIX_EXAMPLES, (ANY,), shared_prefix=True,
                    proposers=(None, "ngram", "suffix", "draft_model", "eagle", "eagle_suffix", "draft_suffix"))


STRUCTURED_EXAMPLES = 12


def test_structured_schedules_match_solo_runs(schedule_models):
    """Requests with grammars (structured output) mixed with free ones: each
    equals its solo run through preemption (the grammar follows the committed
    tokens), aborts and rejected runs, with every proposal verified under its mask."""
    check_schedules(schedule_models, "structured", STRUCTURED_EXAMPLES, (ANY,), structured=True)


@pytest.fixture
def slow_selected(request):
    """The slow variant runs only when asked for: ``-m slow`` or SPECULANT_SLOW=1."""
    expr = request.config.getoption("markexpr") or ""
    if not os.environ.get("SPECULANT_SLOW") and ("slow" not in expr or "not slow" in expr):
        pytest.skip("slow: run with -m slow (or SPECULANT_SLOW=1)")


@pytest.mark.slow
def test_schedules_match_solo_runs_slow(slow_selected, schedule_models):
    check_schedules(schedule_models, "slow", SLOW_EXAMPLES, (ANY,))


@pytest.mark.slow
def test_hybrid_schedules_match_solo_runs_slow(slow_selected, schedule_models):
    """The hybrids with the slow variant's budget; each preempts and aborts somewhere."""
    check_schedules(schedule_models, "hybrid-slow", SLOW_EXAMPLES, HYBRIDS, proposers=HYBRIDS)
