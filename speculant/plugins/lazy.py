"""Views that import third-party plugins only when something needs them.

Importing an entry point runs its package's code, so the plugin manager loads
the built-in plugin (and plugins registered in-process) at once but imports
third-party entry points only on first need: a name the loaded plugins do not
have, or a complete listing (``names``, ``entries``, the loaded plugins or the
load errors). A config that names only built-in plugins and an explicit
attention backend never imports third-party code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from speculant.interfaces import Kind
from speculant.plugins.registry import Registration, Registry

T = TypeVar("T")


class LazyRegistry(Registry):
    """A registry that calls ``discover`` (idempotent) before a lookup misses
    or before it lists its contents."""

    def __init__(self, discover: Callable[[], None]) -> None:
        super().__init__()
        self._discover = discover

    def entry(self, kind: Kind, name: str) -> Registration:
        if name not in self._entries[kind]:
            self._discover()
        return super().entry(kind, name)

    def names(self, kind: Kind) -> list[str]:
        self._discover()
        return super().names(kind)

    def entries(self, kind: Kind | None = None) -> Iterator[Registration]:
        self._discover()
        return super().entries(kind)


class DiscoveringList(Sequence[T]):
    """A read-only view of ``items`` that calls ``discover`` before it is read
    (its length, truth value, items or equality)."""

    def __init__(self, items: list[T], discover: Callable[[], None]) -> None:
        self._items = items
        self._discover = discover

    def _all(self) -> list[T]:
        self._discover()
        return self._items

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index):
        return self._all()[index]

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._all()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, DiscoveringList)):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())
