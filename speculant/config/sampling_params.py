"""Per-request sampling settings: re-exported from the contract.

``SamplingParams`` is part of what a plugin receives (each request's settings
in its ``ScheduledRequest`` view), so it lives in the contract,
``speculant.interfaces.sampling_params``; this path stays importable.
"""

from speculant.interfaces.sampling_params import (
    MAX_LOGPROBS,
    MAX_SEED,
    MAX_TOP_K,
    MIN_TEMPERATURE,
    SamplingParams,
)

__all__ = ["MAX_LOGPROBS", "MAX_SEED", "MAX_TOP_K", "MIN_TEMPERATURE", "SamplingParams"]
