"""A request's structured-output constraint: re-exported from the contract
(``speculant.interfaces.structured``), where ``SamplingParams`` that carries
it lives; this path stays importable."""

from speculant.interfaces.structured import StructuredOutput, parse_structured

__all__ = ["StructuredOutput", "parse_structured"]
