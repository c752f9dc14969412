"""Structured output: grammars compiled per engine, matched per request, masked inside the step."""

from speculant.engine.grammar.compiler import GrammarCompiler, GrammarError
from speculant.engine.grammar.request_grammar import GrammarFault, RequestGrammar
from speculant.engine.grammar.step_masks import StepGrammar, StructuredOutputs, unpack_bitmask

__all__ = ["GrammarCompiler", "GrammarError", "GrammarFault", "RequestGrammar", "StepGrammar",
           "StructuredOutputs", "unpack_bitmask"]
