"""The checker: one test per rejection rule with its exact text, and config
validation (names, options, the proposer's own checks) built on it."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field

from speculant.config.compat import (
    combination_reasons,
    config_problems,
    resolve_attention_backend_name,
    sampling_reasons,
    validate_config,
)
from speculant.config.models import ConfigError, EngineConfig
from speculant.plugins import manager


def classes(make_class, proposer=None, scorer=None, acceptance=None, backend=None):
    """(proposer, scorer, acceptance, backend) fakes; each kind's caps as a dict."""
    return (make_class("proposer", "medusa", **(proposer or {})),
            make_class("scorer", "mqa", **(scorer or {})),
            make_class("acceptance", "rejection", **(acceptance or {})),
            make_class("attention_backend", "paged", **(backend or {})))


RULES = [
    pytest.param(
        dict(proposer=dict(needs_target_hidden_states=True,
                           needs_prompt_hidden_states=True, supports_chunked_prefill=False)),
        dict(enable_chunked_prefill=True),
        "proposer 'medusa' needs the target's hidden state at every prompt position, which chunked prefill "
        "splits across steps: set scheduler.enable_chunked_prefill = false or choose another proposer",
        id="hidden-state proposer under chunked prefill"),
    pytest.param(
        dict(proposer=dict(supports_chunked_prefill=False)),
        dict(enable_chunked_prefill=True),
        "proposer 'medusa' does not support prompts split across steps (supports_chunked_prefill = false): "
        "set scheduler.enable_chunked_prefill = false or choose another proposer",
        id="proposer without chunked prefill"),
    pytest.param(
        dict(proposer=dict(draft_probs="none"), acceptance=dict(needs_draft_probs=True)),
        dict(),
        "acceptance 'rejection' needs the proposer's full draft distribution, but proposer 'medusa' provides "
        "no draft probabilities (draft_probs = 'none'): choose a proposer with draft_probs = 'full' or set "
        "speculative.acceptance to a method that does not need draft probabilities",
        id="draft probs needed, none given"),
    pytest.param(
        dict(proposer=dict(draft_probs="one_hot"), acceptance=dict(needs_draft_probs=True)),
        dict(),
        "acceptance 'rejection' needs the proposer's full draft distribution, but proposer 'medusa' provides "
        "only its proposed tokens (draft_probs = 'one_hot'): choose a proposer with draft_probs = 'full' or "
        "set speculative.acceptance to a method that does not need draft probabilities",
        id="draft probs needed, one-hot given"),
    pytest.param(
        dict(proposer=dict(max_num_speculative_tokens=3)),
        dict(num_speculative_tokens=5),
        "speculative.num_speculative_tokens = 5 is above the maximum of proposer 'medusa' (3 tokens per step): "
        "set speculative.num_speculative_tokens to at most 3",
        id="k above proposer max"),
    pytest.param(
        dict(scorer=dict(needs_multi_token_queries=True), backend=dict(multi_token_queries=False)),
        dict(enable_chunked_prefill=False),
        "scorer 'mqa' needs attention over multi-token queries, which attention backend 'paged' does not "
        "provide (multi_token_queries = false): set model.attention_backend to a backend with multi-token "
        "queries or set speculative.scorer to one that scores single-token rows",
        id="multi-token scorer on single-token backend"),
    pytest.param(
        dict(scorer=dict(supports_mixed_prefill_decode=False)),
        dict(enable_chunked_prefill=True),
        "scorer 'mqa' cannot score prefill chunks and speculating decodes in one target forward "
        "(supports_mixed_prefill_decode = false), which chunked prefill does every step: set "
        "scheduler.enable_chunked_prefill = false or choose another scorer",
        id="scorer that cannot mix under chunked prefill"),
    pytest.param(
        dict(backend=dict(multi_token_queries=False)),
        dict(enable_chunked_prefill=True),
        "attention backend 'paged' cannot attend from several query tokens over a cached prefix "
        "(multi_token_queries = false), which every prefill chunk after the first does: set "
        "scheduler.enable_chunked_prefill = false or set model.attention_backend to another backend",
        id="chunked prefill on single-token backend"),
    pytest.param(
        dict(acceptance=dict(supports_sampling=False)),
        dict(sampling=True),
        "acceptance 'rejection' handles greedy decoding only (supports_sampling = false), and this request "
        "samples (temperature > 0): set temperature = 0 or set speculative.acceptance to a method that "
        "supports sampling",
        id="greedy-only acceptance when sampling"),
    pytest.param(
        dict(proposer=dict(draft_probs="none"), acceptance=dict(lossless=True)),
        dict(sampling=True),
        "proposer 'medusa' does not report the distribution its proposals were drawn from (draft_probs = "
        "'none'), so lossless acceptance 'rejection' would treat them as one-hot and the output would no "
        "longer follow the target's distribution: set temperature = 0, set speculative.acceptance to a "
        "method that is not lossless, or choose a proposer with draft_probs = 'one_hot' or 'full'",
        id="undeclared draft distribution under lossless sampling"),
]


