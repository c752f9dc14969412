"""Structured output's parts alone: SamplingParams.structured's checks, the
compiler's errors and cache, a request's grammar state under sync and
rollback, the bitmask unpacking and the compatibility rule."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from speculant import SamplingParams
from speculant.acceptance.rejection import RejectionSampler
from speculant.acceptance.typical import TypicalAcceptance
from speculant.config.compat import structured_reasons
from speculant.config.structured import StructuredOutput
from speculant.engine.grammar import GrammarCompiler, GrammarError, GrammarFault, RequestGrammar, unpack_bitmask
from speculant.interfaces import AcceptanceCapabilities

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def compiler(tok):
    return GrammarCompiler(tok, len(tok), frozenset({tok.eos_token_id}))


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("value, error, message", [
    ("json", TypeError, "SamplingParams.structured='json' must be a dict, got str"),
    ({}, ValueError, "has 0 keys []; it takes exactly one of ['json_schema', 'json_object', 'regex', 'grammar']"),
    ({"regex": "a", "grammar": "b"}, ValueError, "has 2 keys ['regex', 'grammar']"),
    ({"json": {}}, ValueError, "has unknown key(s) ['json']"),
    ({"json_object": 1}, ValueError, "{'json_object': 1} must be True"),
    ({"regex": ""}, ValueError, "{'regex': ''} must be a non-empty str"),
    ({"grammar": 3}, ValueError, "{'grammar': 3} must be a non-empty str; pass the Lark grammar as text"),
    ({"json_schema": "{not json"}, ValueError, "['json_schema'] is not valid JSON (Expecting property name"),
    ({"json_schema": True}, ValueError, "['json_schema']=True is a boolean schema"),
    ({"json_schema": [1]}, TypeError, "['json_schema'] must be a JSON object (a dict), got list"),
    ({"json_schema": {"maximum": float("nan")}}, ValueError, "cannot be written as JSON"),
])
def test_structured_param_errors_name_the_problem(value, error, message):
    with pytest.raises(error) as err:
        SamplingParams(structured=value)
    assert message in str(err.value)


def test_structured_param_forms():
    assert SamplingParams().constraint is None
    s = SamplingParams(structured={"json_schema": SCHEMA}).constraint
    assert s is not None and s.kind == "json_schema" and s.as_dict() == {"json_schema": SCHEMA}
    # JSON text and a dict give the same key (property order kept: it is the generation order)
    text = '{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},' \
           ' "required": ["a", "b"], "additionalProperties": false}'
    assert SamplingParams(structured={"json_schema": text}).constraint == s
    assert SamplingParams(structured={"json_object": True}).constraint == StructuredOutput("json_object", "")
    assert SamplingParams(structured={"regex": "[0-9]+"}).constraint == StructuredOutput("regex", "[0-9]+")


@pytest.mark.parametrize("structured, message", [
    ({"regex": "a(b"}, "structured output regex cannot be compiled: "),
    ({"regex": "a(b"}, "unclosed group"),
    ({"json_schema": {"type": "foo"}}, "structured output json_schema cannot be compiled: Invalid type: foo; "
                                       "fix the JSON schema"),
    ({"grammar": "start: 'a' | "}, "structured output grammar cannot be compiled: "),
    ({"grammar": "start: missing_rule"}, "fix the Lark grammar"),
])
def test_uncompilable_grammars_are_errors_naming_the_problem(compiler, structured, message):
    with pytest.raises(GrammarError) as err:
        compiler.matcher(SamplingParams(structured=structured).constraint)
    assert message in str(err.value)
    assert isinstance(err.value, ValueError)  # a 400 / a ValueError from add_request


def test_compiled_grammars_are_cached_least_recently_used_out(tok):
    c = GrammarCompiler(tok, len(tok), frozenset({0}), cache_size=2)
    a, b, d = (StructuredOutput("regex", r) for r in ("a+", "b+", "d+"))
    ga = c.compile(a)
    assert c.compile(a) is ga and (c.num_compiled, c.num_cache_hits) == (1, 1)
    c.compile(b)
    c.compile(a)  # a is now the most recent: b goes first
    c.compile(d)
    assert (c.num_compiled, c.num_cache_hits) == (3, 2)
    c.compile(a)
    assert c.num_cache_hits == 3
    c.compile(b)
    assert c.num_compiled == 4  # b had been evicted
    assert c.tokenizer is c.tokenizer  # built once


def test_request_grammar_follows_committed_tokens_and_rolls_back(compiler, tok):
    spec = SamplingParams(structured={"json_schema": SCHEMA}).constraint
    text = ids(tok, '{"a": 12, "b": "y"}')
    g = RequestGrammar(spec, compiler.matcher(spec))
    fresh = compiler.matcher(spec)
    g.sync(text[:5])
    assert g.tokens == text[:5] and g.valid_prefix(text[5:]) == len(text) - 5
    # a shorter or diverging committed history rolls the matcher back (as a rebuilt one would be)
    g.sync(text[:2])
    assert g.tokens == text[:2] and g.valid_prefix(text[2:]) == len(text) - 2
    other = ids(tok, '{"a": 7')
    g.sync(other)
    assert g.tokens == other and g.valid_prefix(ids(tok, ', "b": "x"}')) == len(ids(tok, ', "b": "x"}'))
    assert fresh.validate_tokens(other) == len(other)
    g.sync(text)
    assert g.matcher.is_accepting() and g.matcher.is_stopped()  # the object closed: only EOS may follow
    assert g.valid_prefix(ids(tok, " ")) == 0
    # a proposal the grammar forbids is cut at its first forbidden token
    g.sync(text[:3])
    assert g.valid_prefix(text[3:5] + ids(tok, "zz")) == 2


def test_a_committed_token_the_grammar_refuses_is_a_fault(compiler, tok):
    spec = StructuredOutput("regex", "[0-9]+")
    g = RequestGrammar(spec, compiler.matcher(spec))
    with pytest.raises(GrammarFault, match="its regex grammar failed while consuming committed tokens"):
        g.sync(ids(tok, "abc"))


def test_unpack_bitmask_bit_order():
    vocab = 70
    allowed = torch.zeros(3, vocab, dtype=torch.bool)
    allowed[0, [0, 31, 32, 69]] = True
    allowed[1, :] = True
    allowed[2, 33] = True
    words = torch.zeros(3, 3, dtype=torch.int64)
    for r, t in allowed.nonzero().tolist():
        words[r, t // 32] |= 1 << (t % 32)
    bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # as int32 words
    assert torch.equal(unpack_bitmask(bitmask, vocab), allowed)


class _NoGrammar(RejectionSampler):
    name = "no_grammar"
    api_version = "3.0"
    capabilities = AcceptanceCapabilities(supports_structured_output=False)


def test_the_compatibility_rule_reads_the_capability_flag():
    assert structured_reasons(RejectionSampler) == [] and structured_reasons(TypicalAcceptance) == []
    reasons = structured_reasons(_NoGrammar)
    assert len(reasons) == 1 and reasons[0].startswith(
        "acceptance 'no_grammar' does not declare that it emits only tokens the target's (grammar-masked) "
        "distribution allows (supports_structured_output = false)")
