"""Exact output distributions of a small-vocabulary model, and the tests that
compare sampled tokens with them.

``marginals`` enumerates every continuation of a prompt (``V ** (num - 1)``
sequences in one batch through transformers) and gives the exact marginal
of each output position under a request's sampling settings, filtered by an
implementation written independently of the engine's (``filtered_probs``).
``chi_square_p`` is Pearson's goodness-of-fit test of sampled counts against
such a marginal, ``total_variation`` the distance between the empirical and
the exact distribution. The engine's lossless tests and the conformance kit
both use them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from speculant.interfaces import SamplingParams


def filtered_probs(logits: torch.Tensor,  # [..., V]
                   temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:  # [..., V]
    """The sampling distribution, written independently of the engine's code:
    temperature, then top-k, then top-p (the smallest most-likely set whose
    mass reaches top_p), then min-p (relative to the most likely token)."""
    z = logits.double() / temperature
    if top_k:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    p = z.softmax(-1)
    if top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p  # mass strictly before reaches top_p
        p = p.masked_fill(torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, drop_sorted), 0.0)
        p = p / p.sum(-1, keepdim=True)
    if min_p:
        p = p.masked_fill(p < min_p * p.max(-1, keepdim=True).values, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


@torch.no_grad()
def next_token_probs(model_dir: Path | str, seqs: torch.Tensor,  # [S, L] token ids
                     sp: SamplingParams) -> torch.Tensor:  # [S, L, V]
    """The filtered next-token distribution at every position of each sequence."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logits = torch.cat([model(chunk).logits for chunk in seqs.split(1024)])
    return filtered_probs(logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p)


def marginals(model_dir: Path | str, prompt: list[int], sp: SamplingParams, num: int,
              vocab_size: int) -> list[torch.Tensor]:
    """[m_0..m_{num-1}], each [V]: the exact marginal of output token j under ``sp``."""
    v = vocab_size
    grid = torch.cartesian_prod(*[torch.arange(v)] * (num - 1)).reshape(v ** (num - 1), num - 1)
    seqs = torch.cat([torch.tensor(prompt).expand(grid.shape[0], -1), grid], dim=1)
    probs = next_token_probs(model_dir, seqs, sp)[:, len(prompt) - 1:]  # [S, num, V]
    out, joint = [], None
    for j in range(num):
        # p(t_j | prompt, t_0..t_{j-1}) for every prefix t_0..t_{j-1}, shaped [V]*j + [V]
        # (row r of ``probs`` continues with grid[r]; position j depends on grid[r, :j] only)
        cond = probs[:, j].reshape(*[v] * (num - 1), v)[tuple([slice(None)] * j + [0] * (num - 1 - j))]
        joint = cond if joint is None else joint.unsqueeze(-1) * cond
        out.append(joint.reshape(-1, v).sum(0))
    return out


def chi_square_p(counts: torch.Tensor,  # [V] observed counts
                 probs: torch.Tensor) -> float:  # [V] expected distribution
    """Pearson chi-square goodness-of-fit p-value; cells expected < 5 pooled."""
    counts, expected = counts.double(), probs.double() * counts.sum()
    big = expected >= 5
    obs, exp = list(counts[big]), list(expected[big])
    small_obs, small_exp = counts[~big].sum(), expected[~big].sum()
    if small_exp >= 5 or not obs:
        obs.append(small_obs)
        exp.append(small_exp)
    else:  # fold the pooled rest into the smallest big cell
        i = min(range(len(exp)), key=lambda n: exp[n])
        obs[i], exp[i] = obs[i] + small_obs, exp[i] + small_exp
    obs_t, exp_t = torch.stack(obs), torch.stack(exp)
    if len(obs_t) < 2:
        return 1.0
    stat = ((obs_t - exp_t) ** 2 / exp_t).sum()
    return float(torch.special.gammaincc(torch.tensor((len(obs_t) - 1) / 2.0, dtype=torch.float64), stat / 2))


def total_variation(counts: torch.Tensor,  # [V] observed counts
                    probs: torch.Tensor) -> float:  # [V] expected distribution
    """Half the L1 distance between the empirical distribution and ``probs``."""
    return 0.5 * float((counts.double() / counts.sum() - probs.double()).abs().sum())
