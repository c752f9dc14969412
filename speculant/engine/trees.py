"""The engine's side of token trees: keep only the accepted path's K/V after
a tree is verified (``compact_paths``), and reduce a decode's tree to a chain
where a tree cannot be verified (``chains_for``: structured output, whose
grammar walks one sequence).

The verify forward wrote node j of a decode's tree to slot ``start + 1 + j``
(the root, the decode's last token, at ``start``). After acceptance the kept
path's nodes must sit where a chain would have put them, depth d at ``start +
d``: each one whose slot differs is copied there, in every layer's cache, in
one gather and one scatter per cache (``SequenceRunner.move_positions``
resolves each decode's sequence handle to its slots, then calls
``ModelRunner.move_kv``). The slots past the path are released as rejected
chain tokens are: the next step overwrites them. A path that already runs
``0, 1, 2, ...`` (the first children) moves nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from speculant.engine.batch import ScheduledRequest
from speculant.engine.runner_view import SequenceRunner
from speculant.interfaces import Proposals
from speculant.interfaces.tree import children


def path_moves(start: int, path: Sequence[int]) -> tuple[list[int], list[int]]:
    """(source positions, destination positions) that put ``path``'s K/V at depths 1, 2, ... after ``start``."""
    src: list[int] = []
    dst: list[int] = []
    for depth, node in enumerate(path, start=1):
        if node + 1 == depth:
            continue
        src.append(start + 1 + node)
        dst.append(start + depth)
    return src, dst


def compact_paths(runner: SequenceRunner, decodes: Sequence[ScheduledRequest],
                  paths: Sequence[Sequence[int]]) -> int:
    """Move every decode's accepted path into place (each decode named by its
    step's sequence handle); returns the number of slots moved."""
    moves = []
    for decode, path in zip(decodes, paths):
        src, dst = path_moves(decode.start, path)
        if src:
            assert decode.sequence is not None, "a decode is compacted inside its step, which issued its handle"
            moves.append((decode.sequence, src, dst))
    return runner.move_positions(moves)


def first_child_chain(parents: Sequence[int]) -> list[int]:
    """The nodes of the path that takes the first child at every level (the best
    continuation, which ``TreeBuilder`` puts first)."""
    kids = children(parents)
    path: list[int] = []
    while kids[path[-1] + 1 if path else 0]:
        path.append(kids[path[-1] + 1 if path else 0][0])
    return path


def chains_for(proposals: Proposals, rows: Sequence[int]) -> Proposals:
    """``proposals`` with the trees of decode ``rows`` cut to their first-child chain."""
    parents = proposals.parents_lists()
    if parents is None or not rows:
        return proposals
    cu = proposals.cu_num_draft_tokens.tolist()
    keep: list[int] = []
    new_parents: list[int] = []
    lens: list[int] = []
    wanted = set(rows)
    for i, par in enumerate(parents):
        nodes = first_child_chain(par) if i in wanted else list(range(len(par)))
        keep += [cu[i] + j for j in nodes]
        new_parents += [j - 1 for j in range(len(nodes))] if i in wanted else par
        lens.append(len(nodes))
    device = proposals.token_ids.device
    index = torch.tensor(keep, dtype=torch.long, device=device)
    # a node's draft probs stay with it: a sampled tree's first child is a plain draw from them
    probs = proposals.probs[index] if proposals.probs is not None else None
    return Proposals(proposals.token_ids[index], torch.tensor([0] + lens, dtype=torch.long, device=device).cumsum(0),
                     probs, torch.tensor(new_parents, dtype=torch.long, device=device))
