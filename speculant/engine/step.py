"""One engine step's computation as small functions: propose -> score -> decide.

None of them changes a request: they produce ``Decisions``, which
``commit.py`` turns into each request's new state (``step_runner.py`` runs the
stages and handles their faults). Every stage walks ``batch.prefills`` then
``batch.decodes`` in order, so results map back to requests without index
bookkeeping. Without speculation the same path runs with empty proposals
(k = 0 for every decode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from speculant.engine.batch import StepBatch
from speculant.engine.proposer_guard import ProposerGuard
from speculant.engine.runner_view import SequenceRunner
from speculant.interfaces import AcceptanceMethod, Proposals, Proposer, Scorer, Scores
from speculant.interfaces import batch as views
from speculant.interfaces.layout import score_flat
from speculant.sampling.acceptance import greedy_accept, verifies_by_argmax
from speculant.sampling.logits_processing import filtered_logprobs, sampling_tensors
from speculant.sampling.sampler import ACCEPT_STREAM, request_generator, sample
from speculant.sampling.tree_acceptance import greedy_tree_accept


@dataclass
class StepTimes:
    propose_s: float = 0.0
    score_s: float = 0.0
    accept_s: float = 0.0

    def add(self, other: StepTimes) -> None:
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
    accepted_nodes: list[list[int]] | None = None  # per decode, for token trees: the accepted path's nodes


def propose(proposer: Proposer | None, batch: StepBatch, guard: ProposerGuard | None = None,
            device: torch.device | str = "cpu") -> Proposals:
    """Checked proposals on the target's ``device`` (``proposal_checks``); a
    faulty proposer yields none for the affected decodes (``proposer_guard``),
    it never raises."""
    if proposer is None or not proposer_runs(proposer, batch):
        return Proposals.empty(len(batch.decodes), device)
    guard = guard or ProposerGuard(proposer.context.target.vocab_size)
    return guard.propose(proposer, batch.view())


def proposer_runs(proposer: Proposer, batch: StepBatch) -> bool:
    """Whether ``proposer.propose`` is called in this step: when a decode is
    planned proposals, or when there are prefill chunks (a proposer with its
    own KV cache follows them in the same step). Otherwise off is off: a step
    of decodes all at k = 0 costs the proposer nothing, and a stateful one
    catches up on the tokens it missed when it next speculates."""
    return bool(batch.prefills) or any(d.num_spec_tokens for d in batch.decodes)


def proposer_commits(proposer: Proposer, batch: StepBatch) -> bool:
    """Whether ``proposer.commit`` is called after this step: whenever it
    proposed, and in every step for a proposer that reads the target's hidden
    states at commit (``needs_target_hidden_states``): they exist only in the
    step's forward, so it keeps them for a request that is off, to catch up
    from when the request speculates again."""
    return proposer_runs(proposer, batch) or proposer.capabilities.needs_target_hidden_states


def score(scorer: Scorer | None, runner: SequenceRunner, batch: StepBatch | views.StepBatch, proposals: Proposals,
          want_hidden: bool = False) -> Scores:
    """The target's scores with ``scorer`` (None: the plain flat forward); it
    gets the batch's read-only view (``batch`` may be the engine's or a view)."""
    view = batch.view() if isinstance(batch, StepBatch) else batch
    if scorer is None:
        return score_flat(runner, view, proposals, want_hidden)
    return scorer.score(runner, view, proposals, want_hidden)


def decide(acceptance: AcceptanceMethod | None, batch: StepBatch, proposals: Proposals, scores: Scores) -> Decisions:
    out = Decisions()
    reporting = [p for p in batch.prefills if p.reports]  # rows of scores.prefill_logits
    rows = [i for i, p in enumerate(reporting) if p.samples]
    logits = scores.prefill_logits if len(rows) == len(reporting) else scores.prefill_logits[rows]
    sampled = sample(logits, [reporting[i].request for i in rows])
    for i, tok in enumerate(sampled.token_ids):
        out.prefill_tokens.append([tok])
        out.prefill_logprobs.append([sampled.logprobs[i] if sampled.logprobs is not None else None])
    requests = [d.request for d in batch.decodes]
    if not requests:
        return out
    out.num_drafted = proposals.lens.tolist()
    cu = scores.cu_num_logits  # [n + 1]: decode i's target rows are cu[i]:cu[i + 1]
    if acceptance is None or proposals.num_draft_tokens == 0:
        first = scores.decode_logits if proposals.num_draft_tokens == 0 else scores.decode_logits[cu[:-1]]
        sampled = sample(first, requests)
        for i, tok in enumerate(sampled.token_ids):
            out.decode_tokens.append([tok])
            out.decode_logprobs.append([sampled.logprobs[i] if sampled.logprobs is not None else None])
            out.num_accepted.append(0)
        return out
    if proposals.parents is not None:
        return _decide_trees(acceptance, requests, proposals, scores, out)
    if verifies_by_argmax(requests):
        # no distribution is needed: verify on the raw logits' argmax (what plain
        # greedy decoding picks), skipping the log-softmax over every row
        accepted = greedy_accept(scores.decode_logits, proposals.token_ids, proposals.cu_num_draft_tokens)
        for ids, a in zip(accepted.token_ids.tolist(), accepted.num_accepted.tolist()):
            out.decode_tokens.append(ids[: a + 1])
            out.decode_logprobs.append([None] * (a + 1))
            out.num_accepted.append(a)
        return out
    target_lp, greedy = _target_logprobs(requests, scores)
    accepted = acceptance.accept(
        target_lp, proposals.token_ids, proposals.cu_num_draft_tokens, proposals.probs,
        greedy, [request_generator(r, ACCEPT_STREAM) for r in requests])
    ids = accepted.token_ids.tolist()
    for i, (row, a) in enumerate(zip(scores.cu_num_logits[:-1].tolist(), accepted.num_accepted.tolist())):
        out.decode_tokens.append(ids[i][: a + 1])
        out.decode_logprobs.append([target_lp[row + j] for j in range(a + 1)])
        out.num_accepted.append(a)
    return out


def _target_logprobs(requests: list, scores: Scores) -> tuple[torch.Tensor, torch.Tensor]:
    """The decodes' filtered target log-probs [n + T, V] and which decodes are greedy [n]."""
    cu = scores.cu_num_logits
    num_rows = scores.decode_logits.shape[0]  # n + T real rows, no padding to filter
    t = sampling_tensors([r.params for r in requests], scores.decode_logits.device)
    rep = {name: v.repeat_interleave(cu.diff(), output_size=num_rows) for name, v in t.items()}
    return filtered_logprobs(scores.decode_logits, **rep), t["temperature"] == 0


def _decide_trees(acceptance: AcceptanceMethod, requests: list, proposals: Proposals, scores: Scores,
                  out: Decisions) -> Decisions:
    """Token trees: each decode keeps one path of its tree (``sampling.tree_acceptance``)."""
    target_lp = None
    if verifies_by_argmax(requests):
        accepted = greedy_tree_accept(scores.decode_logits, proposals)
    else:
        target_lp, greedy = _target_logprobs(requests, scores)
        accepted = acceptance.accept_tree(target_lp, proposals, greedy,
                                          [request_generator(r, ACCEPT_STREAM) for r in requests])
    assert accepted.paths is not None, f"acceptance '{acceptance.name}' returned no paths for token trees"
    ids = accepted.token_ids.tolist()
    out.accepted_nodes = accepted.paths
    for i, (row, path) in enumerate(zip(scores.cu_num_logits[:-1].tolist(), accepted.paths)):
        a = len(path)
        out.decode_tokens.append(ids[i][: a + 1])
        rows = [row] + [row + 1 + j for j in path]  # the target row each emitted token came from
        out.decode_logprobs.append([target_lp[r] for r in rows] if target_lp is not None else [None] * (a + 1))
        out.num_accepted.append(a)
    return out


class Timer:
    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt
