"""Structured output end to end on the tiny llama: every output validates,
greedy output with speculation equals greedy output without it under the same
grammar (every proposer × scorer), and the grammar state survives rejected
runs, preemption, aborts and a broken matcher in another request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from grammar_cases import LARK, LARK_AS_REGEX, REGEX, SCHEMAS, check_json, check_regex, run
from json_prefix import check_json_prefix
from speculant import LLM, SamplingParams
from speculant.acceptance.rejection import RejectionSampler
from speculant.config.matrix import builtin_registry, compute_matrix
from speculant.interfaces import AcceptanceCapabilities
from speculant.plugins.manager import load_plugins, reset_plugins
from speculant.proposers.heads.common import save_heads
from speculant.proposers.heads.medusa import MedusaHeads, medusa_config
from tiny_eagle import save_random_eagle
from tiny_models import random_prompts

PROMPTS = random_prompts([5, 11, 17, 8, 23, 13], seed=41)
MAX_TOKENS = 64


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def params(schema: str, i: int = 0, **kw) -> SamplingParams:
    base = dict(temperature=0.0, max_tokens=MAX_TOKENS, structured={"json_schema": SCHEMAS[schema]})
    base.update(kw)
    return SamplingParams(**base)


def engine(llama_dir, speculative=None, **kw) -> LLM:
    args = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=160)
    args.update(kw)
    if speculative is not None:
        args["speculative"] = speculative
    return LLM(model=str(llama_dir), **args)


def test_every_schema_output_validates(llama_dir):
    """24 requests, 4 schemas, greedy and seeded sampling, n-gram speculation."""
    llm = engine(llama_dir, {"proposer": "ngram", "num_speculative_tokens": 3})
    cases = [(name, PROMPTS[i % len(PROMPTS)], i) for i, name in enumerate(list(SCHEMAS) * 6)]
    ps = [params(name, temperature=0.0 if i % 2 else 1.0, seed=i) for name, _, i in cases]
    outs = run(llm, [p for _, p, _ in cases], ps)
    for (name, _, _), o in zip(cases, outs):
        c = o.outputs[0]
        assert c.finish_reason == "stop", (name, c.text, c.finish_reason)
        check_json(c.text, SCHEMAS[name])
    m = llm.get_metrics()
    assert m["structured_grammars_compiled"] == len(SCHEMAS) and m["structured_grammar_cache_hits"] == 20
    assert m["num_draft_tokens"] > 0 and m["structured_mask_rows"] > 0
    # without the grammar the same model writes no JSON: the mask made these valid
    free = run(llm, [p for _, p, _ in cases[:4]], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    assert not any(o.outputs[0].text.startswith(("{", "[")) for o in free)


def test_regex_lark_and_json_object(llama_dir, tokenizer_dir):
    llm = engine(llama_dir, {"proposer": "ngram", "num_speculative_tokens": 3})
    regex = [SamplingParams(temperature=t, seed=3, max_tokens=40, structured={"regex": REGEX}) for t in (0.0, 1.0)]
    lark = [SamplingParams(temperature=t, seed=5, max_tokens=40, structured={"grammar": LARK}) for t in (0.0, 1.0)]
    outs = run(llm, PROMPTS[:2] * 2, regex + lark)
    for o, pattern in zip(outs, [REGEX, REGEX, LARK_AS_REGEX, LARK_AS_REGEX]):
        assert o.outputs[0].finish_reason == "stop"
        check_regex(o.outputs[0].text, pattern)
    obj = run(llm, PROMPTS[:3], SamplingParams(temperature=0.0, max_tokens=48, structured={"json_object": True}))
    matcher = llm.engine.structured.compiler.matcher(SamplingParams(structured={"json_object": True}).constraint)
    for o in obj:
        c = o.outputs[0]
        assert c.text.startswith("{")
        # a finished object parses; one cut by max_tokens is still a prefix the grammar accepts (the engine's
        # matcher) and the start of an object (closed by hand, parsed and validated without it)
        assert matcher.validate_tokens(c.token_ids) == len(c.token_ids)
        if c.finish_reason == "stop":
            check_json(c.text, {"type": "object"})
        else:
            assert (c.finish_reason, len(c.token_ids)) == ("length", 48)
            check_json_prefix(c.text, {"type": "object"})
    assert {o.outputs[0].finish_reason for o in obj} == {"stop", "length"}  # both kinds were checked


def test_a_complete_grammar_stops_the_request_even_with_ignore_eos(llama_dir):
    llm = engine(llama_dir)
    eos = llm.engine.runner.eos_token_ids
    o = run(llm, PROMPTS[:1], params("list", ignore_eos=True))[0].outputs[0]
    assert (o.finish_reason, o.stop_reason) == ("stop", None) and o.token_ids[-1] in eos
    check_json(o.text, SCHEMAS["list"])


def _cells():
    reset_plugins()
    cells = compute_matrix(builtin_registry(load_plugins().registry))
    reset_plugins()
    out = []
    for c in cells:
        if not c.structured_output:
            continue
        default = c.acceptance == "rejection" and c.enable_chunked_prefill
        out.append(pytest.param(c, id=f"{c.proposer}-{c.scorer}-{c.acceptance}-chunked_"
                                      f"{'on' if c.enable_chunked_prefill else 'off'}",
                                marks=() if default else pytest.mark.slow))
    return out


@pytest.fixture(scope="module")
def quote_heads_dirs(tmp_path_factory, llama_dir) -> dict[str, Path]:
    """An EAGLE head whose draft vocabulary is the quote token alone and Medusa
    heads whose every logit but the quote's is about 0 (blocks adding a
    constant, LM heads reading only that constant): both always propose '"',
    the token these schemas' outputs hold most, so the target accepts some
    proposals and rows past the first decide tokens under their masks (random
    heads' proposals were never accepted under the grammar)."""
    (quote,) = AutoTokenizer.from_pretrained(llama_dir)('"', add_special_tokens=False)["input_ids"]
    root = tmp_path_factory.mktemp("quote_heads")
    eagle = save_random_eagle(llama_dir, root / "eagle", draft_vocab_size=1)
    weights = load_file(eagle / "model.safetensors")
    weights["draft_ids"] = torch.tensor([quote])
    save_file(weights, eagle / "model.safetensors")
    cfg = medusa_config(64, 384, 4)
    medusa = MedusaHeads.from_config(cfg)
    with torch.no_grad():
        for head in medusa.heads:
            head.blocks[0].linear.weight.zero_()
            head.blocks[0].linear.bias.fill_(10.0)  # silu(10) ~ 10 added to every hidden entry
            head.lm_head.weight.zero_()
            head.lm_head.weight[quote].fill_(1.0)  # the quote's logit ~ 640 + sum(hidden), every other 0
    save_heads(medusa, cfg, root / "medusa")
    return {"eagle": eagle, "medusa": root / "medusa"}


@pytest.fixture(scope="module")
def proposer_options(spec_noisy_draft_dir, random_heads_dirs, quote_heads_dirs) -> dict[str, dict]:
    draft = str(spec_noisy_draft_dir)  # agrees only partly: runs get rejected and the grammar rolls back
    return {"ngram": {}, "suffix": {}, "draft_model": {"model": draft},
            "medusa": {"path": str(quote_heads_dirs["medusa"])},
            "mlp_speculator": {"path": str(random_heads_dirs["mlp_speculator"])},
            "eagle": {"path": str(quote_heads_dirs["eagle"])},
            "eagle_suffix": {"eagle": {"path": str(quote_heads_dirs["eagle"])}, "min_match_len": 1},
            "draft_suffix": {"draft": {"model": draft}, "min_match_len": 1}}


MATRIX_SCHEMAS = ["person", "nested", "list"]


@pytest.fixture(scope="module")
def no_spec_reference(llama_dir) -> dict[bool, list[list[int]]]:
    out = {}
    for chunked in (False, True):
        llm = engine(llama_dir, max_num_batched_tokens=32 if chunked else 128, enable_chunked_prefill=chunked)
        out[chunked] = [o.outputs[0].token_ids for o in run(llm, PROMPTS[:3], [params(s) for s in MATRIX_SCHEMAS])]
    return out


@pytest.mark.parametrize("cell", _cells())
def test_greedy_with_speculation_equals_without_under_a_grammar(cell, llama_dir, proposer_options,
                                                               no_spec_reference):
    llm = engine(llama_dir, cell.speculative(proposer_options[cell.proposer]),
                 max_num_batched_tokens=32 if cell.enable_chunked_prefill else 128,
                 enable_chunked_prefill=cell.enable_chunked_prefill)
    outs = run(llm, PROMPTS[:3], [params(s) for s in MATRIX_SCHEMAS])
    assert [o.outputs[0].token_ids for o in outs] == no_spec_reference[cell.enable_chunked_prefill]
    for o, s in zip(outs, MATRIX_SCHEMAS):
        assert o.outputs[0].finish_reason == "stop", (s, o.outputs[0].text)
        check_json(o.outputs[0].text, SCHEMAS[s])
    m = llm.get_metrics()
    assert m["num_draft_tokens"] > 0
    # proposals verified and accepted under the grammar: rows past the first were scored under their masks
    assert m["num_accepted_tokens"] > 0, m


def test_forbidden_proposals_are_cut_before_verification(llama_dir):
    """n-gram proposals copy the prompt, which the schema forbids: they are cut
    (fewer tokens verified), and the output is the one without speculation."""
    prompt = list(PROMPTS[0]) * 3
    ref = run(engine(llama_dir), [prompt], params("person"))[0].outputs[0].token_ids
    llm = engine(llama_dir, {"proposer": "ngram", "num_speculative_tokens": 4,
                             "proposer_options": {"min_n": 1, "max_n": 2}})
    assert run(llm, [prompt], params("person"))[0].outputs[0].token_ids == ref
    assert llm.get_metrics()["structured_cut_tokens"] > 0


def test_structured_and_free_requests_together_equal_their_solo_runs(llama_dir):
    schemas = ["person", None, "nested", None, "either", None]  # None: a free request
    mixed = [params("person"), SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
             params("nested", temperature=1.0, seed=7), SamplingParams(temperature=1.0, seed=9, max_tokens=24),
             params("either"), SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)]
    spec = {"proposer": "ngram", "num_speculative_tokens": 3}
    alone = [run(engine(llama_dir, spec), [p], sp)[0].outputs[0].token_ids for p, sp in zip(PROMPTS, mixed)]
    together = run(engine(llama_dir, spec), PROMPTS, mixed)
    assert [o.outputs[0].token_ids for o in together] == alone
    for o, name in zip(together, schemas):  # each structured one closes and validates
        if name is not None:
            assert o.outputs[0].finish_reason == "stop", (name, o.outputs[0].text, o.outputs[0].finish_reason)
            check_json(o.outputs[0].text, SCHEMAS[name])


