"""What the layers below the plugins know of them: a catalog of plugin
classes by kind and name, and where the default one comes from.

The layers run, bottom up: interfaces -> sampling -> config -> model ->
engine -> plugins -> built-ins -> front ends. Config checks and the engine
need the registered classes, but ``speculant.plugins`` sits above them (its
manager loads the built-ins, which import config and sampling), so they never
import it. They take a ``PluginCatalog`` handed in (``speculant.plugins``'
``Registry`` is one), and where a caller passes none they ask
``default_plugins()``, which calls the loader that the package installs at
``import speculant`` (``install_default_plugins``; the loader imports the
plugin layer on first use).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from speculant.interfaces.kinds import Kind


class PluginCatalog(Protocol):
    """Registered plugin classes by kind and name (``speculant.plugins.registry.Registry``)."""

    def get(self, kind: Kind, name: str) -> type[Any]:
        """The class registered as ``name``; an ``UnknownPluginError`` listing what is available if none."""
        ...

    def names(self, kind: Kind) -> list[str]:
        """The names registered for ``kind``, sorted."""
        ...

    def filtered(self, keep: Callable[[Any], bool]) -> PluginCatalog:
        """The registrations ``keep`` accepts, as a catalog of their own."""
        ...


class LoadedCatalog(Protocol):
    """The loaded plugins: their catalog and the errors of those that failed to load."""

    @property
    def registry(self) -> PluginCatalog: ...

    @property
    def errors(self) -> Sequence[object]: ...


_loader: Callable[[], LoadedCatalog] | None = None


def install_default_plugins(loader: Callable[[], LoadedCatalog]) -> None:
    """Set where ``default_plugins`` gets the loaded plugins (``import speculant`` does, once)."""
    global _loader
    _loader = loader


def default_plugins() -> LoadedCatalog:
    """The loaded plugins, for callers that passed no catalog."""
    if _loader is None:
        raise RuntimeError("no plugin loader is installed, so no registry was passed and none can be loaded: "
                           "import speculant (its __init__ installs the loader), or pass registry= explicitly")
    return _loader()