def check(make_class, caps, settings):
    p, s, a, b = classes(make_class, **caps)
    kwargs = dict(enable_chunked_prefill=False, num_speculative_tokens=2, sampling=False) | settings
    return combination_reasons(p, s, a, b, **kwargs)


@pytest.mark.parametrize("caps, settings, reason", RULES)
def test_rule_reason_text(make_class, caps, settings, reason):
    assert check(make_class, caps, settings) == [reason]


NEAR_MISSES = [
    pytest.param(dict(proposer=dict(needs_target_hidden_states=True,
                                    needs_prompt_hidden_states=True, supports_chunked_prefill=False)),
                 dict(enable_chunked_prefill=False), id="hidden-state proposer, chunked prefill off"),
    pytest.param(dict(proposer=dict(needs_target_hidden_states=True, supports_chunked_prefill=True)),
                 dict(enable_chunked_prefill=True), id="hidden-state proposer that handles chunks"),
    pytest.param(dict(proposer=dict(needs_target_hidden_states=True, needs_prompt_hidden_states=True,
                                    supports_chunked_prefill=True)),
                 dict(enable_chunked_prefill=True), id="every-position hidden states, chunk by chunk (eagle)"),
    pytest.param(dict(proposer=dict(draft_probs="full"), acceptance=dict(needs_draft_probs=True)),
                 dict(sampling=True), id="draft probs needed and given"),
    pytest.param(dict(proposer=dict(max_num_speculative_tokens=3)),
                 dict(num_speculative_tokens=3), id="k at proposer max"),
    pytest.param(dict(scorer=dict(needs_multi_token_queries=False), backend=dict(multi_token_queries=False)),
                 dict(enable_chunked_prefill=False), id="single-token scorer on single-token backend"),
    pytest.param(dict(scorer=dict(supports_mixed_prefill_decode=False)),
                 dict(enable_chunked_prefill=False), id="non-mixing scorer, chunked prefill off"),
    pytest.param(dict(acceptance=dict(supports_sampling=False)),
                 dict(sampling=False), id="greedy-only acceptance, greedy request"),
    pytest.param(dict(proposer=dict(draft_probs="none"), acceptance=dict(lossless=False)),
                 dict(sampling=True), id="undeclared draft distribution, lossy acceptance"),
    pytest.param(dict(proposer=dict(draft_probs="one_hot"), acceptance=dict(lossless=True)),
                 dict(sampling=True), id="deterministic proposals are exact one-hot draws"),
]


@pytest.mark.parametrize("caps, settings", NEAR_MISSES)
def test_near_misses_are_supported(make_class, caps, settings):
    assert check(make_class, caps, settings) == []


def test_every_reason_is_reported(make_class):
    caps = dict(proposer=dict(needs_target_hidden_states=True,
                              needs_prompt_hidden_states=True, supports_chunked_prefill=False,
                              draft_probs="none", max_num_speculative_tokens=2),
                acceptance=dict(needs_draft_probs=True),
                scorer=dict(needs_multi_token_queries=True), backend=dict(multi_token_queries=False))
    reasons = check(make_class, caps, dict(enable_chunked_prefill=True, num_speculative_tokens=4))
    assert len(reasons) == 5


