"""Turn a proposer's logits into proposals the acceptance methods can verify.

Every drafting proposer filters its logits with the request's own sampling
settings (the same filter the target's logits get) and, for sampling
requests, draws from that distribution on the request's draft stream, so the
returned probabilities are exactly what the proposal was drawn from.
"""

from __future__ import annotations

import torch

from speculant.core.logits_processing import filtered_logprobs, sampling_tensors
from speculant.core.request import Request
from speculant.core.sampler import DRAFT_STREAM, draw_uniforms, request_generator, sample_from_probs


def draw_proposals(
    logits: torch.Tensor,  # [R, V] proposer logits, one row per request
    requests: list[Request],
    step: int,  # proposal index (0 = first proposal); selects the random stream
) -> tuple[list[int], torch.Tensor]:  # tokens [R], probs [R, V]
    sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
    if not sampled:  # all greedy: the argmax, and the unfiltered softmax as the reported probs
        return logits.argmax(dim=-1).tolist(), logits.float().softmax(dim=-1)
    probs = filtered_logprobs(logits, **sampling_tensors([r.params for r in requests], logits.device)).exp()
    tokens = probs.argmax(dim=-1).tolist()
    gens = [request_generator(requests[i], DRAFT_STREAM + step) for i in sampled]
    uniforms = draw_uniforms(gens, [1] * len(sampled), 1, logits.device)
    for i, tok in zip(sampled, sample_from_probs(probs[sampled], uniforms[:, 0]).tolist()):
        tokens[i] = tok
    return tokens, probs
