"""Third-party entry points are imported only when something needs them: not
for a config of built-in plugins (speculation on or off) with an explicit
attention backend, but for a name only they provide, for ``auto`` (which
ranks every backend) and for listings."""

from __future__ import annotations

import sys

import pytest

from speculant.config.compat import build_config, config_problems
from speculant.config.models import ConfigError
from speculant.plugins import get_registry, load_plugins
from speculant.plugins.manager import ALLOW_LIST_ENV

MODULE = "lazy_probe_plugin"


@pytest.fixture
def probe(site, plugin_source):
    """An installed third-party plugin registering proposer ``probe``; it is
    imported iff ``MODULE`` is in ``sys.modules``."""
    site.add_module(MODULE, plugin_source("probe"))
    site.add_dist("probe-pkg", "1.0", {"probe": MODULE})
    sys.modules.pop(MODULE, None)
    return site


def imported() -> bool:
    return MODULE in sys.modules


def spec_config(proposer: str = "ngram", backend: str = "torch", **spec) -> dict:
    return {"model": {"path": "m", "attention_backend": backend, "device": "cpu"},
            "speculative": {"proposer": proposer, "scorer": "mqa", "acceptance": "rejection", **spec}}


def test_loading_and_builtin_lookups_import_nothing(probe):
    loaded = load_plugins()
    registry = get_registry()
    assert registry.get("proposer", "ngram").name == "ngram"
    assert registry.get("scorer", "mqa").name == "mqa" and registry.get("attention_backend", "torch").name == "torch"
    assert not imported() and not loaded.discovered


def test_builtin_speculative_config_imports_nothing(probe):
    config = build_config(spec_config())
    assert config_problems(config) == [] and not imported()


def test_engine_without_speculation_and_explicit_backend_imports_nothing(probe, llama_dir):
    from speculant import LLM, SamplingParams

    llm = LLM(str(llama_dir), attention_backend="torch", max_num_seqs=2)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    assert not imported()


def test_engine_with_builtin_speculation_imports_nothing(probe, llama_dir):
    from speculant import LLM

    LLM(str(llama_dir), attention_backend="cpu_kernel", max_num_seqs=2,
        speculative={"proposer": "ngram", "num_speculative_tokens": 2})
    assert not imported()


def test_a_third_party_name_imports_the_plugins(probe):
    config = build_config(spec_config("probe"))
    assert config.speculative.proposer == "probe" and imported()
    assert get_registry().get("proposer", "probe").__module__ == MODULE


def test_auto_backend_ranks_every_backend_so_it_discovers(probe):
    config_problems(build_config(spec_config(backend="auto")))
    assert imported()


@pytest.mark.parametrize("listing", ["names", "entries", "plugins", "errors"])
def test_listings_import_the_plugins(probe, listing):
    loaded = load_plugins()
    assert not imported()
    if listing == "names":
        assert "probe" in loaded.registry.names("proposer")
    elif listing == "entries":
        assert "probe" in [r.name for r in loaded.registry.entries("proposer")]
    elif listing == "plugins":
        assert "probe" in [p.source.entry_point for p in loaded.plugins]
    else:
        assert list(loaded.errors) == []
    assert imported() and loaded.discovered


def test_unknown_name_lists_third_party_names_too(probe):
    with pytest.raises(ConfigError) as err:
        build_config(spec_config("prob"))
    assert any("no proposer named 'prob'" in p and "did you mean 'probe'?" in p for p in err.value.problems)
    assert imported()


def test_empty_allow_list_never_imports(probe, monkeypatch):
    monkeypatch.setenv(ALLOW_LIST_ENV, "")
    registry = get_registry()
    assert "probe" not in registry.names("proposer")
    with pytest.raises(KeyError, match="no proposer named 'probe'"):
        registry.get("proposer", "probe")
    assert not imported()


def test_cli_plugins_listing_shows_the_lazy_plugin(probe, capsys):
    from speculant.cli import main

    main(["plugins"])
    assert "probe" in capsys.readouterr().out and imported()
