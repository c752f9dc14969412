"""Check a proposer's output before the target scores it.

A proposer is a plugin: its output is checked, not trusted. Structure first
(a ``Proposals``; integer ``token_ids`` ``[n, k]`` and ``lens`` ``[n]`` with one
row per decode; ``probs`` None or floating ``[n, k, V]``), then each row: ``lens``
in ``[0, num_spec_tokens]`` of that decode (and ``<= k``), ids inside ``lens`` in
``[0, V)``, and at those positions ``probs`` finite, non-negative and summing to
1 within ``PROB_SUM_TOLERANCE`` (on the rows of sampling requests only: greedy
rows are verified by argmax and their probs are never read; a draft may leave
them zero, as ``draft_model`` does once only greedy rows keep drafting). A structural fault drops every row; a row
fault drops that row. Dropped rows get ``lens = 0``: the decode runs without
speculation this step (its output is unchanged, only slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.core.batch import StepBatch
from speculant.proposers.base import PLACEHOLDER_TOKEN_ID, Proposals

PROB_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class CheckedProposals:
    proposals: Proposals  # safe to score: dropped rows have lens 0
    problems: list[str]  # what was wrong, empty when nothing was
    bad_rows: list[int]  # decode rows whose proposals were dropped
    structural: bool = False  # the output as a whole was unusable (every row dropped)


def _is_int_tensor(t: object) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() \
        and t.dtype != torch.bool


def _structure_problem(out: object, n: int, vocab: int) -> str | None:
    if not isinstance(out, Proposals):
        return f"returned {type(out).__name__}, not Proposals"
    ids, lens, probs = out.token_ids, out.lens, out.probs
    if not _is_int_tensor(ids) or ids.dim() != 2 or ids.shape[0] != n:
        what = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else repr(ids)
        return f"token_ids must be an integer tensor [{n}, k] (one row per decode), got {what}"
    if not _is_int_tensor(lens) or lens.dim() != 1 or lens.shape[0] != n:
        what = f"{lens.dtype} tensor of shape {tuple(lens.shape)}" if isinstance(lens, torch.Tensor) else repr(lens)
        return f"lens must be an integer tensor [{n}], got {what}"
    if probs is not None:
        want = (n, ids.shape[1], vocab)
        if not isinstance(probs, torch.Tensor) or not probs.is_floating_point() or tuple(probs.shape) != want:
            what = f"{probs.dtype} tensor of shape {tuple(probs.shape)}" if isinstance(probs, torch.Tensor) \
                else repr(probs)
            return f"probs must be None or a float tensor {list(want)}, got {what}"
    return None


def check_proposals(out: object, batch: StepBatch, vocab: int) -> CheckedProposals:
    n = len(batch.decodes)
    problem = _structure_problem(out, n, vocab)
    if problem is not None:
        return CheckedProposals(Proposals.empty(n), [problem], list(range(n)), structural=True)
    ids, lens, probs = out.token_ids.long().cpu(), out.lens.long().cpu(), out.probs
    k = ids.shape[1]
    budget = torch.tensor(batch.num_spec_tokens, dtype=torch.long)
    problems = []
    bad_len = (lens < 0) | (lens > budget) | (lens > k)  # [n]
    if bool(bad_len.any()):
        rows = bad_len.nonzero().squeeze(1).tolist()
        problems.append(f"lens {[int(lens[i]) for i in rows]} of rows {rows} are outside [0, budget] "
                        f"(budgets {[batch.num_spec_tokens[i] for i in rows]}, {k} columns)")
    in_lens = torch.arange(k).unsqueeze(0) < lens.clamp(0, k).unsqueeze(1)  # [n, k]
    bad_ids = ((ids < 0) | (ids >= vocab)) & in_lens
    bad_id = bad_ids.any(dim=1)
    if bool(bad_id.any()):
        rows = bad_id.nonzero().squeeze(1).tolist()
        problems.append(f"token ids {ids[bad_ids][:5].tolist()} in rows {rows} are outside the vocabulary "
                        f"[0, {vocab})")
    bad = bad_len | bad_id
    if probs is not None:
        sampling = torch.tensor([not d.request.params.greedy for d in batch.decodes], dtype=torch.bool)
        bad_prob = _prob_problems(probs.detach().float().cpu(), in_lens & sampling.unsqueeze(1), problems)
        bad = bad | bad_prob
    if not problems:
        return CheckedProposals(Proposals(ids, lens, probs.float() if probs is not None else None), [], [])
    keep = in_lens & ~bad.unsqueeze(1)
    clean_ids = torch.where(keep, ids, torch.full_like(ids, PLACEHOLDER_TOKEN_ID))
    clean_lens = torch.where(bad, torch.zeros_like(lens), lens)
    clean_probs = None
    if probs is not None:
        clean_probs = torch.nan_to_num(probs.float(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
        clean_probs[bad] = 0.0
    return CheckedProposals(Proposals(clean_ids, clean_lens, clean_probs), problems,
                            bad.nonzero().squeeze(1).tolist())


def _prob_problems(probs: torch.Tensor, in_lens: torch.Tensor, problems: list[str]) -> torch.Tensor:
    """Rows whose probabilities at the checked positions (``in_lens``) are not a distribution."""
    finite = torch.isfinite(probs).all(dim=2)  # [n, k]
    nonneg = (torch.nan_to_num(probs, nan=0.0) >= 0).all(dim=2)
    sums = torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0).sum(dim=2)
    normalized = (sums - 1).abs() <= PROB_SUM_TOLERANCE
    bad = torch.zeros(probs.shape[0], dtype=torch.bool)
    for ok, what in ((finite, "are not finite (NaN or inf)"), (nonneg, "are negative"),
                     (normalized, f"do not sum to 1 within {PROB_SUM_TOLERANCE}")):
        rows = (~ok & in_lens).any(dim=1)
        if bool(rows.any()):
            idx = rows.nonzero().squeeze(1).tolist()
            extra = ""
            if ok is normalized:
                r, j = (~ok & in_lens).nonzero()[0].tolist()
                extra = f" (row {r} position {j} sums to {float(sums[r, j]):.4g})"
            problems.append(f"probs of rows {idx} {what}{extra}")
            bad |= rows
    return bad
