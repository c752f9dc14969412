"""Discovery through real entry points (``*.dist-info`` on ``sys.path``), the
allow-list, and broken plugins that must not stop the others."""

from __future__ import annotations

import pytest

from speculant.plugins import get_registry, hookimpl, load_plugins
from speculant.plugins.manager import (
    ALLOW_LIST_ENV,
    PluginRejected,
    discover,
    register_plugin,
    reset_plugins,
    unregister_plugin,
)
from speculant.plugins.registry import BUILTIN_PLUGIN_MODULE

BUILTIN_NAMES = {
    "proposer": ["draft_model", "draft_suffix", "eagle", "eagle_suffix", "medusa", "mlp_speculator", "ngram", "suffix"],
    "scorer": ["batch_expansion", "mqa"],
    "acceptance": ["rejection", "typical"],
    "attention_backend": ["cpu_kernel", "torch", "triton"],
}


def third_party(loaded):
    """Loaded plugins other than the built-in one, by entry-point name."""
    return {p.source.entry_point: p for p in loaded.plugins if not p.source.is_builtin}


def third_party_errors(loaded):
    return [e for e in loaded.errors if not e.source.is_builtin]


def test_builtin_entry_point_is_discovered_first(site, plugin_source):
    site.add_module("aaa_first", plugin_source("aaa_first"))
    site.add_dist("aaa-plugin", "1.0", {"aaa": "aaa_first"})
    eps, errors = discover()
    assert errors == []
    assert eps[0].value == BUILTIN_PLUGIN_MODULE
    assert eps[0].name == "builtin"
    assert eps[0].dist is not None and eps[0].dist.name == "speculant"  # our own pyproject declares it
    assert "aaa" in [ep.name for ep in eps[1:]]


def test_builtins_load_through_their_entry_point(fresh_plugins):
    """Needs the built-in modules (ngram, draft_model, mqa, ...) to exist."""
    loaded = load_plugins()
    builtin = [p for p in loaded.plugins if p.source.is_builtin]
    assert [e for e in loaded.errors if e.source.is_builtin] == []
    assert len(builtin) == 1 and loaded.plugins[0] is builtin[0]
    assert builtin[0].source.distribution == "speculant"
    assert builtin[0].source.entry_point == "builtin"
    for kind, names in BUILTIN_NAMES.items():
        assert sorted(r.name for r in builtin[0].registrations if r.kind == kind) == names


def test_example_plugin_discovered(example_installed):
    loaded = load_plugins()
    plugin = third_party(loaded)["retrieval"]
    assert plugin.source.distribution == "speculant-retrieval"
    assert plugin.source.version == "0.1.0"
    assert plugin.source.value == "speculant_retrieval.plugin"
    assert plugin.hooks == ["register_proposers"]
    assert [r.name for r in plugin.registrations] == ["retrieval"]
    cls = get_registry().get("proposer", "retrieval")
    assert cls.__module__ == "speculant_retrieval.proposer"
    assert third_party_errors(loaded) == []


def test_load_plugins_is_idempotent_and_resettable(fresh_plugins):
    first = load_plugins()
    assert load_plugins() is first
    reset_plugins()
    assert load_plugins() is not first


def test_allow_list_restricts_third_party(site, plugin_source, monkeypatch):
    for name in ("alpha", "beta"):
        site.add_module(f"{name}_plugin", plugin_source(f"{name}_proposer"))
        site.add_dist(f"{name}-pkg", "1.0", {name: f"{name}_plugin"})
    monkeypatch.setenv(ALLOW_LIST_ENV, " beta ,")
    loaded = load_plugins()
    assert sorted(third_party(loaded)) == ["beta"]
    assert get_registry().names("proposer").count("alpha_proposer") == 0
    assert "beta_proposer" in get_registry().names("proposer")
    assert any(p.source.is_builtin for p in loaded.plugins) or any(e.source.is_builtin for e in loaded.errors)


def test_empty_allow_list_loads_no_third_party(site, plugin_source, monkeypatch):
    site.add_module("gamma_plugin", plugin_source("gamma_proposer"))
    site.add_dist("gamma-pkg", "1.0", {"gamma": "gamma_plugin"})
    monkeypatch.setenv(ALLOW_LIST_ENV, "")
    assert third_party(load_plugins()) == {}


def test_allow_list_name_without_entry_point_is_reported(site, plugin_source, monkeypatch):
    site.add_module("delta_plugin", plugin_source("delta_proposer"))
    site.add_dist("delta-pkg", "1.0", {"delta": "delta_plugin"})
    monkeypatch.setenv(ALLOW_LIST_ENV, "delta,detla")
    loaded = load_plugins()
    assert sorted(third_party(loaded)) == ["delta"]
    (err,) = third_party_errors(loaded)
    assert str(err) == (
        "entry point 'detla' was not loaded: SPECULANT_PLUGINS lists it, but no installed distribution declares "
        "it in group 'speculant.plugins' (installed: delta): install the plugin or fix SPECULANT_PLUGINS")


def test_import_error_names_distribution_entry_point_and_cause(site, plugin_source):
    site.add_module("good_plugin", plugin_source("good_proposer"))
    site.add_module("broken_plugin", "import speculant_module_that_does_not_exist\n")
    site.add_dist("good-pkg", "1.0", {"good": "good_plugin"})
    site.add_dist("broken-pkg", "2.1", {"broken": "broken_plugin"})
    loaded = load_plugins()
    (err,) = third_party_errors(loaded)
    assert str(err) == (
        "entry point 'broken = broken_plugin' of distribution broken-pkg 2.1 was not loaded: import failed: "
        "ModuleNotFoundError: No module named 'speculant_module_that_does_not_exist'")
    assert "good" in third_party(loaded)
    assert "good_proposer" in get_registry().names("proposer")


