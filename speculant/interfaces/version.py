"""The contract's version, and the check of the version a plugin declares.

``API_VERSION`` is ``"MAJOR.MINOR"``. The major number changes when a plugin
written for the previous one may break (a method's arguments change, a view
loses a field); the minor number when the contract only grows. Every plugin
class declares the version it was written for as a class attribute,
``api_version = "3.0"``; the registry refuses a class that declares none or
another major version, with a message that says what to change.

History: 1 (no declaration) handed plugins the engine's own request objects
and chain-only data; 2 hands them read-only views, tree-ready ``Proposals``
(``parents``), ``commit`` with accepted node indices, and ``QuerySpan`` with
explicit positions and an ancestor mask; 3 takes the KV allocator away from
plugins: ``RunnerView.block_manager`` is gone and a ``QuerySpan`` names a
``SequenceHandle`` the runner issued (``open_sequence``, ``grow``, ``fork``,
``free``, ``cache_prefix``; a scorer's are ``ScheduledRequest.sequence``)
instead of a block table, and the runner refuses any handle it does not hold.
A plugin that allocated blocks or built spans from block tables breaks, so
the major number changed; one that never called the runner only updates its
``api_version``.
"""

from __future__ import annotations

API_VERSION = "3.0"


class PluginVersionError(TypeError):
    """A plugin class that targets another contract version than this one."""


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def version_problem(cls: type, label: str) -> str | None:
    """Why ``cls`` (a plugin class of kind ``label``) cannot be used with this
    contract, or None when its declared ``api_version`` has our major version."""
    name = getattr(cls, "name", cls.__name__)
    where = f"{cls.__module__}.{cls.__qualname__}"
    declared = cls.__dict__.get("api_version", getattr(cls, "api_version", None))
    if declared is None:
        return (f"{label} {name!r} ({where}) declares no api_version; this speculant implements plugin API "
                f"{API_VERSION}. Port it to API {API_VERSION} (see speculant.plugin_api) and set the class "
                f"attribute api_version = {API_VERSION!r}")
    if not isinstance(declared, str) or _major(declared) is None:
        return (f"{label} {name!r} ({where}) declares api_version = {declared!r}, which is not a "
                f"'MAJOR.MINOR' string; set api_version = {API_VERSION!r} once it targets plugin API "
                f"{API_VERSION}")
    if _major(declared) != _major(API_VERSION):
        return (f"{label} {name!r} ({where}) targets plugin API {declared}, but this speculant implements "
                f"{API_VERSION} (another major version: the methods it calls or implements differ). Port it "
                f"to API {API_VERSION} and set api_version = {API_VERSION!r}, or install a speculant release "
                f"that implements API {declared}")
    return None
