"""Acceptance over token trees (``Proposals.parents``), greedy and sampled.

Vocabulary, per decode with a tree of n nodes (``interfaces.tree``): span row
0 is the decode's last token (the root), row 1 + j is node j; the target's
row r gives the distribution of the token after row r's path.

- Greedy: from the root, follow the child whose token is the target's argmax
  at the current row; where no child matches, emit the argmax. So the path is
  the longest one the target's greedy decoding would have produced.
- Sampling (multi-candidate rejection, as SpecInfer and EAGLE-2 verify trees;
  the recursive form of Jeon et al. for siblings drawn without replacement):
  at the current row the residual r starts as the target distribution p; its
  children are tried in node order. Child c (token x_c) was drawn from q_c,
  its draft distribution (``Proposals.probs``) without the tokens of its
  earlier siblings, renormalised; it is accepted with probability
  min(1, r(x_c) / q_c(x_c)) (r normalised). A rejection sets r to
  max(0, r - q_c) renormalised, which is zero at x_c. Each try is one
  rejection-sampling step whose fallback is the next try, so the token that
  comes out follows p exactly. One-hot drafts (no ``probs``: ngram, suffix)
  are the case q_c = δ(x_c): accept with probability r(x_c), and a rejection
  removes x_c from r. An accepted child becomes the current row; when every
  child is rejected, the emitted token is drawn from r (p itself at a leaf:
  the bonus token).

Random draws (the reproducibility contract): a sampling decode with n nodes
draws ``n + 1`` uniforms once per step from its generator: u_j decides node j
(each node is tried at most once), u_n picks the emitted token by inverting
the cumulative distribution. Greedy decodes draw nothing.
"""

from __future__ import annotations

import torch

from speculant.interfaces import AcceptedTokens, Proposals
from speculant.interfaces.data import PLACEHOLDER_TOKEN_ID
from speculant.interfaces.tree import children
from speculant.sampling.sampler import draw_uniforms, sample_from_probs


def greedy_tree_path(argmax: list[int],  # [1 + n]: the target's argmax at each span row
                     tokens: list[int], parents: list[int]) -> tuple[list[int], int]:
    """(the accepted nodes, root's child first; the emitted token)."""
    kids = children(parents)
    path: list[int] = []
    row = 0
    while True:
        want = argmax[row]
        nxt = next((j for j in kids[row] if tokens[j] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        row = nxt + 1


def sampled_tree_path(probs: torch.Tensor,  # [1 + n, V] float64 target distributions at the span rows
                      tokens: list[int], parents: list[int],
                      uniforms: list[float],  # [n + 1]
                      draft_probs: torch.Tensor | None = None,  # [n, V] each node's draft distribution; None: one-hot
                      ) -> tuple[list[int], int]:
    """(the accepted nodes, root's child first; the emitted token), module docstring's scheme."""
    kids = children(parents)
    path: list[int] = []
    row = 0
    while True:
        residual = probs[row].clone()  # [V]
        chosen = None
        tried: list[int] = []  # tokens of the rejected siblings
        for j in kids[row]:
            mass = float(residual.sum())
            if not mass > 0:
                break
            if draft_probs is None:
                if uniforms[j] * mass < float(residual[tokens[j]]):
                    chosen = j
                    break
                residual[tokens[j]] = 0.0
                continue
            q = draft_probs[j].double().clone()  # [V]
            q[tried] = 0.0
            q_mass = float(q.sum())
            if not q_mass > 0:  # no draw could have given x_j: nothing more to try here
                break
            # u < (r(x)/R) / (q(x)/Q) without dividing: q(x) = 0 accepts iff r(x) > 0
            if uniforms[j] * float(q[tokens[j]]) * mass < float(residual[tokens[j]]) * q_mass:
                chosen = j
                break
            residual = (residual / mass - q / q_mass).clamp_min(0.0)
            residual[tokens[j]] = 0.0  # exactly: rejection happens only where r(x) < q(x)
            tried.append(tokens[j])
        if chosen is None:
            dist = residual if float(residual.sum()) > 0 else probs[row]
            final = sample_from_probs(dist.unsqueeze(0), torch.tensor([uniforms[len(tokens)]], dtype=torch.float64))
            return path, int(final[0])
        path.append(chosen)
        row = chosen + 1


def tree_accept(target_logprobs: torch.Tensor,  # [n_dec + T, V] filtered target log-probs (Scores' rows)
                proposals: Proposals,  # with parents
                greedy: torch.Tensor,  # [n_dec] bool
                generators: list[torch.Generator]) -> AcceptedTokens:
    """Each decode's path through its tree and the token after it."""
    parents = proposals.parents_lists()
    assert parents is not None, "tree_accept needs Proposals.parents"
    tokens = proposals.to_lists()
    cu = proposals.cu_num_logits().tolist()
    cu_draft = proposals.cu_num_draft_tokens.tolist()
    is_greedy = greedy.tolist()
    sampling = [i for i, g in enumerate(is_greedy) if not g]
    drawn = draw_uniforms([generators[i] for i in sampling], [len(tokens[i]) + 1 for i in sampling],
                          torch.device("cpu")).tolist()
    argmax = target_logprobs.argmax(dim=-1).tolist() if any(is_greedy) else []
    paths, finals, at = [], [], 0
    for i, (toks, par) in enumerate(zip(tokens, parents)):
        rows = slice(cu[i], cu[i + 1])
        if is_greedy[i]:
            path, final = greedy_tree_path(argmax[rows], toks, par)
        else:
            uniforms, at = drawn[at: at + len(toks) + 1], at + len(toks) + 1
            q = proposals.probs[cu_draft[i]: cu_draft[i + 1]] if proposals.probs is not None else None  # [n_i, V]
            path, final = sampled_tree_path(target_logprobs[rows].double().exp(), toks, par, uniforms, q)
        paths.append(path)
        finals.append(final)
    return assemble_paths(tokens, paths, finals, target_logprobs.device)


def assemble_paths(tokens: list[list[int]], paths: list[list[int]], finals: list[int],
                   device: torch.device) -> AcceptedTokens:
    """``AcceptedTokens`` of the accepted paths: each row the path's tokens then the emitted one."""
    width = max((len(p) for p in paths), default=0) + 1
    rows = [[tokens[i][j] for j in path] + [final] for i, (path, final) in enumerate(zip(paths, finals))]
    padded = [row + [PLACEHOLDER_TOKEN_ID] * (width - len(row)) for row in rows]
    return AcceptedTokens(token_ids=torch.tensor(padded, dtype=torch.long, device=device).view(len(rows), width),
                          num_accepted=torch.tensor([len(p) for p in paths], dtype=torch.long, device=device),
                          paths=paths)


def greedy_tree_accept(target_logits: torch.Tensor,  # [n_dec + T, V] raw target logits
                       proposals: Proposals) -> AcceptedTokens:
    """Greedy verification of trees on the raw logits' argmax (every method's greedy rule)."""
    parents = proposals.parents_lists()
    assert parents is not None, "greedy_tree_accept needs Proposals.parents"
    tokens = proposals.to_lists()
    cu = proposals.cu_num_logits().tolist()
    argmax = target_logits.argmax(dim=-1).tolist()
    walked = [greedy_tree_path(argmax[cu[i]: cu[i + 1]], toks, par)
              for i, (toks, par) in enumerate(zip(tokens, parents))]
    return assemble_paths(tokens, [p for p, _ in walked], [f for _, f in walked], target_logits.device)
