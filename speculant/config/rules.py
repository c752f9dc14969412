"""The capability rules: which plugin combinations are supported, and why not.

Every rule reads capability flags (never plugin names) and yields an ``Issue``:
a short form for the compatibility matrix and the full sentence for users,
naming the option, the value, the reason and the fix. ``speculant.config.compat``
re-exports these functions and adds the config-level checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from speculant.interfaces import AcceptanceMethod, AttentionBackend, Proposer, Scorer

_DRAFT_PROBS_GIVEN = {"one_hot": "only its proposed tokens", "none": "no draft probabilities"}


@dataclass(frozen=True)
class Issue:
    """One reason a combination is unsupported: a short form for the matrix
    and the full sentence for users. ``sampling_only`` issues apply only to
    requests that sample (temperature > 0), ``structured_only`` ones only to
    structured-output requests (``SamplingParams.structured``)."""

    short: str
    message: str
    sampling_only: bool = False
    structured_only: bool = False

    @property
    def per_request(self) -> bool:
        """Refuses only some requests (sampling or structured ones), not the config."""
        return self.sampling_only or self.structured_only


def backend_issues(backend_cls: type[AttentionBackend], *, enable_chunked_prefill: bool) -> list[Issue]:
    """What the attention backend cannot do for the scheduler, speculation aside."""
    b = backend_cls.name
    if enable_chunked_prefill and not backend_cls.capabilities.multi_token_queries:
        return [Issue(
            "backend lacks multi-token queries (chunked prefill)",
            f"attention backend '{b}' cannot attend from several query tokens over a cached prefix "
            f"(multi_token_queries = false), which every prefill chunk after the first does: set "
            f"scheduler.enable_chunked_prefill = false or set model.attention_backend to another backend")]
    return []


def sampling_issues(proposer_cls: type[Proposer], acceptance_cls: type[AcceptanceMethod]) -> list[Issue]:
    """Rules that only apply when a request samples (temperature > 0)."""
    p, a = proposer_cls.name, acceptance_cls.name
    pc, ac = proposer_cls.capabilities, acceptance_cls.capabilities
    issues = []
    if not ac.supports_sampling:
        issues.append(Issue(
            "greedy only: acceptance cannot sample",
            f"acceptance '{a}' handles greedy decoding only (supports_sampling = false), and this request "
            f"samples (temperature > 0): set temperature = 0 or set speculative.acceptance to a method "
            f"that supports sampling", sampling_only=True))
    if pc.draft_probs == "none" and ac.lossless and not ac.needs_draft_probs:
        # Treating undeclared draft probs as one-hot is exact only for deterministic proposals
        # (draft_probs = 'one_hot'); for sampled proposals it biases the output away from the target.
        issues.append(Issue(
            "greedy only: draft distribution unknown",
            f"proposer '{p}' does not report the distribution its proposals were drawn from "
            f"(draft_probs = 'none'), so lossless acceptance '{a}' would treat them as one-hot and the "
            f"output would no longer follow the target's distribution: set temperature = 0, set "
            f"speculative.acceptance to a method that is not lossless, or choose a proposer with "
            f"draft_probs = 'one_hot' or 'full'", sampling_only=True))
    return issues


def structured_issues(acceptance_cls: type[AcceptanceMethod]) -> list[Issue]:
    """Rules that only apply to structured-output requests."""
    if acceptance_cls.capabilities.supports_structured_output:
        return []
    a = acceptance_cls.name
    return [Issue(
        "no structured output: acceptance",
        f"acceptance '{a}' does not declare that it emits only tokens the target's (grammar-masked) "
        f"distribution allows (supports_structured_output = false), so a grammar could not be kept: leave "
        f"SamplingParams.structured / response_format unset, or set speculative.acceptance to a method "
        f"that supports structured output (rejection, typical)", structured_only=True)]


def tree_issues(proposer_cls: type[Proposer], scorer_cls: type[Scorer], acceptance_cls: type[AcceptanceMethod],
                backend_cls: type[AttentionBackend], *, tree_width: int = 2) -> list[Issue]:
    """What stops token trees (``speculative.tree_width`` > 1) in the combination."""
    p, s, a, b = proposer_cls.name, scorer_cls.name, acceptance_cls.name, backend_cls.name
    opt = f"speculative.tree_width = {tree_width}"
    fix = "set speculative.tree_width = 1 (chains)"
    issues = []
    if not proposer_cls.capabilities.proposes_trees:
        issues.append(Issue(
            "proposer proposes chains only",
            f"{opt}, but proposer '{p}' proposes chains only (proposes_trees = false), so a tree width would "
            f"change nothing: {fix} or choose a proposer that proposes trees"))
    sc = scorer_cls.capabilities
    if not sc.verifies_trees:
        issues.append(Issue(
            "scorer cannot verify trees",
            f"{opt}, but scorer '{s}' cannot verify token trees: {sc.no_trees_reason}: {fix} or set "
            "speculative.scorer to a scorer that verifies trees"))
    if not acceptance_cls.capabilities.accepts_trees:
        issues.append(Issue(
            "acceptance takes chains only",
            f"{opt}, but acceptance '{a}' decides over chains only (accepts_trees = false): {fix} or set "
            "speculative.acceptance to a method that accepts trees"))
    if not backend_cls.capabilities.tree_attention:
        issues.append(Issue(
            "backend lacks tree attention",
            f"{opt}, but attention backend '{b}' has no tree mask (tree_attention = false), so a tree node "
            f"would see its siblings: {fix} or set model.attention_backend to a backend with tree attention"))
    return issues


def combination_issues(
    proposer_cls: type[Proposer],
    scorer_cls: type[Scorer],
    acceptance_cls: type[AcceptanceMethod],
    backend_cls: type[AttentionBackend],
    *,
    enable_chunked_prefill: bool,
    num_speculative_tokens: int,
    tree_width: int = 1,
) -> list[Issue]:
    """Every issue of the combination, sampling-only ones included (flagged)."""
    p, s, a, b = proposer_cls.name, scorer_cls.name, acceptance_cls.name, backend_cls.name
    pc, sc, ac = proposer_cls.capabilities, scorer_cls.capabilities, acceptance_cls.capabilities
    issues = []
    if enable_chunked_prefill and not pc.supports_chunked_prefill:
        if pc.needs_prompt_hidden_states:
            issues.append(Issue(
                "needs hidden states at every prompt position",
                f"proposer '{p}' needs the target's hidden state at every prompt position, which chunked "
                f"prefill splits across steps: set scheduler.enable_chunked_prefill = false or choose "
                f"another proposer"))
        else:
            issues.append(Issue(
                "proposer lacks chunked prefill",
                f"proposer '{p}' does not support prompts split across steps (supports_chunked_prefill = "
                f"false): set scheduler.enable_chunked_prefill = false or choose another proposer"))
    if ac.needs_draft_probs and pc.draft_probs != "full":
        issues.append(Issue(
            f"needs full draft probs; proposer gives {pc.draft_probs}",
            f"acceptance '{a}' needs the proposer's full draft distribution, but proposer '{p}' provides "
            f"{_DRAFT_PROBS_GIVEN.get(pc.draft_probs, pc.draft_probs)} (draft_probs = '{pc.draft_probs}'): "
            f"choose a proposer with draft_probs = 'full' or set speculative.acceptance to a method "
            f"that does not need draft probabilities"))
    limit = pc.max_num_speculative_tokens
    if limit is not None and num_speculative_tokens > limit:
        issues.append(Issue(
            f"k above proposer maximum {limit}",
            f"speculative.num_speculative_tokens = {num_speculative_tokens} is above the maximum of proposer "
            f"'{p}' ({limit} tokens per step): set speculative.num_speculative_tokens to at most {limit}"))
    if sc.needs_multi_token_queries and not backend_cls.capabilities.multi_token_queries:
        issues.append(Issue(
            "backend lacks multi-token queries",
            f"scorer '{s}' needs attention over multi-token queries, which attention backend '{b}' does "
            f"not provide (multi_token_queries = false): set model.attention_backend to a backend with "
            f"multi-token queries or set speculative.scorer to one that scores single-token rows"))
    if enable_chunked_prefill and not sc.supports_mixed_prefill_decode:
        issues.append(Issue(
            "scorer cannot mix prefill and decode",
            f"scorer '{s}' cannot score prefill chunks and speculating decodes in one target forward "
            f"(supports_mixed_prefill_decode = false), which chunked prefill does every step: set "
            f"scheduler.enable_chunked_prefill = false or choose another scorer"))
    issues += backend_issues(backend_cls, enable_chunked_prefill=enable_chunked_prefill)
    if tree_width > 1:
        issues += tree_issues(proposer_cls, scorer_cls, acceptance_cls, backend_cls, tree_width=tree_width)
    return issues + sampling_issues(proposer_cls, acceptance_cls) + structured_issues(acceptance_cls)


def combination_reasons(
    proposer_cls: type[Proposer],
    scorer_cls: type[Scorer],
    acceptance_cls: type[AcceptanceMethod],
    backend_cls: type[AttentionBackend],
    *,
    enable_chunked_prefill: bool,
    num_speculative_tokens: int,
    sampling: bool,
    tree_width: int = 1,
) -> list[str]:
    """Every reason the combination is unsupported ([] when it is supported).
    ``sampling``: whether the request(s) in question sample (temperature > 0)."""
    issues = combination_issues(proposer_cls, scorer_cls, acceptance_cls, backend_cls,
                                enable_chunked_prefill=enable_chunked_prefill,
                                num_speculative_tokens=num_speculative_tokens, tree_width=tree_width)
    return [i.message for i in issues if not i.structured_only and (sampling or not i.sampling_only)]


def sampling_reasons(proposer_cls: type[Proposer], acceptance_cls: type[AcceptanceMethod]) -> list[str]:
    """Why a sampling request (temperature > 0) cannot be served by this
    proposer and acceptance method; for the engine's ``add_request``."""
    return [i.message for i in sampling_issues(proposer_cls, acceptance_cls)]


def structured_reasons(acceptance_cls: type[AcceptanceMethod]) -> list[str]:
    """Why a structured-output request cannot be served with this acceptance
    method; for the engine's ``add_request``."""
    return [i.message for i in structured_issues(acceptance_cls)]
