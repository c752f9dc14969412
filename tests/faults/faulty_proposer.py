"""A proposer wrapper that injects faults into a real proposer.

``FaultyProposer(real, schedule)`` delegates to ``real`` and, on the calls the
schedule picks, misbehaves in one of ``FAULTS`` ways: raise inside ``propose``
or ``commit`` (after the real proposer has already changed its state, the
realistic worst case), return each kind of bad output, or sleep. Installed by
assigning it to ``llm.engine.spec.proposer`` (every call goes through
the engine's proposer guard, as for a registered plugin).
"""

from __future__ import annotations

import random
import time

import torch

from speculant.interfaces import Proposals, Proposer

# kind -> what the proposer returns (or does) on a faulty call
FAULTS = (
    "raise",  # propose raises after the real proposer ran
    "raise_before",  # propose raises before the real proposer ran
    "none",  # returns None
    "oov_ids",  # token ids >= vocab size
    "negative_ids",  # token ids < 0 inside lens
    "float_ids",  # float token ids
    "negative_lens",
    "long_lens",  # lens > the decode's budget
    "wrong_rows",  # one row too many
    "nan_probs",
    "unnormalised_probs",
    "negative_probs",
    "commit_raise",  # commit raises after the real commit
    "sleep",  # a slow call (SLEEP_S), output fine
)
SLEEP_S = 0.05
# kinds restore_prefix may misbehave in (drawn from a generator of their own, so
# the faults of propose stay what they were)
RESTORE_FAULTS = (
    "restore_raise",  # raises after the real proposer restored its state
    "restore_bad",  # returns more tokens than were cached
)


class FaultyProposer(Proposer):
    name = "faulty"
    api_version = "3.0"

    def __init__(self, real: Proposer, faults=FAULTS, rate: float = 0.3, seed: int = 0,
                 sleep_s: float = 0.0) -> None:
        self.real = real
        self.context = real.context
        self.options = real.options
        self.capabilities = real.capabilities
        self.faults = list(faults)
        self.rate = rate
        self.rng = random.Random(seed)
        self.sleep_s = sleep_s
        self.injected: dict[str, int] = {}
        self._commit_fault = False
        self.restore_faults = [f for f in RESTORE_FAULTS if f in faults] if faults is not FAULTS else \
            list(RESTORE_FAULTS)
        self.restore_rng = random.Random(seed + 1)

    def _pick(self) -> str | None:
        if self.faults and self.rng.random() < self.rate:
            kind = self.rng.choice(self.faults)
            self.injected[kind] = self.injected.get(kind, 0) + 1
            return kind
        return None

    def propose(self, batch) -> Proposals:
        kind = self._pick()
        self._commit_fault = kind == "commit_raise"
        if self.sleep_s or kind == "sleep":
            time.sleep(self.sleep_s or SLEEP_S)
        if kind == "raise_before":
            raise RuntimeError("injected fault before propose")
        out = self.real.propose(batch)
        if kind in (None, "commit_raise", "sleep"):
            return out
        return corrupt(out, kind, self.context.target.vocab_size, len(batch.decodes))

    def commit(self, batch, num_accepted, scores) -> None:
        self.real.commit(batch, num_accepted, scores)
        if self._commit_fault:
            raise RuntimeError("injected fault in commit")

    def free(self, request_id: str) -> None:
        self.real.free(request_id)

    def restore_prefix(self, request, num_cached_tokens: int) -> int:
        kept = self.real.restore_prefix(request, num_cached_tokens)
        if self.restore_faults and self.restore_rng.random() < self.rate:
            kind = self.restore_rng.choice(self.restore_faults)
            self.injected[kind] = self.injected.get(kind, 0) + 1
            if kind == "restore_raise":
                raise RuntimeError("injected fault in restore_prefix")
            return num_cached_tokens + 1
        return kept


def padded(out: Proposals) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The flat proposals as a padded table (ids [n, k], lens [n], probs [n, k, V])."""
    rows = out.to_lists()
    k = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), k), -1, dtype=torch.long)
    keep = torch.arange(k).unsqueeze(0) < out.lens.cpu().unsqueeze(1)
    ids[keep] = out.token_ids.cpu()
    probs = None
    if out.probs is not None:
        probs = torch.zeros(len(rows), k, out.probs.shape[1])
        probs[keep] = out.probs.cpu()
    return ids, out.lens.cpu(), probs


def corrupt(out: Proposals, kind: str, vocab: int, n: int):
    ids, cu, probs = out.token_ids.clone(), out.cu_num_draft_tokens.clone(), out.probs
    if kind == "raise":
        raise RuntimeError("injected fault after propose")
    if kind == "none":
        return None
    if kind == "wrong_rows":  # one (empty) row too many
        return Proposals(ids, torch.cat([cu, cu[-1:]]))
    if kind == "float_ids":
        return Proposals(ids.float(), cu, probs)
    if kind == "negative_lens":  # every row -2 long: offsets that decrease
        return Proposals(ids, -2 * torch.arange(n + 1, device=cu.device), probs)
    if kind == "long_lens":  # 3 more tokens than the budget allows, built the padded way
        table, lens, table_probs = padded(out)
        wide = torch.cat([table, torch.zeros(n, 3, dtype=torch.long)], dim=1)
        wide_probs = None
        if table_probs is not None:
            wide_probs = torch.cat([table_probs, torch.zeros(n, 3, table_probs.shape[2])], dim=1)
        return Proposals.from_padded(wide, lens + 3, wide_probs)
    if kind in ("oov_ids", "negative_ids"):
        table, lens, table_probs = padded(out)
        if table.shape[1]:  # every row's first proposal spoiled (rows that proposed nothing get one)
            table[:, 0] = vocab + 5 if kind == "oov_ids" else -7
            lens = lens.clamp_min(1)
        return Proposals.from_padded(table, lens, table_probs)
    if probs is None:  # argmax-verified batch: no probabilities to spoil; spoil the ids instead
        return corrupt(out, "oov_ids", vocab, n)
    probs = probs.clone()
    if kind == "nan_probs":
        probs[:, 0] = float("nan")
    elif kind == "unnormalised_probs":
        probs *= 0.5
    elif kind == "negative_probs":
        probs[:, 0] = -0.25
    return Proposals(ids, cu, probs)


class Delegating(Proposer):
    """A proposer that wraps ``real``: every call not overridden goes to it."""

    api_version = "3.0"

    def __init__(self, real: Proposer) -> None:
        self.real, self.context, self.options, self.capabilities = real, real.context, real.options, real.capabilities

    def propose(self, batch) -> Proposals:
        return self.real.propose(batch)

    def commit(self, batch, num_accepted, scores) -> None:
        self.real.commit(batch, num_accepted, scores)

    def free(self, request_id: str) -> None:
        self.real.free(request_id)

    def restore_prefix(self, request, num_cached_tokens: int) -> int:
        return self.real.restore_prefix(request, num_cached_tokens)
