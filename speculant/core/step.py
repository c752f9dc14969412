"""One engine step as small functions: propose -> score -> accept -> commit.

Every stage walks ``batch.prefills`` then ``batch.decodes`` in order, so
results map back to requests without index bookkeeping. Without speculation
the same path runs with empty proposals (k = 0 for every decode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speculant.core.acceptance import AcceptanceMethod, AcceptedTokens, greedy_accept, verifies_by_argmax
from speculant.core.batch import StepBatch
from speculant.core.layout import score_flat
from speculant.core.logits_processing import filtered_logprobs, sampling_tensors
from speculant.core.model_runner import ModelRunner
from speculant.core.request import Request
from speculant.core.sampler import ACCEPT_STREAM, request_generator, sample, top_logprobs
from speculant.core.stop_rules import append_tokens
from speculant.proposers.base import Proposals, Proposer
from speculant.scorers.base import Scorer, Scores


@dataclass
class StepTimes:
    propose_s: float = 0.0
    score_s: float = 0.0
    accept_s: float = 0.0

    def add(self, other: "StepTimes") -> None:
        self.propose_s += other.propose_s
        self.score_s += other.score_s
        self.accept_s += other.accept_s


@dataclass
class Decisions:
    """What each sampling entry emits this step (before stop rules)."""

    prefill_tokens: list[list[int]] = field(default_factory=list)  # per sampling prefill: [token]
    prefill_logprobs: list[list[torch.Tensor | None]] = field(default_factory=list)  # per token: [V]
    decode_tokens: list[list[int]] = field(default_factory=list)  # per decode: accepted + bonus
    decode_logprobs: list[list[torch.Tensor | None]] = field(default_factory=list)  # None: not asked for
    num_accepted: list[int] = field(default_factory=list)
    num_drafted: list[int] = field(default_factory=list)  # per decode: proposals verified


def propose(proposer: Proposer | None, batch: StepBatch) -> Proposals:
    if proposer is None:
        return Proposals.empty(len(batch.decodes))
    # called even when no decode speculates: a proposer with its own KV cache
    # must see this step's prefill chunks to stay in sync
    proposals = proposer.propose(batch)
    lens = proposals.lens
    budget = torch.tensor(batch.num_spec_tokens, dtype=lens.dtype, device=lens.device)
    if proposals.token_ids.shape[0] != len(batch.decodes) or bool((lens > budget).any()):
        raise RuntimeError(
            f"proposer {type(proposer).__name__} returned {proposals.token_ids.shape[0]} rows with lens "
            f"{lens.tolist()} for {len(batch.decodes)} decodes with budgets {batch.num_spec_tokens}; "
            "a proposer must return one row per decode and at most num_spec_tokens tokens each")
    return proposals


def score(scorer: Scorer | None, runner: ModelRunner, batch: StepBatch, proposals: Proposals,
          want_hidden: bool = False) -> Scores:
    if scorer is None:
        return score_flat(runner, batch, proposals, want_hidden)
    return scorer.score(runner, batch, proposals, want_hidden)


def decide(acceptance: AcceptanceMethod | None, batch: StepBatch, proposals: Proposals, scores: Scores) -> Decisions:
    out = Decisions()
    sampling_prefills = [p.request for p in batch.prefills if p.samples]
    sampled = sample(scores.prefill_logits, sampling_prefills)
    for i, tok in enumerate(sampled.token_ids):
        out.prefill_tokens.append([tok])
        out.prefill_logprobs.append([sampled.logprobs[i] if sampled.logprobs is not None else None])
    requests = [d.request for d in batch.decodes]
    if not requests:
        return out
    out.num_drafted = proposals.lens.tolist()
    if acceptance is None or proposals.token_ids.shape[1] == 0:
        sampled = sample(scores.decode_logits[:, 0], requests)
        for i, tok in enumerate(sampled.token_ids):
            out.decode_tokens.append([tok])
            out.decode_logprobs.append([sampled.logprobs[i] if sampled.logprobs is not None else None])
            out.num_accepted.append(0)
        return out
    if verifies_by_argmax(requests):
        # no distribution is needed: verify on the raw logits' argmax (what plain
        # greedy decoding picks), skipping the [n, k + 1, V] log-softmax
        accepted = greedy_accept(scores.decode_logits, proposals.token_ids, proposals.lens)
        for ids, a in zip(accepted.token_ids.tolist(), accepted.num_accepted.tolist()):
            out.decode_tokens.append(ids[: a + 1])
            out.decode_logprobs.append([None] * (a + 1))
            out.num_accepted.append(a)
        return out
    n, kp1, vocab = scores.decode_logits.shape
    t = sampling_tensors([r.params for r in requests], scores.decode_logits.device)
    rep = {name: v.repeat_interleave(kp1) for name, v in t.items()}
    target_lp = filtered_logprobs(scores.decode_logits.reshape(n * kp1, vocab), **rep).view(n, kp1, vocab)
    draft_probs = proposals.probs
    accepted: AcceptedTokens = acceptance.accept(
        target_lp, proposals.token_ids, draft_probs, proposals.lens,
        t["temperature"] == 0, [request_generator(r, ACCEPT_STREAM) for r in requests])
    ids = accepted.token_ids.tolist()
    for i, a in enumerate(accepted.num_accepted.tolist()):
        out.decode_tokens.append(ids[i][: a + 1])
        out.decode_logprobs.append([target_lp[i, j] for j in range(a + 1)])
        out.num_accepted.append(a)
    return out


def commit(batch: StepBatch, decisions: Decisions, runner: ModelRunner, detokenize) -> list[Request]:
    """Advance every scheduled request; return those that finished."""
    finished = []
    sampling = iter(zip(decisions.prefill_tokens, decisions.prefill_logprobs))
    for p in batch.prefills:
        p.request.num_computed_tokens += p.num_new_tokens
        if p.samples:
            tokens, lps = next(sampling)
            if _append(p.request, tokens, lps, runner, detokenize):
                finished.append(p.request)
    for d, tokens, lps, a, k in zip(batch.decodes, decisions.decode_tokens, decisions.decode_logprobs,
                                    decisions.num_accepted, decisions.num_drafted):
        d.request.num_computed_tokens += 1 + a
        if k:
            d.request.spec_stats.record(k, a)
        if _append(d.request, tokens, lps, runner, detokenize):
            finished.append(d.request)
    return finished


def _append(req: Request, tokens: list[int], lps: list[torch.Tensor], runner: ModelRunner, detokenize) -> bool:
    n_logprobs = req.params.logprobs
    entries = [top_logprobs(lp, tok, n_logprobs) for tok, lp in zip(tokens, lps)] if n_logprobs is not None else None
    append_tokens(req, tokens, runner.max_model_len, detokenize, entries)
    return req.finished


class Timer:
    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt
