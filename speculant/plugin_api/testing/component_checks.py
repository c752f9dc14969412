"""The conformance checks of a scorer and of an acceptance method.

A scorer runs the target over the step's batch, so the engine's output with
it must equal the engine's without speculation: greedy, token for token,
under every schedule (with the built-in ``ngram`` proposer feeding it
proposals), and sampled, by the chi-square test against the exact marginal.

An acceptance method is first called directly on made-up logits: for greedy
rows it must keep exactly the proposals equal to the target's argmax and
emit the argmax after them, in the ``AcceptedTokens`` layout. Then it runs
in the engine: greedy equality as for a scorer, and, when it declares
``lossless`` and ``supports_sampling``, the chi-square test (with a draft
model when it needs the full draft distribution).
"""

from __future__ import annotations

from typing import Any

import torch

from speculant.interfaces import PLACEHOLDER_TOKEN_ID, AcceptanceMethod, Scorer
from speculant.plugin_api.testing import runs
from speculant.plugin_api.testing.runs import GREEDY, SCHEDULES, ConformanceError, check_same, check_sampled
from speculant.plugin_api.testing.tiny_model import VOCAB_SIZE, TinyModels

REPETITIVE = (6, 13, 21, 29)


def repetitive_prompts(vocab_size: int) -> list[list[int]]:
    """Prompts that repeat a short pattern, so the n-gram proposer proposes often."""
    base = runs.prompts((4, 5, 3, 6), vocab_size, seed=3)
    return [(b * 8)[:n] for b, n in zip(base, REPETITIVE)]


def check_greedy_with(spec: dict[str, Any], models: TinyModels, what: str) -> int:
    """Greedy equality under every schedule; returns the proposals verified."""
    texts = repetitive_prompts(VOCAB_SIZE) + runs.prompts((9, 17), VOCAB_SIZE)
    verified = 0
    for schedule in SCHEDULES:
        want = runs.token_ids(runs.engine(models.text, None, schedule.settings), texts, GREEDY)
        llm = runs.engine(models.text, spec, schedule.settings)
        check_same(runs.token_ids(llm, texts, GREEDY), want,
                   f"greedy output with {what} differs from the engine without speculation ({schedule.name})")
        verified += int(llm.get_metrics()["num_draft_tokens"])
    if verified == 0:
        raise ConformanceError(f"no proposal was verified with {what}: the check proved nothing")
    return verified


def check_scorer(scorer: type[Scorer], models: TinyModels) -> dict[str, Any]:
    with runs.registered("scorer", scorer) as name:
        spec = {"proposer": "ngram", "scorer": name, "num_speculative_tokens": 3}
        verified = check_greedy_with(spec, models, f"scorer {name!r}")
        p_values, _ = check_sampled({**spec, "num_speculative_tokens": 2}, models, f"scorer {name!r}")
    return {"num_draft_tokens": verified, "p_values": p_values}


def check_accept_unit(method: type[AcceptanceMethod], options: dict[str, Any] | None = None) -> None:
    """Greedy semantics on made-up logits: two decodes, proposals [3, 5, 7] and [2]."""
    vocab = 10
    argmax = [[3, 5, 9, 4], [1, 6]]  # target argmax after each prefix: decode 0 keeps 3, 5 and emits 9
    rows = [torch.nn.functional.one_hot(torch.tensor(a), vocab).float() * 8 for a in argmax]
    logprobs = torch.cat(rows).log_softmax(-1)  # [2 + 4, V]
    drafts = torch.tensor([3, 5, 7, 2])
    cu = torch.tensor([0, 3, 4])
    greedy = torch.tensor([True, True])
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    instance = method(method.Options(**(options or {})))
    out = instance.accept(logprobs, drafts, cu, None, greedy, gens)
    got_n = out.num_accepted.tolist()
    if got_n != [2, 0]:
        raise ConformanceError(f"greedy acceptance kept {got_n} proposals, expected [2, 0] (proposals that "
                               "equal the target's argmax, up to the first that does not)")
    ids = out.token_ids.tolist()
    want = [[3, 5, 9, PLACEHOLDER_TOKEN_ID], [1, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]]
    if ids != want:
        raise ConformanceError(f"greedy acceptance emitted {ids}, expected {want} (kept proposals, then the "
                               f"argmax, then PLACEHOLDER_TOKEN_ID)")


def check_acceptance(method: type[AcceptanceMethod], models: TinyModels,
                     options: dict[str, Any] | None = None) -> dict[str, Any]:
    caps = method.capabilities
    check_accept_unit(method, options)
    report: dict[str, Any] = {}
    with runs.registered("acceptance", method) as name:
        extra = {"acceptance": name, "acceptance_options": options or {}}
        if not caps.needs_draft_probs:
            report["num_draft_tokens"] = check_greedy_with(
                {"proposer": "ngram", "num_speculative_tokens": 3, **extra}, models, f"acceptance {name!r}")
        if caps.lossless and caps.supports_sampling:
            spec = {"proposer": "draft_model", "proposer_options": {"model": str(models.small_draft)},
                    "num_speculative_tokens": 2, **extra} if caps.needs_draft_probs else \
                {"proposer": "ngram", "num_speculative_tokens": 2, **extra}
            report["p_values"], report["total_variations"] = check_sampled(spec, models, f"acceptance {name!r}")
    return report
