"""Turn a proposer's logits into proposals the acceptance methods can verify.

Every drafting proposer filters its logits with the request's own sampling
settings (the same filter the target's logits get) and, for sampling
requests, draws from that distribution on the request's draft stream, so the
returned probabilities are exactly what the proposal was drawn from. When the
whole batch is verified by argmax alone (``verifies_by_argmax``) no
distribution is built: the proposals are the argmax and ``probs`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.core.acceptance import verifies_by_argmax
from speculant.core.logits_processing import filtered_logprobs, sampling_tensors
from speculant.core.request import Request
from speculant.core.sampler import DRAFT_STREAM, draw_uniforms, request_generator, sample_from_probs


@dataclass(frozen=True)
class DraftDraw:
    tokens: list[int]  # [R] the proposal of each row
    probs: torch.Tensor | None  # [R, V] float32 distribution drawn from; None when no row needs it
    confidence: torch.Tensor | None  # [R] probability the draft gave each proposal; None unless asked


def draw_proposals(
    logits: torch.Tensor,  # [R, V] proposer logits, one row per request
    requests: list[Request],
    step: int,  # proposal index (0 = first proposal); selects the random stream
    with_confidence: bool = False,
) -> DraftDraw:
    if verifies_by_argmax(requests):
        logits = logits.float()
        top, tokens = logits.max(dim=-1)  # [R], [R]
        conf = (top - logits.logsumexp(dim=-1)).exp() if with_confidence else None
        return DraftDraw(tokens.tolist(), None, conf)
    sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
    # greedy rows get the unfiltered softmax (their token is its argmax); sampling rows their filtered one
    probs = filtered_logprobs(logits, **sampling_tensors([r.params for r in requests], logits.device)).exp()
    tokens = probs.argmax(dim=-1).tolist()
    if sampled:
        gens = [request_generator(requests[i], DRAFT_STREAM + step) for i in sampled]
        uniforms = draw_uniforms(gens, [1] * len(sampled), 1, logits.device)
        for i, tok in zip(sampled, sample_from_probs(probs[sampled], uniforms[:, 0]).tolist()):
            tokens[i] = tok
    conf = None
    if with_confidence:
        conf = probs.gather(1, torch.tensor(tokens, dtype=torch.long, device=probs.device).unsqueeze(1)).squeeze(1)
    return DraftDraw(tokens, probs, conf)