def test_grammar_state_survives_preemption_and_aborts(llama_dir):
    spec = {"proposer": "ngram", "num_speculative_tokens": 3}
    names = list(SCHEMAS) * 2
    ps = [params(name, temperature=1.0 if i % 2 else 0.0, seed=i) for i, name in enumerate(names)]
    prompts = (PROMPTS * 2)[:len(ps)]
    roomy = [o.outputs[0].token_ids for o in run(engine(llama_dir, spec, block_size=4, max_model_len=96),
                                                 prompts, ps)]
    tight = engine(llama_dir, spec, block_size=4, max_model_len=96, num_blocks=30)
    outs = run(tight, prompts, ps)
    assert sum(o.metrics["num_preemptions"] for o in outs) >= 2, "the small pool was meant to preempt"
    assert [o.outputs[0].token_ids for o in outs] == roomy
    for o, name in zip(outs, names):  # each closes and validates through its preemptions
        assert o.outputs[0].finish_reason == "stop", (name, o.outputs[0].text, o.outputs[0].finish_reason)
        check_json(o.outputs[0].text, SCHEMAS[name])

    eng = tight.engine
    ids = [eng.add_request(None, p, sp) for p, sp in zip(prompts, ps)]
    done = {}
    for _ in range(3):
        done.update({o.request_id: o for o in eng.step() if o.finished})
    aborted = {rid for rid in ids[::2] if eng.abort_request(rid)}  # mid-output: grammar states dropped
    assert len(aborted) >= 2
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    for i, rid in enumerate(ids):
        if rid in aborted:  # an abort is reported by the step that ran it, if any
            assert rid not in done or done[rid].outputs[0].finish_reason == "abort"
        else:
            assert done[rid].outputs[0].token_ids == roomy[i]
            assert done[rid].outputs[0].finish_reason == "stop"
            check_json(done[rid].outputs[0].text, SCHEMAS[names[i]])
    assert eng.blocks.num_used_blocks == 0