def test_sampling_reasons_matches_sampling_rules(make_class):
    p, _, a, _ = classes(make_class, proposer=dict(draft_probs="none"), acceptance=dict(supports_sampling=False))
    assert len(sampling_reasons(p, a)) == 2
    assert all("temperature = 0" in r for r in sampling_reasons(p, a))


# ---- config validation -------------------------------------------------------------------------


class LookupOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_n: int = Field(default=4, ge=1)
    min_n: int = 1


@pytest.fixture
def registry(make_class, make_registry):
    class Checked(make_class("proposer", "t_checked")):
        @classmethod
        def validate_against(cls, options, config):
            return [f"speculative.proposer_options: t_checked refuses model {config.model.path!r}"]

    return make_registry(
        proposer=[make_class("proposer", "t_lookup", options=LookupOptions),
                  make_class("proposer", "t_heads", needs_target_hidden_states=True,
                             needs_prompt_hidden_states=True, supports_chunked_prefill=False),
                  Checked],
        scorer=[make_class("scorer", "t_mqa")],
        acceptance=[make_class("acceptance", "t_exact"), make_class("acceptance", "t_greedy", supports_sampling=False)],
        attention_backend=[make_class("attention_backend", "torch"),
                           make_class("attention_backend", "t_gpu_only", devices=("cuda",))],
    )


def config(**speculative):
    spec = {"proposer": "t_lookup", "scorer": "t_mqa", "acceptance": "t_exact"} | speculative
    return EngineConfig.model_validate({"model": {"path": "m", "device": "cpu"}, "speculative": spec})


def test_supported_config_has_no_problems(registry):
    assert config_problems(config(), registry) == []


def test_unknown_proposer_lists_available(registry):
    assert config_problems(config(proposer="ngarm"), registry) == [
        "speculative.proposer = 'ngarm': no proposer named 'ngarm'; available: t_checked, t_heads, t_lookup. "
        "Set speculative.proposer to one of them, or install and enable the plugin that provides it "
        "(`speculant plugins` lists what loaded)"]


def test_unknown_names_all_reported(registry):
    problems = config_problems(config(scorer="nope", acceptance="t_exakt"), registry)
    assert [p.split(":")[0] for p in problems] == ["speculative.scorer = 'nope'", "speculative.acceptance = 't_exakt'"]
    assert "(did you mean 't_exact'?)" in problems[1]


def test_proposer_option_typo_names_key_path_and_allowed_keys(registry):
    assert config_problems(config(proposer_options={"max_nn": 3}), registry) == [
        "speculative.proposer_options.max_nn: unknown key; allowed keys: max_n, min_n"]


def test_proposer_option_bad_value(registry):
    (problem,) = config_problems(config(proposer_options={"max_n": 0}), registry)
    assert problem.startswith("speculative.proposer_options.max_n = 0: Input should be greater than or equal to 1")


def test_options_for_a_plugin_without_options(registry):
    assert config_problems(config(acceptance_options={"posterior_threshold": 0.1}), registry) == [
        "speculative.acceptance_options = {'posterior_threshold': 0.1}: acceptance 't_exact' takes no options: "
        "remove speculative.acceptance_options"]


def test_proposer_validate_against_is_called(registry):
    assert config_problems(config(proposer="t_checked"), registry) == [
        "speculative.proposer_options: t_checked refuses model 'm'"]


def test_combination_reason_reaches_config(registry):
    (problem,) = config_problems(config(proposer="t_heads"), registry)
    assert problem.startswith("proposer 't_heads' needs the target's hidden state at every prompt position")


def test_sampling_only_rules_wait_for_requests(registry):
    cfg = config(acceptance="t_greedy")
    assert config_problems(cfg, registry) == []
    (problem,) = config_problems(cfg, registry, sampling=True)
    assert problem.startswith("acceptance 't_greedy' handles greedy decoding only")


