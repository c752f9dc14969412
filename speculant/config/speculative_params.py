"""A request's speculation settings: re-exported from the contract
(``speculant.interfaces.speculative_params``), where ``SamplingParams`` that carries
them lives; this path stays importable."""

from speculant.interfaces.speculative_params import FIELDS, SpeculativeParams, parse_speculative

__all__ = ["FIELDS", "SpeculativeParams", "parse_speculative"]