class _FailingMasks:
    """llguidance's matcher whose mask call raises."""

    def __init__(self, real) -> None:
        self.real = real

    def unsafe_compute_mask_ptr(self, *args):
        raise RuntimeError("mask call failed")

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("fault, message", [
    ("mask_call", "its json_schema grammar failed while computing its token masks: mask call failed"),
    ("error_state", "its json_schema grammar failed while following its "),
])
def test_a_broken_grammar_fails_its_request_alone(llama_dir, fault, message):
    spec = {"proposer": "ngram", "num_speculative_tokens": 3}
    ps = [params("person"), params("nested"), SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)]
    alone = [run(engine(llama_dir, spec), [p], sp)[0].outputs[0].token_ids for p, sp in zip(PROMPTS, ps)]
    llm = engine(llama_dir, spec)
    eng = llm.engine
    ids = [eng.add_request(None, p, sp) for p, sp in zip(PROMPTS, ps)]
    done = {}
    for _ in range(2):
        done.update({o.request_id: o for o in eng.step() if o.finished})
    victim = eng._requests[ids[0]].grammar
    if fault == "mask_call":
        victim.matcher = _FailingMasks(victim.matcher)
    else:  # the matcher enters its error state (a token no JSON allows)
        victim.matcher.consume_tokens(eng.tokenizer("}}}", add_special_tokens=False)["input_ids"])
        assert victim.matcher.is_error()
    while eng.has_unfinished_requests():
        done.update({o.request_id: o for o in eng.step() if o.finished})
    bad = done[ids[0]]
    assert bad.outputs[0].finish_reason == "error"
    assert bad.error.startswith(f"request {ids[0]!r} failed: {message}"), bad.error
    assert [done[i].outputs[0].token_ids for i in ids[1:]] == alone[1:]
    assert llm.get_metrics()["failed_requests"] == 1 and llm.get_metrics()["fallback_steps"] == 0
    assert eng.blocks.num_used_blocks == 0
    # the engine keeps serving structured requests
    check_json(run(llm, PROMPTS[:1], params("person"))[0].outputs[0].text, SCHEMAS["person"])


