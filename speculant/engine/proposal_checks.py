"""Check a proposer's output before the target scores it.

A proposer is a plugin: its output is checked, not trusted. It is first moved
to the target's device (a plugin may build it anywhere), then its structure is
checked (a ``Proposals``; integer flat ``token_ids`` ``[T]``; integer
``cu_num_draft_tokens`` ``[n + 1]``, one row per decode, starting at 0, never
decreasing and ending at ``T``; ``probs`` None or floating ``[T, V]``), then
each row: ``lens`` (the offsets' differences) at most the decode's
``num_spec_tokens``, ids in ``[0, V)``, and ``probs`` finite, non-negative and
summing to 1 within ``PROB_SUM_TOLERANCE`` (on the rows of sampling requests
only: greedy rows are verified by argmax and their probs are never read; a
draft may leave them zero, as ``draft_model`` does once only greedy rows keep
drafting). Token trees (``parents``) are taken only where ``tree_width`` > 1
(trees on and a proposer that declares ``proposes_trees``), each row a tree in
topological order with distinct sibling tokens and at most ``tree_width``
children per node (``interfaces.tree``); with ``probs``, node j's row is the
distribution it was drawn from (``Proposals``).
A structural fault drops every row; a row fault drops that row.
Dropped rows get ``lens = 0``: the decode runs without speculation this step
(its output is unchanged, only slower).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speculant.interfaces import Proposals
from speculant.interfaces.batch import StepBatch
from speculant.interfaces.tree import children, tree_problem

PROB_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class CheckedProposals:
    proposals: Proposals  # safe to score, on the target's device: dropped rows have lens 0
    problems: list[str]  # what was wrong, empty when nothing was
    bad_rows: list[int]  # decode rows whose proposals were dropped
    structural: bool = False  # the output as a whole was unusable (every row dropped)


def _is_int_tensor(t: object) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() \
        and t.dtype != torch.bool


def _what(t: object) -> str:
    return f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)


def _structure_problem(out: object, n: int, vocab: int, tree_width: int = 1) -> str | None:
    if not isinstance(out, Proposals):
        return f"returned {type(out).__name__}, not Proposals"
    if out.parents is not None:
        if tree_width <= 1:
            return ("set Proposals.parents (a token tree), but this engine asks for trees only with "
                    "speculative.tree_width > 1 and a proposer that declares proposes_trees: return "
                    "parents=None, each decode's proposals as one chain")
        if not _is_int_tensor(out.parents) or tuple(out.parents.shape) != tuple(out.token_ids.shape):
            return f"parents must be an integer tensor shaped like token_ids, got {_what(out.parents)}"
    ids, cu, probs = out.token_ids, out.cu_num_draft_tokens, out.probs
    if not _is_int_tensor(ids) or ids.dim() != 1:
        return f"token_ids must be an integer tensor [num_draft_tokens] (flat), got {_what(ids)}"
    if not _is_int_tensor(cu) or cu.dim() != 1 or cu.shape[0] != n + 1:
        return (f"cu_num_draft_tokens must be an integer tensor [{n + 1}] (one row per decode, after a "
                f"leading 0), got {_what(cu)}")
    num_tokens = ids.shape[0]
    if int(cu[0]) != 0 or int(cu[-1]) != num_tokens or bool((cu.diff() < 0).any()):
        shown = cu[:12].tolist()
        return (f"cu_num_draft_tokens must start at 0, never decrease and end at len(token_ids) = {num_tokens}, "
                f"got {shown}{' ...' if n + 1 > 12 else ''}")
    if probs is not None:
        want = (num_tokens, vocab)
        if not isinstance(probs, torch.Tensor) or not probs.is_floating_point() or tuple(probs.shape) != want:
            return f"probs must be None or a float tensor {list(want)}, got {_what(probs)}"
    return None


def _on(out: object, device: torch.device | str) -> object:
    """``out`` with its tensors on ``device`` (anything else is left for the structure check)."""
    if not isinstance(out, Proposals):
        return out
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return Proposals(move(out.token_ids), move(out.cu_num_draft_tokens), move(out.probs), move(out.parents))


def _tree_rows(out: Proposals, tree_width: int, problems: list[str]) -> list[int]:
    """Decode rows whose ``parents`` are not a tree of at most ``tree_width`` children per node."""
    parents = out.parents_lists()
    assert parents is not None
    bad = []
    for i, (tokens, par) in enumerate(zip(out.to_lists(), parents)):
        problem = tree_problem(tokens, par)
        if problem is None:
            widest = max((len(k) for k in children(par)), default=0)
            if widest > tree_width:
                problem = f"a node has {widest} children, above speculative.tree_width = {tree_width}"
        if problem is not None:
            problems.append(f"the tree of row {i} {problem}")
            bad.append(i)
    return bad


def check_proposals(out: object, batch: StepBatch, vocab: int,
                    device: torch.device | str = "cpu", tree_width: int = 1) -> CheckedProposals:
    """``tree_width``: the most children per node of a token tree; 1 refuses trees."""
    n = len(batch.decodes)
    out = _on(out, device)
    problem = _structure_problem(out, n, vocab, tree_width)
    if problem is not None:
        return CheckedProposals(Proposals.empty(n, device), [problem], list(range(n)), structural=True)
    assert isinstance(out, Proposals)  # _structure_problem returned None: it is one
    if out.num_draft_tokens == 0:  # nothing offered (cu is all zeros): nothing else to check
        return CheckedProposals(Proposals.empty(n, device), [], [])
    ids, cu, probs = out.token_ids.long(), out.cu_num_draft_tokens.long(), out.probs
    lens = cu.diff()  # [n], non-negative (structure)
    rows = torch.repeat_interleave(torch.arange(n, device=ids.device), lens, output_size=ids.shape[0])  # [T]
    budget = torch.tensor(batch.num_spec_tokens, dtype=torch.long, device=ids.device)
    problems = []
    bad_len = lens > budget  # [n]
    if bool(bad_len.any()):
        idx = bad_len.nonzero().squeeze(1).tolist()
        problems.append(f"lens {[int(lens[i]) for i in idx]} of rows {idx} are outside [0, budget] "
                        f"(budgets {[batch.num_spec_tokens[i] for i in idx]})")
    bad_tok = (ids < 0) | (ids >= vocab)  # [T]
    bad_id = _rows_with(bad_tok, rows, n)
    if bool(bad_id.any()):
        problems.append(f"token ids {ids[bad_tok][:5].tolist()} in rows {bad_id.nonzero().squeeze(1).tolist()} "
                        f"are outside the vocabulary [0, {vocab})")
    bad = bad_len | bad_id
    parents = out.parents.long() if out.parents is not None else None
    if parents is not None:
        for i in _tree_rows(out, tree_width, problems):
            bad[i] = True
    if probs is not None:
        sampling = torch.tensor([not d.request.params.greedy for d in batch.decodes], dtype=torch.bool,
                                device=ids.device)
        bad = bad | _prob_problems(probs.detach().float(), sampling[rows], rows, n, problems)
    if not problems:
        return CheckedProposals(Proposals(ids, cu, probs.float() if probs is not None else None, parents), [], [])
    keep = ~bad[rows]  # [T] tokens of rows that stay
    clean_lens = torch.where(bad, torch.zeros_like(lens), lens)
    clean_probs = None
    if probs is not None:
        clean_probs = torch.nan_to_num(probs[keep].float(), nan=0.0, posinf=0.0, neginf=0.0).clamp_min(0)
    clean = Proposals(ids[keep], torch.cat([cu.new_zeros(1), clean_lens.cumsum(0)]), clean_probs,
                      parents[keep] if parents is not None else None)
    return CheckedProposals(clean, problems, bad.nonzero().squeeze(1).tolist())


def _rows_with(flags: torch.Tensor,  # [T] bool, per proposal
               rows: torch.Tensor,  # [T] long, the decode of each proposal
               n: int) -> torch.Tensor:  # [n] bool: the decode has a flagged proposal
    return torch.zeros(n, dtype=torch.long, device=rows.device).index_add_(0, rows, flags.long()) > 0


def _prob_problems(probs: torch.Tensor,  # [T, V]
                   checked: torch.Tensor,  # [T] bool: proposals whose probs are checked
                   rows: torch.Tensor,  # [T] long
                   n: int, problems: list[str]) -> torch.Tensor:  # [n] bool
    """Rows whose probabilities at the checked proposals are not a distribution."""
    finite = torch.isfinite(probs).all(dim=1)  # [T]
    nonneg = (torch.nan_to_num(probs, nan=0.0) >= 0).all(dim=1)
    sums = torch.nan_to_num(probs, nan=0.0, posinf=0.0, neginf=0.0).sum(dim=1)
    normalized = (sums - 1).abs() <= PROB_SUM_TOLERANCE
    bad = torch.zeros(n, dtype=torch.bool, device=rows.device)
    for ok, what in ((finite, "are not finite (NaN or inf)"), (nonneg, "are negative"),
                     (normalized, f"do not sum to 1 within {PROB_SUM_TOLERANCE}")):
        flagged = ~ok & checked  # [T]
        bad_rows = _rows_with(flagged, rows, n)
        if bool(bad_rows.any()):
            extra = ""
            if ok is normalized:
                t = int(flagged.nonzero()[0])
                extra = f" (row {int(rows[t])} proposal {t} sums to {float(sums[t]):.4g})"
            problems.append(f"probs of rows {bad_rows.nonzero().squeeze(1).tolist()} {what}{extra}")
            bad |= bad_rows
    return bad