def test_duplicate_name_rejects_the_later_plugin(site, plugin_source):
    site.add_module("first_plugin", plugin_source("shared_name"))
    site.add_module("second_plugin", plugin_source("shared_name"))
    site.add_module("other_plugin", plugin_source("other_name"))
    site.add_dist("aa-first", "1.0", {"aa_first": "first_plugin"})
    site.add_dist("zz-second", "1.0", {"zz_second": "second_plugin"})
    site.add_dist("mm-other", "1.0", {"mm_other": "other_plugin"})
    loaded = load_plugins()
    errors = third_party_errors(loaded)
    assert len(errors) == 1
    err = errors[0]
    # entry points come in discovery order; whichever came second is the one refused
    loser, winner = (("zz-second", "aa-first") if err.source.distribution == "zz-second"
                     else ("aa-first", "zz-second"))
    assert err.source.distribution == loser
    assert "proposer name 'shared_name'" in err.cause
    assert "is already registered by entry point" in err.cause and f"of distribution {winner} 1.0" in err.cause
    assert sorted(third_party(loaded)) == sorted({"aa_first", "zz_second"} - {err.source.entry_point} | {"mm_other"})
    assert {"shared_name", "other_name"} <= set(get_registry().names("proposer"))


def test_misspelled_hook_is_an_error(site, plugin_source):
    site.add_module("typo_plugin", plugin_source("typo_proposer", hook="register_proposer"))
    site.add_module("fine_plugin", plugin_source("fine_proposer"))
    site.add_dist("typo-pkg", "0.3", {"typo": "typo_plugin"})
    site.add_dist("fine-pkg", "1.0", {"fine": "fine_plugin"})
    loaded = load_plugins()
    (err,) = third_party_errors(loaded)
    assert err.source.distribution == "typo-pkg" and err.source.entry_point == "typo"
    assert "it implements unknown hook 'register_proposer' (did you mean 'register_proposers'?)" in err.cause
    assert "typo_proposer" not in get_registry().names("proposer")
    assert "fine_proposer" in get_registry().names("proposer")
    assert "typo" not in third_party(loaded)


def test_plugin_without_hooks_is_an_error(site):
    site.add_module("empty_plugin", "def register_proposers(register):\n    pass\n")  # @hookimpl forgotten
    site.add_dist("empty-pkg", "1.0", {"empty": "empty_plugin"})
    (err,) = third_party_errors(load_plugins())
    assert "implements no speculant hook" in err.cause
    assert "speculant.plugins.hookimpl" in err.cause


def test_hook_that_raises_is_reported(site):
    site.add_module("raising_plugin", """
        from speculant.plugins import hookimpl

        @hookimpl
        def register_scorers(register):
            raise RuntimeError("no GPU here")
    """)
    site.add_dist("raising-pkg", "1.0", {"raising": "raising_plugin"})
    (err,) = third_party_errors(load_plugins())
    assert err.cause == "hook register_scorers raised RuntimeError: no GPU here"


def test_invalid_class_rejects_whole_plugin(site):
    site.add_module("mixed_plugin", """
        from speculant.plugin_api import Proposals, Proposer, hookimpl

        class Good(Proposer):
            name = "mixed_good"
            api_version = "3.0"
            def propose(self, batch):
                return Proposals.from_lists([])

        class Nameless(Proposer):
            api_version = "3.0"
            def propose(self, batch):
                return Proposals.from_lists([])

        @hookimpl
        def register_proposers(register):
            register(Good)
            register(Nameless)
    """)
    site.add_dist("mixed-pkg", "1.0", {"mixed": "mixed_plugin"})
    loaded = load_plugins()
    (err,) = third_party_errors(loaded)
    assert "Nameless.name = None: must be a non-empty string" in err.cause
    assert "mixed_good" not in get_registry().names("proposer")  # all or nothing
    assert "mixed" not in third_party(loaded)


def test_register_plugin_in_process(fresh_plugins, make_class):
    cls = make_class("proposer", "inproc")

    class Plugin:
        @hookimpl
        def register_proposers(self, register):
            register(cls)

    info = register_plugin(Plugin(), "inproc-plugin")
    try:
        assert info.source.describe() == "plugin 'inproc-plugin' (registered in this process)"
        assert get_registry().get("proposer", "inproc") is cls
        with pytest.raises(PluginRejected,
                           match="proposer name 'inproc'.*is already registered by plugin 'inproc-plugin'"):
            register_plugin(Plugin(), "again")
    finally:
        unregister_plugin("inproc-plugin")
    assert "inproc" not in get_registry().names("proposer")


def test_hook_may_take_fewer_arguments(fresh_plugins):
    class Plugin:
        @hookimpl
        def register_scorers(self):
            pass

    info = register_plugin(Plugin(), "no-args")
    try:
        assert info.hooks == ["register_scorers"] and info.registrations == []
    finally:
        unregister_plugin("no-args")


def test_plugin_asking_for_registry_at_import_is_reported(site):
    site.add_module("eager_plugin", "from speculant.plugins import get_registry\nget_registry()\n")
    site.add_dist("eager-pkg", "1.0", {"eager": "eager_plugin"})
    (err,) = third_party_errors(load_plugins())
    assert err.cause.startswith("import failed: RuntimeError: plugins asked for the registry while plugins are "
                                "loading")
