"""Loading plugins: built-ins, then the ``speculant.plugins`` entry points.

``load_plugins()`` is idempotent (the result is cached per process;
``reset_plugins()`` drops the cache for tests). The built-in plugin is the
``builtin`` entry point of our own distribution and travels the same road as
third-party ones, except that it always loads and always loads first.
``SPECULANT_PLUGINS`` (comma-separated entry-point names) restricts which
third-party entry points load; unset means all of them.

Third-party entry points are imported lazily (``speculant.plugins.lazy``):
``load_plugins()`` loads the built-in plugin at once, and the others the
first time something needs them: a registry lookup of a name the loaded
plugins do not have, a complete listing (``registry.names()`` or
``entries()``, which ``attention_backend = 'auto'`` ranks), or reading
``plugins`` / ``errors`` of the result (``speculant plugins``). A config that
names only built-in plugins and an explicit attention backend never imports
third-party code.

Each plugin is registered with pluggy and then checked with
``pm.check_pending()`` at once, so a misspelled hook is an error attributed to
that plugin. Its hooks are then called through the plugin manager, restricted
to that plugin (``pm.subset_hook_caller``), so what it registers is attributed
to it too. A plugin either loads completely or not at all: an import
failure, a hook the specs do not define, a hook that raises, or a class the
registry refuses
(invalid, or a name another plugin already holds) rejects that plugin with a
``PluginLoadError`` naming the distribution, the entry point and the cause.
The other plugins still load; the errors are kept on the result and shown by
``speculant plugins``.
"""

from __future__ import annotations

import difflib
import os
import threading
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

import pluggy

from speculant.interfaces import PLUGIN_KINDS, Kind
from speculant.plugins import hookspecs
from speculant.plugins.lazy import DiscoveringList, LazyRegistry
from speculant.plugins.registry import BUILTIN_PLUGIN_MODULE, PluginSource, Registration, Registry
from speculant.version import __version__

ENTRY_POINT_GROUP = "speculant.plugins"
ALLOW_LIST_ENV = "SPECULANT_PLUGINS"
HOOK_NAMES = tuple(k.hook for k in PLUGIN_KINDS.values())


@dataclass(frozen=True)
class PluginLoadError:
    """Why one plugin (or one ``SPECULANT_PLUGINS`` entry) did not load."""

    source: PluginSource
    cause: str

    def __str__(self) -> str:
        return f"{self.source.describe()} was not loaded: {self.cause}"


