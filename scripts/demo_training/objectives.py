"""Losses: next-token cross-entropy for the target; distillation for the draft.

The draft objective is ``kd_weight * T^2 * KL(p_target(T) || p_draft(T)) +
ce_weight * CE(draft, data)``, the KL taken over the full vocabulary against
the target's soft distribution computed on the same batch (the teacher runs
under no_grad, in the same precision). ``agree`` is the fraction of positions
where the draft's argmax equals the target's: the per-token greedy agreement
that speculative decoding turns into accepted tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _logits(model, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, use_cache=False).logits.float()


class LanguageModeling:
    def __call__(self, model, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        logits = _logits(model, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        return loss, {"loss": loss.item()}


class Distillation:
    def __init__(self, teacher: torch.nn.Module, kd_weight: float, ce_weight: float, temperature: float):
        self.teacher = teacher.eval().requires_grad_(False)
        self.kd_weight, self.ce_weight, self.t = kd_weight, ce_weight, temperature

    def __call__(self, model, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad():
            t_logits = _logits(self.teacher, x)
        d_logits = _logits(model, x)
        v = d_logits.size(-1)
        t_logp = F.log_softmax(t_logits / self.t, dim=-1).reshape(-1, v)
        d_logp = F.log_softmax(d_logits / self.t, dim=-1).reshape(-1, v)
        kd = F.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") * self.t ** 2
        ce = F.cross_entropy(d_logits.reshape(-1, v), y.reshape(-1))
        loss = self.kd_weight * kd + self.ce_weight * ce
        with torch.no_grad():
            agree = (d_logits.argmax(-1) == t_logits.argmax(-1)).float().mean()
            t_ce = F.cross_entropy(t_logits.reshape(-1, v), y.reshape(-1))
        return loss, {"loss": loss.item(), "kd": kd.item(), "ce": ce.item(), "agree": agree.item(),
                      "teacher_ce": t_ce.item()}
