"""Replay a model-free proposer over recorded greedy outputs, without the model.

Greedy output does not depend on speculation, so once a workload's prompts
and outputs are known, the steps a proposer would take are determined: at
each step it drafts (with the engine's budget k, trimmed so no draft passes
the output's end), the longest prefix of the draft that equals the output is
accepted, and one more token (the target's) follows. Requests are replayed
one after another, each finished request freed (so ``suffix`` caches it) as
the engine does. The result is exact (the engine takes the same steps at
bs = 1) and independent of machine load: output tokens per step, drafts per
step, and the proposer's own time per output token (``propose`` on a
one-decode batch, tensor creation included).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import torch

from speculant.config.sampling_params import SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request, RequestStatus
from speculant.plugins.manager import get_registry


def make_proposer(name: str, options: dict[str, Any]):
    cls = get_registry().get("proposer", name)
    context = SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu")))
    return cls(cls.Options.model_validate(options), context)


def replay(name: str, options: dict[str, Any], requests: list[tuple[list[int], list[int]]], k: int) -> dict:
    """``requests``: (prompt ids, output ids) in the order they ran."""
    proposer = make_proposer(name, options)
    steps = drafted = accepted = tokens = 0
    seconds = 0.0
    for i, (prompt, out) in enumerate(requests):
        req = Request(request_id=f"r{i}", prompt=None, prompt_token_ids=list(prompt), params=SamplingParams(),
                      seed=0)
        req.token_ids = list(prompt) + out[:1]  # the prefill samples the first token
        req.status = RequestStatus.RUNNING
        n = 1
        while n < len(out):
            budget = min(k, len(out) - n - 1)
            t0 = time.perf_counter()
            draft = proposer.propose(StepBatch(decodes=[ScheduledRequest(req, 1, budget)])).token_ids.tolist()
            seconds += time.perf_counter() - t0
            ok = 0
            while ok < len(draft) and draft[ok] == out[n + ok]:
                ok += 1
            advance = min(ok + 1, len(out) - n)
            req.token_ids = req.token_ids + out[n:n + advance]
            n += advance
            steps, drafted, accepted = steps + 1, drafted + len(draft), accepted + ok
        req.status, req.finish_reason = RequestStatus.FINISHED, "length"
        proposer.free(req.request_id)
        tokens += len(out) - 1
    return {"proposer": name, "options": options, "k": k, "decode_steps": steps,
            "tokens_per_step": tokens / steps if steps else 0.0, "drafts_per_step": drafted / steps if steps else 0.0,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "propose_us_per_output_token": 1e6 * seconds / tokens if tokens else 0.0}
