"""Turn a proposer's logits into proposals the acceptance methods can verify.

Every drafting proposer filters its logits with the request's own sampling
settings (the same filter the target's logits get) and, for sampling
requests, draws from that distribution on the request's draft stream, so the
returned probabilities are exactly what the proposal was drawn from. When the
whole batch is verified by argmax alone (``verifies_by_argmax``) no
distribution is built: the proposals are the argmax and ``probs`` is None.
``DraftSteps`` collects a proposer's draws step by step and lays them out as
flat ``Proposals`` on the target's device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speculant.interfaces import Proposals
from speculant.interfaces.batch import RequestView
from speculant.sampling.acceptance import verifies_by_argmax
from speculant.sampling.logits_processing import filtered_logprobs, sampling_tensors
from speculant.sampling.sampler import DRAFT_STREAM, draw_uniforms, request_generator, sample_from_probs


@dataclass(frozen=True)
class DraftDraw:
    tokens: list[int]  # [R] the proposal of each row
    probs: torch.Tensor | None  # [R, V] float32 distribution drawn from; None when no row needs it
    confidence: torch.Tensor | None  # [R] probability the draft gave each proposal; None unless asked


def draw_proposals(
    logits: torch.Tensor,  # [R, V] proposer logits, one row per request
    requests: list[RequestView],
    step: int,  # proposal index (0 = first proposal); selects the random stream
    with_confidence: bool = False,
) -> DraftDraw:
    if verifies_by_argmax(requests):
        logits = logits.float()
        top, argmax = logits.max(dim=-1)  # [R], [R]
        conf = (top - logits.logsumexp(dim=-1)).exp() if with_confidence else None
        return DraftDraw(argmax.tolist(), None, conf)
    sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
    # greedy rows get the unfiltered softmax (their token is its argmax); sampling rows their filtered one
    probs = filtered_logprobs(logits, **sampling_tensors([r.params for r in requests], logits.device)).exp()
    tokens = probs.argmax(dim=-1).tolist()
    if sampled:
        gens = [request_generator(requests[i], DRAFT_STREAM + step) for i in sampled]
        uniforms = draw_uniforms(gens, [1] * len(sampled), logits.device)
        for i, tok in zip(sampled, sample_from_probs(probs[sampled], uniforms).tolist()):
            tokens[i] = tok
    conf = None
    if with_confidence:
        conf = probs.gather(1, torch.tensor(tokens, dtype=torch.long, device=probs.device).unsqueeze(1)).squeeze(1)
    return DraftDraw(tokens, probs, conf)


@dataclass
class DraftSteps:
    """A drafting proposer's draws, step by step, turned into flat ``Proposals``.

    Step j adds one proposal to each decode it lists; a decode drafted at step
    j must have been drafted at every earlier step (proposals are a prefix).
    ``build`` orders the draws decode-major with one sort, so no row is ever
    padded or copied one by one.
    """

    num_decodes: int
    device: torch.device
    _rows: list[torch.Tensor] = field(default_factory=list)  # per step: [m_j] decode indices
    _steps: list[torch.Tensor] = field(default_factory=list)  # per step: [m_j] step index
    _tokens: list[torch.Tensor] = field(default_factory=list)  # per step: [m_j] long
    _probs: list[torch.Tensor | None] = field(default_factory=list)  # per step: [m_j, V] or None

    def add(self, step: int, rows: list[int], tokens: list[int], probs: torch.Tensor | None) -> None:
        self._rows.append(torch.tensor(rows, dtype=torch.long, device=self.device))
        self._steps.append(torch.full((len(rows),), step, dtype=torch.long, device=self.device))
        self._tokens.append(torch.tensor(tokens, dtype=torch.long, device=self.device))
        self._probs.append(probs.to(self.device, torch.float32) if probs is not None else None)

    def build(self) -> Proposals:
        if not self._rows:
            return Proposals.empty(self.num_decodes, self.device)
        rows, steps = torch.cat(self._rows), torch.cat(self._steps)
        order = (rows * (int(steps.max()) + 1) + steps).argsort()  # decode-major, then step
        lens = torch.bincount(rows, minlength=self.num_decodes)
        cu = torch.cat([lens.new_zeros(1), lens.cumsum(0)])
        probs = None
        known = [p for p in self._probs if p is not None]
        if known:  # steps drawn without a distribution (only greedy rows left) get zero rows, never read
            vocab = known[0].shape[1]
            probs = torch.cat([p if p is not None else torch.zeros(r.shape[0], vocab, device=self.device)
                               for p, r in zip(self._probs, self._rows)])[order]
        return Proposals(torch.cat(self._tokens)[order], cu, probs)
