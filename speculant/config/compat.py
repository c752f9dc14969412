"""The one checker: which plugin combinations are supported, and why not.

``combination_reasons`` reads only capability flags (never plugin names) and
returns every reason a proposer × scorer × acceptance × attention backend ×
scheduler combination is unsupported, each phrased for the user with the
option, the value, the reason and the fix. Config validation, the engine and
the compatibility matrix all call it.

``validate_config`` is the one gate: the engine runs it on the config it is
given, before anything loads; ``build_config`` and ``load_config`` run it for
callers that want a checked config without an engine (``speculant config
check``). ``parse_config`` is the schema alone, for callers that hand the
config to the engine.

When sampling-only rules are checked: a config serves greedy and sampling
requests alike, so rules that only bite when a request samples (an acceptance
method without ``supports_sampling``; a proposer whose proposals have no
declared distribution under a lossless method) do not refuse the config.
``config_problems`` checks with ``sampling=False`` by default; the engine
checks ``sampling_reasons`` in ``add_request`` for requests with temperature
> 0 and refuses those requests with the reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from speculant.config.models import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    format_validation_error,
    read_config,
    resolve_device,
)
from speculant.config.rules import (
    Issue,
    backend_issues,
    combination_issues,
    combination_reasons,
    sampling_issues,
    sampling_reasons,
    structured_issues,
    structured_reasons,
    tree_issues,
)
from speculant.interfaces import Kind, UnknownPluginError, catalog

if TYPE_CHECKING:
    from speculant.interfaces.catalog import LoadedCatalog
    from speculant.interfaces.catalog import PluginCatalog as Registry

__all__ = [
    "Issue", "backend_issues", "combination_issues", "combination_reasons", "sampling_issues",
    "sampling_reasons", "structured_issues", "structured_reasons", "tree_issues",
    "auto_attention_backend", "resolve_attention_backend_name", "default_plugins",
    "config_problems", "data_problems", "validate_config", "parse_config", "build_config", "load_config",
]


def default_plugins() -> LoadedCatalog:
    """The loaded plugins (their ``registry`` and load ``errors``), for callers
    that pass no registry.

    ``speculant.plugins`` sits above config and the engine (it loads the
    built-in plugins, which import them), so nothing here imports it, not even
    inside a function: the loader ``import speculant`` installs
    (``interfaces.catalog``) is asked instead.
    """
    return catalog.default_plugins()


def auto_attention_backend(registry: Registry, device: str, dtype: str | None = None) -> str | None:
    """What ``attention_backend = 'auto'`` picks on ``device`` (for ``model.dtype
    = dtype``, any dtype if None): the registered backend with the highest
    ``priority`` among those that run there, are available and compute that
    dtype (ties: by name); None if none does."""
    usable = [registry.get("attention_backend", n) for n in registry.names("attention_backend")]
    usable = [c for c in usable if device in c.capabilities.devices and c.capabilities.unavailable is None
              and (dtype is None or dtype in c.capabilities.dtypes)]
    return max(usable, key=lambda c: c.capabilities.priority).name if usable else None


def resolve_attention_backend_name(config: EngineConfig, registry: Registry | None = None) -> str | None:
    """``model.attention_backend`` with ``auto`` resolved for the config's
    device (None if no registered backend runs there)."""
    name = config.model.attention_backend
    if name != "auto":
        return name
    registry = registry if registry is not None else default_plugins().registry
    return auto_attention_backend(registry, resolve_device(config.model.device).type, config.model.dtype)


def _lookup(registry: Registry, kind: Kind, name: str, key: str, shown: str,
            problems: list[str]) -> type[Any] | None:
    try:
        return registry.get(kind, name)
    except UnknownPluginError as err:
        problems.append(f"{key} = {shown}: {err.message}. Set {key} to one of them, or install and enable "
                        f"the plugin that provides it (`speculant plugins` lists what loaded)")
        return None


def _options(cls: type[Any] | None, values: dict[str, Any], key: str, label: str,
             problems: list[str]) -> BaseModel | None:
    if cls is None:
        return None
    try:
        return cls.Options.model_validate(values)
    except ValidationError as exc:
        if not cls.Options.model_fields:
            problems.append(f"{key} = {values!r}: {label} '{cls.name}' takes no options: remove {key}")
        else:
            problems += format_validation_error(exc, root=cls.Options, prefix=key + ".")
        return None


def _backend(config: EngineConfig, registry: Registry, problems: list[str]) -> type[Any] | None:
    """The configured attention backend class, or None after adding why not."""
    device = resolve_device(config.model.device).type
    name = resolve_attention_backend_name(config, registry)
    shown = repr(config.model.attention_backend)
    if name is None:
        problems.append(f"model.attention_backend = 'auto': no registered attention backend runs on {device} "
                        f"(registered: {', '.join(registry.names('attention_backend')) or 'none'}): install a "
                        f"plugin that provides one or set model.device to another device")
        return None
    if name != config.model.attention_backend:
        shown += f" (resolves to {name!r})"
    backend = _lookup(registry, "attention_backend", name, "model.attention_backend", shown, problems)
    if backend is None:
        return None
    caps = backend.capabilities
    if caps.unavailable is not None:
        problems.append(f"model.attention_backend = {shown} cannot run in this installation: {caps.unavailable}")
    if device not in caps.devices:
        problems.append(f"model.attention_backend = {shown} runs on {', '.join(caps.devices)} "
                        f"only, but model.device resolves to '{device}': set model.device to one of those or "
                        f"choose another backend")
    if config.model.dtype not in caps.dtypes:
        problems.append(f"model.attention_backend = {shown} computes {', '.join(caps.dtypes)} only, but "
                        f"model.dtype = '{config.model.dtype}': set model.dtype to one of those or choose "
                        f"another backend")
    return backend


def config_problems(config: EngineConfig, registry: Registry | None = None, *, sampling: bool = False,
                    check_proposer: bool = True) -> list[str]:
    """Every problem of ``config`` that needs the registry: unknown names (with
    the available ones), plugin options, the proposer's own checks and the
    combination rules. ``registry`` defaults to the loaded plugins' registry.
    ``sampling=False`` skips sampling-only rules (see the module docstring).
    ``check_proposer=False`` skips ``validate_against`` (for configs that
    failed validation elsewhere). Speculation off and ``attention_backend =
    'auto'`` leave nothing to check (and load no plugins)."""
    spec, chunked = config.speculative, config.scheduler.enable_chunked_prefill
    if not spec.enabled and config.model.attention_backend == "auto":
        return []
    load_errors: Sequence[object] = []
    if registry is None:
        loaded = default_plugins()
        registry, load_errors = loaded.registry, loaded.errors
    problems: list[str] = []
    backend = _backend(config, registry, problems)
    if backend is not None and not spec.enabled:
        problems += [i.message for i in backend_issues(backend, enable_chunked_prefill=chunked)]
    if spec.proposer is None:  # speculation off
        return problems + _load_error_note(backend is None, load_errors)
    proposer = _lookup(registry, "proposer", spec.proposer, "speculative.proposer", repr(spec.proposer), problems)
    scorer = _lookup(registry, "scorer", spec.scorer, "speculative.scorer", repr(spec.scorer), problems)
    acceptance = _lookup(registry, "acceptance", spec.acceptance, "speculative.acceptance",
                         repr(spec.acceptance), problems)
    proposer_opts = _options(proposer, spec.proposer_options, "speculative.proposer_options", "proposer", problems)
    _options(acceptance, spec.acceptance_options, "speculative.acceptance_options", "acceptance", problems)
    config = resolved_config(config, proposer, proposer_opts)  # an unset k within the proposer's limit
    spec = config.speculative
    if proposer is not None and proposer_opts is not None and check_proposer:
        problems += proposer.validate_against(proposer_opts, config)
    if not (proposer and scorer and acceptance and backend):
        return problems + _load_error_note(True, load_errors)
    return problems + combination_reasons(proposer, scorer, acceptance, backend, enable_chunked_prefill=chunked,
                                          num_speculative_tokens=spec.num_speculative_tokens,
                                          sampling=sampling,
                                          tree_width=spec.tree_width)


def _load_error_note(name_unresolved: bool, load_errors: Sequence[object]) -> list[str]:
    """When a name was not found and some plugin failed to load, say so."""
    if not (name_unresolved and load_errors):
        return []
    return [f"{len(load_errors)} plugin(s) failed to load, which may be why a name above is unknown; first: "
            f"{load_errors[0]}. Run `speculant plugins` to see every load error"]


def _best_effort(model_cls: type[BaseModel], raw: Any, **required: Any) -> BaseModel:
    """``model_cls`` with each field of ``raw`` that validates on its own;
    defaults for the others (their errors are reported by the schema check)."""
    inst = model_cls.model_construct(**required)
    for name, value in (raw.items() if isinstance(raw, dict) else ()):
        if name in model_cls.model_fields:
            try:
                setattr(inst, name, value)  # StrictModel validates on assignment
            except ValidationError:
                pass
    return inst


def data_problems(data: dict[str, Any], registry: Registry | None = None) -> list[str]:
    """Registry problems of a config mapping that failed schema validation, so
    that one report lists every problem. Needs a valid ``speculative``
    section; takes the valid fields of ``model`` and ``scheduler`` (defaults
    for the rest) and skips ``validate_against``."""
    try:
        spec = SpeculativeConfig.model_validate(data.get("speculative", {}))
    except ValidationError:
        return []
    config = EngineConfig.model_construct(
        model=_best_effort(ModelConfig, data.get("model"), path=""),
        cache=CacheConfig(),
        scheduler=_best_effort(SchedulerConfig, data.get("scheduler")),
        speculative=spec,
    )
    return config_problems(config, registry, check_proposer=False)


def resolved_config(config: EngineConfig, proposer: type[Any] | None, options: BaseModel | None) -> EngineConfig:
    """``config`` with ``speculative.num_speculative_tokens`` as the engine runs it:
    left unset, its policy's default lowered to what ``proposer`` can give with
    ``options`` (``Proposer.max_tokens_for``: its ``max_num_speculative_tokens``, or
    e.g. the number of Medusa heads it loads) where that is smaller; set, as given
    (the combination rules and the proposer refuse a value above its maximum)."""
    spec = config.speculative
    if proposer is None or "num_speculative_tokens" in spec.model_fields_set:
        return config
    limit = proposer.max_tokens_for(options, config) if options is not None else \
        proposer.capabilities.max_num_speculative_tokens
    if limit is None or limit >= spec.num_speculative_tokens:
        return config
    return config.model_copy(update={"speculative": spec.model_copy(update={"num_speculative_tokens": limit})})


def validate_config(config: EngineConfig, registry: Registry | None = None, *,
                    source: str = "<config>") -> EngineConfig:
    """``config`` if ``config_problems`` finds nothing, else raise
    ``ConfigError(source, problems)`` listing all of them. An unset
    ``num_speculative_tokens`` comes back resolved for the proposer
    (``resolved_config``)."""
    problems = config_problems(config, registry)
    if problems:
        raise ConfigError(source, problems)
    spec = config.speculative
    if spec.proposer is None or "num_speculative_tokens" in spec.model_fields_set:
        return config
    registry = registry if registry is not None else default_plugins().registry
    proposer = registry.get("proposer", spec.proposer)
    return resolved_config(config, proposer, _options(proposer, spec.proposer_options, "", "", []))


def parse_config(data: dict[str, Any], source: str = "<arguments>", registry: Registry | None = None) -> EngineConfig:
    """``data`` as an ``EngineConfig``, schema only. On failure the
    ``ConfigError`` lists every schema problem and the registry problems of the
    valid part (``data_problems``), so one report has them all; a config that
    parses still needs ``validate_config`` (the engine runs it)."""
    try:
        return EngineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc) + data_problems(data, registry)) from None


def build_config(data: dict[str, Any], source: str = "<arguments>", registry: Registry | None = None) -> EngineConfig:
    """``parse_config`` then ``validate_config``: names, plugin options and
    supported combinations are checked, so an unsupported config never leaves."""
    return validate_config(parse_config(data, source, registry), registry, source=source)


def load_config(path: str | Path, overrides: list[str] | None = None,
                registry: Registry | None = None) -> EngineConfig:
    """A config file (TOML or YAML) with ``--set`` style ``overrides``, checked by ``build_config``."""
    return build_config(read_config(path, overrides), str(path), registry)
