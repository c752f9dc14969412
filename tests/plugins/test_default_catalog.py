"""Config checks and the engine sit below the plugin layer: they get the
loaded plugins through the loader ``import speculant`` installs
(``interfaces.catalog``), never by importing ``speculant.plugins``."""

from __future__ import annotations

import pytest

from speculant.config.compat import default_plugins
from speculant.interfaces import catalog
from speculant.plugins.manager import load_plugins


def test_the_default_catalog_is_the_loaded_plugins():
    loaded = default_plugins()
    assert loaded is load_plugins()
    assert "ngram" in loaded.registry.names("proposer")


def test_without_a_loader_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setattr(catalog, "_loader", None)
    with pytest.raises(RuntimeError, match=r"no plugin loader is installed, so no registry was passed and none "
                                           r"can be loaded: import speculant \(its __init__ installs the loader\), "
                                           r"or pass registry= explicitly"):
        default_plugins()


def test_an_installed_loader_is_what_callers_without_a_registry_get(monkeypatch):
    sentinel = object()
    monkeypatch.setattr(catalog, "_loader", None)
    catalog.install_default_plugins(lambda: sentinel)  # type: ignore[arg-type,return-value]
    assert default_plugins() is sentinel
