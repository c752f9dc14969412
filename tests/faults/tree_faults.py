"""``TreeFaultyProposer(real, kinds)``: wraps a tree proposer and spoils its output
in one of ``TREE_FAULTS`` ways (row faults spoil the first decode tree with room,
structural ones the whole output); ``abort_in_propose`` aborts a request while
its tree is proposed (effective when the step ends)."""

from __future__ import annotations

import random

import torch

from faulty_proposer import Delegating
from speculant.interfaces import Proposals, Proposer

# kind -> (row fault?, what the guard's warning says)
TREE_FAULTS = {
    "raise": (False, "propose raised RuntimeError"),
    "parent_after_child": (True, "a parent comes before its child"),
    "self_parent": (True, "a parent comes before its child"),  # a cycle of one node
    "cycle": (True, "a parent comes before its child"),  # nodes 0 and 1 each other's parent
    "too_many_nodes": (True, "outside [0, budget]"),
    "too_wide": (True, "above speculative.tree_width"),
    "oov_token": (True, "outside the vocabulary"),
    "repeated_siblings": (True, "siblings must propose distinct tokens"),
    "parents_shape": (False, "parents must be an integer tensor shaped like token_ids"),
    "float_parents": (False, "parents must be an integer tensor shaped like token_ids"),
    "tree_probs_shape": (False, "probs must be None or a float tensor"),  # trees may carry probs, one row per node
}


class TreeFaultyProposer(Delegating):
    name = "faulty_trees"

    def __init__(self, real: Proposer, kinds=tuple(TREE_FAULTS), rate: float = 1.0, seed: int = 0,
                 width: int = 2) -> None:
        super().__init__(real)
        self.kinds, self.rate, self.rng, self.width = list(kinds), rate, random.Random(seed), width
        self.injected: dict[str, int] = {}
        self.spoiled: set[str] = set()  # request ids whose tree a row fault dropped
        self.abort_in_propose: tuple[object, float] | None = None  # (engine, chance per call)
        self.aborted_in_propose: set[str] = set()

    def propose(self, batch) -> Proposals:
        if self.abort_in_propose is not None and batch.decodes:
            engine, chance = self.abort_in_propose
            if self.rng.random() < chance:
                victim = self.rng.choice(batch.decodes).request_id
                if engine.abort_request(victim):
                    self.aborted_in_propose.add(victim)
        kind = self.rng.choice(self.kinds) if self.kinds and self.rng.random() < self.rate else None
        if kind == "raise":
            self.injected[kind] = self.injected.get(kind, 0) + 1
            raise RuntimeError("injected fault in a tree proposer")
        out = self.real.propose(batch)
        if kind is None:
            return out
        spoiled = spoil(out, kind, batch, self.context.target.vocab_size, self.width)
        if spoiled is None:  # no tree this step had room for the fault
            return out
        new, row = spoiled
        self.injected[kind] = self.injected.get(kind, 0) + 1
        if row is not None:
            self.spoiled.add(batch.decodes[row].request_id)
        return new


def spoil(out: Proposals, kind: str, batch, vocab: int, width: int) -> tuple[Proposals, int | None] | None:
    """``out`` spoiled the ``kind`` way and the decode row spoiled (None: all of it),
    or None where no row has room for it."""
    rows, parents = out.to_lists(), out.parents_lists()
    assert parents is not None, "the wrapped proposer must propose trees"
    if not TREE_FAULTS[kind][0]:
        if not any(rows):
            return None
        ids, cu, par = out.token_ids, out.cu_num_draft_tokens, out.parents
        if kind == "parents_shape":
            return Proposals(ids, cu, parents=par[:-1]), None
        if kind == "float_parents":
            return Proposals(ids, cu, parents=par.float()), None
        one_hot = torch.nn.functional.one_hot(ids, vocab).float()[:-1]  # [T - 1, V]: a node without its row
        return Proposals(ids, cu, one_hot, par), None
    need = width + 1 if kind == "too_wide" else 2
    budgets = batch.num_spec_tokens
    row = next((i for i, r in enumerate(rows) if len(r) >= 2 and budgets[i] >= need), None)
    if row is None:
        return None
    toks, par = list(rows[row]), list(parents[row])
    if kind == "parent_after_child":
        par[0] = len(par) - 1
    elif kind == "self_parent":
        par[1] = 1
    elif kind == "cycle":
        par[0], par[1] = 1, 0
    elif kind == "too_many_nodes":  # a chain under the last node, one node past the budget
        while len(toks) <= budgets[row]:
            par.append(len(toks) - 1)
            toks.append(toks[-1])
    elif kind == "too_wide":  # width + 1 distinct children of the root
        toks, par = list(range(width + 1)), [-1] * (width + 1)
    elif kind == "oov_token":
        toks[-1] = vocab + 3
    elif kind == "repeated_siblings":
        toks, par = [toks[0], toks[0]], [-1, -1]
    rows[row], parents[row] = toks, par
    new = Proposals.from_lists(rows, out.device)
    flat = torch.tensor([p for ps in parents for p in ps], dtype=torch.long, device=out.device)
    return Proposals(new.token_ids, new.cu_num_draft_tokens, parents=flat), row
