"""EAGLE tree drafting (``proposers.eagle.tree_draft``) against the head run as a
chain: every node's distribution is the one the head gives after the node's
own path, entered one entry at a time with causal attention over the
request's cache (so the tree mask hides siblings and cousins, and each entry
sits at its depth's position). Greedy nodes' children are the most probable
tokens of that distribution; sampled nodes carry it as their draft probs and
draw distinct children; the budget and depth hold.
"""

from __future__ import annotations

import pytest
import torch

from speculant import SamplingParams
from speculant.engine.request import Request
from speculant.proposers.eagle.model import EagleHead, SeqKV, eagle_config
from speculant.proposers.eagle.tree_draft import RequestTree, build_proposals, draft_trees

H, V, TRUE = 32, 24, 7  # hidden size, vocabulary, true entries in the head's cache


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    cfg = eagle_config({"hidden_size": H, "vocab_size": V, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "intermediate_size": 48})
    head = EagleHead(cfg).eval().requires_grad_(False)
    embed, lm_head = torch.nn.Embedding(V, H), torch.nn.Linear(H, V, bias=False)
    for module in (head, embed, lm_head):
        for p in module.parameters():
            p.data.normal_(0, 0.5)  # peaked distributions: top-k differs from node to node
    return head, embed.requires_grad_(False), lm_head.requires_grad_(False)


def cache(head: EagleHead, embed) -> SeqKV:
    """A request's head cache after its catch-up: TRUE entries at positions 3 .. 3 + TRUE - 1."""
    kv = SeqKV(head.kv_heads, head.head_dim, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(V, (TRUE,), generator=gen)
    head.extend(embed(tokens), torch.randn(TRUE, H, generator=gen), torch.arange(3, 3 + TRUE), [(kv, TRUE)])
    return kv


def chain_features(head, embed, kv: SeqKV, root: torch.Tensor, path_tokens: list[int]) -> torch.Tensor:  # [H]
    """The head's feature after ``path_tokens``, entered one by one (causal) on a copy of ``kv``."""
    copy = SeqKV(head.kv_heads, head.head_dim, torch.float32, torch.device("cpu"))
    copy.append(kv.k[:TRUE], kv.v[:TRUE])
    feat = root
    for d, tok in enumerate(path_tokens):
        feat = head.extend(embed(torch.tensor([tok])), feat.unsqueeze(0), torch.tensor([3 + TRUE + d]),
                           [(copy, 1)])[0]
    return feat


def draft(parts, params: list[SamplingParams], budget: int, width: int, depth: int):
    head, embed, lm_head = parts
    kvs = [cache(head, embed) for _ in params]
    roots = torch.randn(len(params), H, generator=torch.Generator().manual_seed(2))
    requests = [Request(request_id=f"r{i}", prompt=None, prompt_token_ids=[1, 2, 3], params=p, seed=i)
                for i, p in enumerate(params)]
    trees = [RequestTree(r, kv, 3 + TRUE, budget) for r, kv in zip(requests, kvs)]
    draft_trees(head, embed, lambda f: (lm_head(f), None), V, trees, roots, width, depth)
    return kvs, roots, build_proposals(dict(enumerate(trees)), len(trees), torch.device("cpu"))


def paths_of(tokens: list[int], parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


@pytest.mark.parametrize("width, budget, depth", [(2, 6, 3), (3, 10, 4), (4, 16, 5)])
def test_greedy_nodes_are_the_heads_top_tokens_after_their_path(parts, width, budget, depth):
    head, embed, lm_head = parts
    kvs, roots, out = draft(parts, [SamplingParams(temperature=0)] * 2, budget, width, depth)
    assert out.probs is None
    for i, (tokens, parents) in enumerate(zip(out.to_lists(), out.parents_lists())):
        assert len(tokens) == budget and max(len(paths_of(tokens, parents, j)) for j in range(budget)) <= depth
        kids: dict[int, list[int]] = {}
        for j, p in enumerate(parents):
            kids.setdefault(p, []).append(tokens[j])
        assert len(kids[-1]) == width and kids[-1][0] == int(lm_head(roots[i]).argmax())
        for parent, children in kids.items():
            path = paths_of(tokens, parents, parent) if parent >= 0 else []
            logits = lm_head(chain_features(head, embed, kvs[i], roots[i], path))  # [V]
            best = logits.topk(width).indices.tolist()
            assert children == best[: len(children)], (parent, children, best)  # most probable first


def test_sampled_nodes_carry_the_heads_distribution_after_their_parent(parts):
    head, embed, lm_head = parts
    params = SamplingParams(temperature=0.8, seed=5)
    kvs, roots, out = draft(parts, [params, SamplingParams(temperature=0)], 9, 3, 3)
    tokens, parents = out.to_lists()[0], out.parents_lists()[0]
    assert out.probs is not None and len(tokens) == 9
    for j, (tok, parent) in enumerate(zip(tokens, parents)):
        path = paths_of(tokens, parents, parent) if parent >= 0 else []
        want = (lm_head(chain_features(head, embed, kvs[0], roots[0], path)) / 0.8).softmax(-1)
        torch.testing.assert_close(out.probs[j], want, rtol=1e-4, atol=1e-6)
        assert out.probs[j][tok] > 0
    for p in set(parents):  # siblings drawn without replacement: distinct
        sibs = [t for t, q in zip(tokens, parents) if q == p]
        assert len(set(sibs)) == len(sibs) <= 3
