"""The registry: plugin classes per kind, by name, with where each came from.

The kinds and what each requires are ``speculant.interfaces.PLUGIN_KINDS``.
A class is validated before it is filed (right base class, a ``name``,
``capabilities`` of the right type, an ``Options`` model that forbids unknown
keys). A name can be filed once per kind; a second claim is an error naming
both sources. A lookup miss raises ``UnknownPluginError``, which lists what
is available.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from speculant.interfaces import PLUGIN_KINDS, Kind, UnknownPluginError, version_problem

BUILTIN_PLUGIN_MODULE = "speculant.plugins.builtin"
"""Module of the built-in plugin (entry point ``builtin`` of ``speculant``)."""

PUBLIC_MODULE = "speculant.plugin_api"
"""Where plugin authors import the contract from (messages name it)."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: an entry point of a distribution, or a call
    to ``register_plugin`` in this process (``distribution`` is None)."""

    name: str
    """Unique plugin name inside the plugin manager."""
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None
    """Entry-point name, e.g. ``builtin``."""
    value: str | None = None
    """Entry-point target, e.g. ``speculant.plugins.builtin``."""

    @property
    def is_builtin(self) -> bool:
        return self.value == BUILTIN_PLUGIN_MODULE

    def describe(self) -> str:
        """Human-readable origin, e.g. ``entry point 'builtin = speculant.plugins.builtin'
        of distribution speculant 0.1.0``."""
        if self.distribution is None:
            if self.entry_point is not None:  # named somewhere, but no distribution provides it
                return f"entry point {self.entry_point!r}"
            return f"plugin {self.name!r} (registered in this process)"
        target = f"{self.entry_point} = {self.value}" if self.value else self.entry_point
        return f"entry point {target!r} of distribution {self.distribution} {self.version or ''}".rstrip()


@dataclass(frozen=True)
class Registration:
    """One class filed in the registry."""

    kind: Kind
    name: str
    cls: type[Any]
    source: PluginSource

    @property
    def qualname(self) -> str:
        return f"{self.cls.__module__}:{self.cls.__qualname__}"


class RegistrationError(ValueError):
    """A class a plugin tried to register that cannot be filed."""


def validate_class(kind: Kind, cls: object) -> list[str]:
    """Every reason ``cls`` cannot be registered as a ``kind``."""
    spec = PLUGIN_KINDS[kind]
    label, base = spec.label, spec.base
    if not inspect.isclass(cls):
        return [f"register() takes a {label} class, got {cls!r}: pass the class, not an instance"]
    problems = []
    if not issubclass(cls, base):
        problems.append(f"{cls.__qualname__} is not a subclass of {PUBLIC_MODULE}.{base.__qualname__}: "
                        f"derive the {label} from it")
    elif inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        problems.append(f"{cls.__qualname__} leaves abstract methods unimplemented: {missing}")
    version = version_problem(cls, label)
    if version is not None:
        problems.append(version)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(f"{cls.__qualname__}.name = {name!r}: must be a non-empty string of letters, digits, "
                        f"'_', '-' or '.' (it is what users write in the config)")
    caps = getattr(cls, "capabilities", None)
    if not isinstance(caps, spec.capabilities):
        problems.append(f"{cls.__qualname__}.capabilities = {caps!r}: must be a "
                        f"{PUBLIC_MODULE}.{spec.capabilities.__name__} instance")
    options = getattr(cls, "Options", None)
    if not (inspect.isclass(options) and issubclass(options, BaseModel)):
        problems.append(f"{cls.__qualname__}.Options = {options!r}: must be a pydantic model "
                        f"(use {PUBLIC_MODULE}.NoOptions when there are none)")
    elif options.model_config.get("extra") != "forbid":
        problems.append(f"{cls.__qualname__}.Options does not forbid unknown keys, so a misspelled option "
                        f"would be ignored: set model_config = ConfigDict(extra='forbid')")
    return problems


class Registry:
    """Plugin classes per kind and name. Filled by the plugin manager."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Registration]] = {kind: {} for kind in PLUGIN_KINDS}

    def check(self, kind: Kind, cls: object, source: PluginSource) -> list[str]:
        """Every reason ``add(kind, cls, source)`` would refuse."""
        problems = validate_class(kind, cls)
        name = getattr(cls, "name", None)
        existing = self._entries[kind].get(name) if isinstance(name, str) else None
        if existing is not None:
            qualname = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', cls)}"
            problems.append(
                f"{PLUGIN_KINDS[kind].label} name {name!r} ({qualname}) is already registered by "
                f"{existing.source.describe()} ({existing.qualname}): rename one of them, or leave one "
                f"plugin out with SPECULANT_PLUGINS")
        return problems

    def add(self, kind: Kind, cls: type[Any], source: PluginSource) -> Registration:
        """Validate and file ``cls``; raises ``RegistrationError`` listing every problem."""
        problems = self.check(kind, cls, source)
        if problems:
            raise RegistrationError("; ".join(problems))
        reg = Registration(kind=kind, name=cls.name, cls=cls, source=source)
        self._entries[kind][reg.name] = reg
        return reg

    def remove_source(self, plugin_name: str) -> None:
        """Drop everything the plugin named ``plugin_name`` registered."""
        for by_name in self._entries.values():
            for name in [n for n, r in by_name.items() if r.source.name == plugin_name]:
                del by_name[name]

    def get(self, kind: Kind, name: str) -> type[Any]:
        """The class registered as ``name``; ``UnknownPluginError`` lists the others."""
        return self.entry(kind, name).cls

    def entry(self, kind: Kind, name: str) -> Registration:
        try:
            return self._entries[kind][name]
        except KeyError:
            raise UnknownPluginError(kind, name, self.names(kind)) from None

    def names(self, kind: Kind) -> list[str]:
        return sorted(self._entries[kind])

    def entries(self, kind: Kind | None = None) -> Iterator[Registration]:
        """Registrations of one kind (or all), sorted by kind then name."""
        for k in ([kind] if kind else PLUGIN_KINDS):
            for name in sorted(self._entries[k]):
                yield self._entries[k][name]

    def filtered(self, keep: Callable[[Registration], bool]) -> Registry:
        """A new registry holding only the registrations ``keep`` accepts."""
        out = Registry()
        for reg in self.entries():
            if keep(reg):
                out._entries[reg.kind][reg.name] = reg
        return out

    def get_proposer(self, name: str) -> type[Any]:
        return self.get("proposer", name)

    def get_acceptance(self, name: str) -> type[Any]:
        return self.get("acceptance", name)