def test_bad_requests_are_refused_at_add_request(llama_dir):
    llm = engine(llama_dir, {"proposer": "ngram", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="structured output regex cannot be compiled: .*unclosed group"):
        llm.engine.add_request(None, PROMPTS[0], SamplingParams(structured={"regex": "(a"}))

    class NoGrammar(RejectionSampler):
        name = "no_grammar"
        capabilities = AcceptanceCapabilities(supports_structured_output=False)

    llm.engine.spec.acceptance = NoGrammar()
    with pytest.raises(ValueError, match="structured output is not supported by this speculative configuration: "
                                         "acceptance 'no_grammar' does not declare"):
        llm.engine.add_request(None, PROMPTS[0], params("person"))
    out = run(llm, PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length"  # unstructured requests still run


def test_a_failing_mask_worker_fails_only_the_structured_requests(llama_dir, monkeypatch):
    from speculant.engine.grammar import StructuredOutputs

    spec = {"proposer": "ngram", "num_speculative_tokens": 3}
    free = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = run(engine(llama_dir, spec), PROMPTS[1:2], free)[0].outputs[0].token_ids
    llm = engine(llama_dir, spec)

    def broken(self, jobs):
        raise RuntimeError("worker exploded")

    monkeypatch.setattr(StructuredOutputs, "_compute", broken)
    bad, ok = run(llm, PROMPTS[:2], [params("person"), free])
    assert bad.outputs[0].finish_reason == "error" and "its grammar masks could not be computed: " \
        "RuntimeError: worker exploded" in bad.error
    assert ok.outputs[0].token_ids == alone and llm.get_metrics()["fallback_steps"] == 0
