"""Plugin framework: pluggy hooks, entry-point loading and the registry.

Plugin authors need only ``hookimpl`` (see ``speculant.plugins.hookspecs``
for the hooks); the engine asks ``get_registry()`` for classes by name.
"""

from speculant.plugins.hookspecs import hookimpl

__all__ = ["hookimpl", "get_registry", "load_plugins", "register_plugin", "unregister_plugin"]


def __getattr__(name: str):  # lazy: the manager imports pluggy's machinery and plugins
    if name in ("get_registry", "load_plugins", "register_plugin", "unregister_plugin"):
        from speculant.plugins import manager

        return getattr(manager, name)
    raise AttributeError(name)
