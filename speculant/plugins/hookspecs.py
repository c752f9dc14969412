"""The hooks a Speculant plugin may implement.

A plugin is a module (or any object) whose functions are decorated with
``hookimpl`` and named after the hooks below. Each hook receives a
``register`` callback; the plugin calls it once per class it contributes::

    from speculant.plugin_api import hookimpl

    @hookimpl
    def register_proposers(register):
        register(MyProposer)

The hooks are the ``hook`` column of ``speculant.interfaces.PLUGIN_KINDS``
(one per plugin kind; a test keeps the two in step). The host calls them
through the plugin manager, collects what was registered, validates each
class (right base class, a ``name``, ``capabilities`` of the right kind, an
``Options`` model that forbids unknown keys) and files it in the registry
under its ``name``.
An implementation may omit the ``register`` argument only if it registers
nothing, and must not take arguments the spec does not name.

Every hook is called exactly once per plugin, by ``load_plugins()``, after all
plugins have been imported and before any engine is built: built-ins first,
then third-party entry points in discovery order. A hook must not build
models, read files or touch devices; it only names classes. Heavy work belongs
in the class's ``__init__``, which the engine calls when it is selected.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT_NAME = "speculant"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

RegisterCallback = Callable[[type], type]
"""``register(cls) -> cls``: files ``cls`` under ``cls.name``. Returning the
class lets plugins use it as a class decorator too."""


@hookspec
def register_proposers(register: RegisterCallback) -> None:
    """Contribute proposers: subclasses of ``speculant.plugin_api.Proposer``.

    Called once per plugin at load time. Call ``register(cls)`` for each
    proposer class; ``cls.name`` is the value users put in
    ``speculative.proposer``, ``cls.capabilities`` a ``ProposerCapabilities``
    and ``cls.Options`` the pydantic model ``speculative.proposer_options``
    is validated against. A name already registered by an earlier plugin is
    an error that rejects this plugin.
    """


@hookspec
def register_scorers(register: RegisterCallback) -> None:
    """Contribute scorers: subclasses of ``speculant.plugin_api.Scorer``.

    Called once per plugin at load time. Call ``register(cls)`` for each
    scorer class; ``cls.name`` is the value of ``speculative.scorer`` and
    ``cls.capabilities`` a ``ScorerCapabilities``.
    """


@hookspec
def register_acceptance_methods(register: RegisterCallback) -> None:
    """Contribute acceptance methods: subclasses of
    ``speculant.plugin_api.AcceptanceMethod``.

    Called once per plugin at load time. Call ``register(cls)`` for each
    class; ``cls.name`` is the value of ``speculative.acceptance``,
    ``cls.capabilities`` an ``AcceptanceCapabilities`` and ``cls.Options``
    the model ``speculative.acceptance_options`` is validated against.
    """


@hookspec
def register_attention_backends(register: RegisterCallback) -> None:
    """Contribute attention backends: subclasses of
    ``speculant.plugin_api.AttentionBackend``.

    Called once per plugin at load time. Call ``register(cls)`` for each
    backend; ``cls.name`` is the value of ``model.attention_backend`` and
    ``cls.capabilities`` an ``AttentionBackendCapabilities`` (which devices
    it runs on, whether it takes multi-token queries over a cached prefix).
    """
