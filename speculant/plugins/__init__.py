"""Plugin framework: pluggy hooks, entry-point loading and the registry.

Plugin authors import from ``speculant.plugin_api`` (the contract and
``hookimpl``; the hooks are in ``speculant.plugins.hookspecs``); the engine
gets the registry from ``get_registry()``.
"""

from speculant.plugins.hookspecs import hookimpl
from speculant.plugins.manager import get_registry, load_plugins, register_plugin, unregister_plugin

__all__ = ["hookimpl", "get_registry", "load_plugins", "register_plugin", "unregister_plugin"]