def test_auto_backend_resolves_by_device_and_priority(registry, make_class, make_registry):
    cfg = config()
    assert cfg.model.attention_backend == "auto" and resolve_attention_backend_name(cfg, registry) == "torch"
    fast = make_class("attention_backend", "fast", priority=10)
    cpu_only_fast = make_registry(attention_backend=[make_class("attention_backend", "torch"), fast])
    assert resolve_attention_backend_name(cfg, cpu_only_fast) == "fast"


def test_auto_backend_with_none_for_the_device(registry):
    missing = registry.filtered(lambda r: r.name != "torch")
    assert config_problems(config(), missing) == [
        "model.attention_backend = 'auto': no registered attention backend runs on cpu (registered: t_gpu_only): "
        "install a plugin that provides one or set model.device to another device"]


def test_backend_device_checked(registry):
    cfg = config()
    cfg.model.attention_backend = "t_gpu_only"
    assert config_problems(cfg, registry) == [
        "model.attention_backend = 't_gpu_only' runs on cuda only, but model.device resolves to 'cpu': set "
        "model.device to one of those or choose another backend"]


def test_speculation_off_needs_no_plugins(fresh_plugins):
    cfg = EngineConfig.model_validate({"model": {"path": "m"}})
    assert config_problems(cfg) == []
    assert manager._loaded is None  # nothing was loaded to decide that


def test_validate_config_raises_with_all_problems(registry):
    with pytest.raises(ConfigError) as info:
        validate_config(config(proposer="ngarm", scorer="nope"), registry, source="engine.toml")
    assert info.value.source == "engine.toml"
    assert len(info.value.problems) == 2
    assert str(info.value).startswith("invalid configuration in engine.toml:\n  - speculative.proposer = 'ngarm'")


# ---- the default k: a ceiling of 8 under the adaptive policy, 4 under fixed ---------------------


def test_an_unset_k_follows_the_policy_and_a_set_one_is_kept():
    def k(**spec):
        return EngineConfig.model_validate({"model": {"path": "m"}, "speculative": spec}).speculative \
            .num_speculative_tokens

    assert (k(), k(draft_length={"policy": "fixed"}), k(num_speculative_tokens=3)) == (8, 4, 3)
    assert k(num_speculative_tokens=8, draft_length={"policy": "fixed"}) == 8


@pytest.fixture
def limited(make_class, make_registry):
    class Heads(make_class("proposer", "t_three", max_num_speculative_tokens=5)):
        @classmethod
        def max_tokens_for(cls, options, config):
            return 3  # e.g. the number of heads its checkpoint holds

        @classmethod
        def validate_against(cls, options, config):
            k = config.speculative.num_speculative_tokens
            return [] if k <= 3 else [f"speculative.num_speculative_tokens = {k}: the heads predict at most 3"]

    return make_registry(proposer=[Heads, make_class("proposer", "t_five", max_num_speculative_tokens=5)],
                         scorer=[make_class("scorer", "t_mqa")], acceptance=[make_class("acceptance", "t_exact")],
                         attention_backend=[make_class("attention_backend", "torch")])


@pytest.mark.parametrize("proposer,resolved", [("t_five", 5), ("t_three", 3)])
def test_an_unset_k_is_lowered_to_what_the_proposer_can_give(limited, proposer, resolved):
    cfg = config(proposer=proposer)
    assert config_problems(cfg, limited) == []
    assert validate_config(cfg, limited).speculative.num_speculative_tokens == resolved
    assert validate_config(config(proposer=proposer, num_speculative_tokens=2), limited) \
        .speculative.num_speculative_tokens == 2


def test_a_set_k_above_the_proposer_maximum_is_still_refused(limited):
    assert config_problems(config(proposer="t_five", num_speculative_tokens=8), limited) == [
        "speculative.num_speculative_tokens = 8 is above the maximum of proposer 't_five' (5 tokens per step): "
        "set speculative.num_speculative_tokens to at most 5"]
    assert config_problems(config(proposer="t_three", num_speculative_tokens=4), limited) == [
        "speculative.num_speculative_tokens = 4: the heads predict at most 3"]
