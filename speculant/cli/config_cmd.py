"""``speculant config check FILE``: validate a config file (with ``--set``
overrides) against the models, the loaded plugins and this machine (CUDA,
memory for the KV cache, the model's positions and weight files; see
``speculant.model.resources``), and print the resolved settings, or every
problem at once (exit status 1)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING, Any

import yaml

from speculant.config.compat import load_config, resolve_attention_backend_name
from speculant.config.models import ConfigError, EngineConfig
from speculant.plugins.manager import get_registry

if TYPE_CHECKING:
    from speculant.interfaces import Kind

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("config", help="work with engine config files")
    sub = parser.add_subparsers(dest="config_command", required=True)
    check = sub.add_parser("check", help="validate a TOML/YAML config and print the resolved settings")
    check.add_argument("file", help="config file (.toml, .yaml or .yml)")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                       help="override one setting (value parsed as TOML, else a string); repeatable")
    check.add_argument("--format", choices=("toml", "yaml", "json"), default="toml",
                       help="how to print the resolved settings (default: toml)")
    check.set_defaults(func=run_check)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """TOML text for nested dicts of scalars and lists. ``None`` is left out
    (TOML has no null; it is the default of every optional config field) and
    so are empty sub-tables."""
    scalars = {k: v for k, v in data.items() if v is not None and not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and v}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in scalars.items()]
    out = "\n".join(lines) + ("\n\n" if lines else "")
    for key, table in tables.items():
        out += dump_toml(table, f"{prefix}.{_toml_key(str(key))}" if prefix else _toml_key(str(key)))
    return out


def format_settings(config: EngineConfig, fmt: str) -> str:
    """The full settings (defaults filled in) as ``toml``, ``yaml`` or ``json``."""
    data = config.model_dump(mode="json")
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    return dump_toml(data)


def resolution_notes(config: EngineConfig) -> list[str]:
    """Which class and plugin each name in ``config`` resolved to."""
    spec = config.speculative
    registry = get_registry()
    wanted: list[tuple[Kind, str, str | None]] = [
        ("attention_backend", "model.attention_backend", resolve_attention_backend_name(config, registry))]
    if spec.enabled:
        wanted += [("proposer", "speculative.proposer", spec.proposer), ("scorer", "speculative.scorer", spec.scorer),
                   ("acceptance", "speculative.acceptance", spec.acceptance)]
    notes = []
    for kind, key, name in wanted:
        if name in registry.names(kind):
            reg = registry.entry(kind, name)
            notes.append(f"{key} = {name!r}: {reg.qualname} from {reg.source.describe()}")
    if not spec.enabled:
        notes.append("speculative decoding is off (speculative.proposer is not set)")
    return notes


def run_check(args: argparse.Namespace) -> int:
    from speculant.model.resources import resource_problems

    try:
        config = load_config(args.file, args.overrides)
        problems = resource_problems(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:  # e.g. an unreadable model config.json: one line, no traceback
        print(f"error: {args.file}: {exc}", file=sys.stderr)
        return 1
    if problems:
        print(ConfigError(args.file, problems), file=sys.stderr)
        return 1
    text = format_settings(config, args.format)
    if args.format != "json":
        header = [f"resolved from {args.file}" + (f" with {len(args.overrides)} override(s)" if args.overrides else "")]
        text = "".join(f"# {line}\n" for line in header + resolution_notes(config)) + "\n" + text
    print(text, end="")
    return 0