class PluginRejected(Exception):
    """Raised by ``LoadedPlugins.add_plugin`` with every problem of one plugin."""

    def __init__(self, errors: list[PluginLoadError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class PluginInfo:
    """A plugin that loaded: where from, which hooks it implements, what it registered."""

    source: PluginSource
    hooks: list[str]
    registrations: list[Registration]


class LoadedPlugins:
    """The plugin manager, the registry it filled, and what happened on the
    way. ``pending`` entry points are imported by :meth:`discover`, which
    listing the registry or reading ``plugins`` / ``errors`` calls."""

    def __init__(self, pm: pluggy.PluginManager, pending: list[EntryPoint] | None = None,
                 pending_errors: list[PluginLoadError] | None = None) -> None:
        self.pm = pm
        self.registry: Registry = LazyRegistry(self.discover)
        self._plugins: list[PluginInfo] = []
        self._errors: list[PluginLoadError] = []
        self._pending = list(pending or [])
        self._pending_errors = list(pending_errors or [])
        self.discovered = False

    @property
    def plugins(self) -> DiscoveringList[PluginInfo]:
        """Every plugin that loaded, built-in first (imports the third-party ones first)."""
        return DiscoveringList(self._plugins, self.discover)

    @property
    def errors(self) -> DiscoveringList[PluginLoadError]:
        """Every load error (imports the third-party plugins first)."""
        return DiscoveringList(self._errors, self.discover)

    def discover(self) -> None:
        """Import the pending third-party entry points (once; later calls do nothing)."""
        global _loading
        with _lock:
            if self.discovered:
                return
            self.discovered = True
            _loading = True
            try:
                self._errors += self._pending_errors
                _load_entry_points(self, self._pending)
            finally:
                _loading = False

    def add_plugin(self, plugin: object, source: PluginSource) -> PluginInfo:
        """Register ``plugin`` (a module or object with ``hookimpl`` functions),
        call its hooks and file what it registers, all or nothing.
        Raises ``PluginRejected`` listing every problem."""
        def reject(cause: str) -> PluginRejected:
            return PluginRejected([PluginLoadError(source, cause)])

        try:
            self.pm.register(plugin, name=source.name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            raise reject(f"plugin manager refused it: {exc}") from None
        try:
            hooks = self._check_hooks(plugin)
            staged, problems = self._check_staged(self._call_hooks(plugin), source)
        except ValueError as exc:
            self.pm.unregister(plugin)
            raise reject(str(exc)) from exc
        if problems:
            self.pm.unregister(plugin)
            raise PluginRejected([PluginLoadError(source, p) for p in problems])
        regs = [self.registry.add(kind, cls, source) for kind, cls in staged]
        info = PluginInfo(source=source, hooks=hooks, registrations=regs)
        self._plugins.append(info)
        return info

    def remove_plugin(self, name: str) -> None:
        """Unregister the plugin called ``name`` and drop what it registered."""
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        self.registry.remove_source(name)
        self._plugins[:] = [p for p in self._plugins if p.source.name != name]

    def _check_hooks(self, plugin: object) -> list[str]:
        """The hooks ``plugin`` implements; ValueError if one is misspelled or none is."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError:
            unknown = [c.name for c in self.pm.get_hookcallers(plugin) or [] if not c.has_spec()]
            if not unknown:  # earlier plugins were checked when they loaded
                raise
            hints = [f"{n!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(n, HOOK_NAMES, 1))
                     else repr(n) for n in unknown]
            raise ValueError(f"it implements unknown hook {', '.join(hints)}; "
                             f"the hooks are {', '.join(HOOK_NAMES)}") from None
        hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or [])
        if not hooks:
            raise ValueError(f"it implements no speculant hook: decorate functions named "
                             f"{', '.join(HOOK_NAMES)} with speculant.plugins.hookimpl")
        return hooks

    def _call_hooks(self, plugin: object) -> list[tuple[Kind, type]]:
        """Call ``plugin``'s hooks through the plugin manager (only its own
        implementations), each with a ``register`` that stages classes."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        staged: list[tuple[Kind, type]] = []
        for spec in PLUGIN_KINDS.values():
            def register(cls: type, _kind: Kind = spec.kind) -> type:
                staged.append((_kind, cls))
                return cls

            try:
                self.pm.subset_hook_caller(spec.hook, remove_plugins=others)(register=register)
            except Exception as exc:
                raise ValueError(f"hook {spec.hook} raised {type(exc).__name__}: {exc}") from exc
        return staged

    def _check_staged(self, staged: list[tuple[Kind, type]],
                      source: PluginSource) -> tuple[list[tuple[Kind, type]], list[str]]:
        """Staged classes without repeats, and every reason the registry refuses them."""
        unique: list[tuple[Kind, type]] = []
        problems: list[str] = []
        seen: dict[tuple[str, object], type] = {}
        for kind, cls in staged:
            name = getattr(cls, "name", None)
            key = (kind, name if isinstance(name, str) else id(cls))
            if key in seen:
                if seen[key] is not cls:
                    problems.append(f"it registers {kind} name {key[1]!r} twice "
                                    f"({seen[key].__qualname__} and {cls.__qualname__}): rename one")
                continue
            seen[key] = cls
            unique.append((kind, cls))
            problems += self.registry.check(kind, cls, source)
        return unique, problems


def _allow_list() -> set[str] | None:
    raw = os.environ.get(ALLOW_LIST_ENV)
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


def _source(ep: EntryPoint) -> PluginSource:
    dist = ep.dist
    if dist is not None:
        dist_name, version = dist.name, dist.version
    elif ep.value == BUILTIN_PLUGIN_MODULE:  # running from a source tree that is not installed
        dist_name, version = "speculant", __version__
    else:
        dist_name, version = "(unknown distribution)", None
    return PluginSource(name=f"{dist_name}:{ep.name}", distribution=dist_name, version=version,
                        entry_point=ep.name, value=ep.value)


def discover() -> tuple[list[EntryPoint], list[PluginLoadError]]:
    """Entry points to load, built-in first, after ``SPECULANT_PLUGINS``;
    plus an error for each allow-list name that matches no entry point."""
    found = list(entry_points(group=ENTRY_POINT_GROUP))
    builtin = [ep for ep in found if ep.value == BUILTIN_PLUGIN_MODULE][:1]
    if not builtin:
        builtin = [EntryPoint("builtin", BUILTIN_PLUGIN_MODULE, ENTRY_POINT_GROUP)]
    others = [ep for ep in found if ep.value != BUILTIN_PLUGIN_MODULE]
    allow = _allow_list()
    errors = []
    if allow is not None:
        names = {ep.name for ep in others}
        for missing in sorted(allow - names - {"builtin"}):
            errors.append(PluginLoadError(
                PluginSource(name=missing, entry_point=missing),
                f"{ALLOW_LIST_ENV} lists it, but no installed distribution declares it in group "
                f"{ENTRY_POINT_GROUP!r} (installed: {', '.join(sorted(names)) or 'none'}): install the plugin "
                f"or fix {ALLOW_LIST_ENV}"))
        others = [ep for ep in others if ep.name in allow]
    return builtin + others, errors


def _load_all() -> LoadedPlugins:
    """The built-in plugin, loaded; the third-party entry points, pending."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    eps, errors = discover()
    loaded = LoadedPlugins(pm=pm, pending=eps[1:], pending_errors=errors)
    _load_entry_points(loaded, eps[:1])
    return loaded


def _load_entry_points(loaded: LoadedPlugins, eps: list[EntryPoint]) -> None:
    for ep in eps:
        source = _source(ep)
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import-time failure of third-party code
            loaded._errors.append(PluginLoadError(source, f"import failed: {type(exc).__name__}: {exc}"))
            continue
        try:
            loaded.add_plugin(plugin, source)
        except PluginRejected as exc:
            loaded._errors += exc.errors


_lock = threading.RLock()
_loaded: LoadedPlugins | None = None
_loading = False


def load_plugins() -> LoadedPlugins:
    """Load the plugins once per process and return the result (cached); the
    third-party ones are imported on first need (see the module docstring)."""
    global _loaded, _loading
    with _lock:
        if _loading:  # same thread: a plugin's import or hook asked for the registry
            raise RuntimeError("plugins asked for the registry while plugins are loading: a plugin must "
                               "not call load_plugins() or get_registry() at import time or in its hooks")
        if _loaded is None:
            _loading = True
            try:
                _loaded = _load_all()
            finally:
                _loading = False
        return _loaded


def get_registry() -> Registry:
    """The registry filled by ``load_plugins()`` (loading on first use)."""
    return load_plugins().registry


def reset_plugins() -> None:
    """Forget the loaded plugins; the next ``load_plugins()`` discovers again."""
    global _loaded
    with _lock:
        _loaded = None


def register_plugin(plugin: object, name: str) -> PluginInfo:
    """Add a plugin object from this process (a notebook, a test) to the loaded
    set; raises ``PluginRejected`` if it cannot be loaded."""
    return load_plugins().add_plugin(plugin, PluginSource(name=name))


def unregister_plugin(name: str) -> None:
    """Undo ``register_plugin(plugin, name)``."""
    load_plugins().remove_plugin(name)
