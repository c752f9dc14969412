"""``speculant plugins``: what loaded, from where, and what it registered;
``speculant plugins matrix``: the compatibility matrix."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from pydantic import BaseModel

from speculant.config.matrix import (
    ReadmeMarkersMissing,
    builtin_registry,
    compute_matrix,
    readme_section,
    render_json,
    render_markdown,
    rewrite_readme,
)
from speculant.interfaces import PLUGIN_KINDS, UnknownPluginError
from speculant.plugins.manager import LoadedPlugins, PluginInfo, load_plugins
from speculant.plugins.registry import Registration


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plugins", help="list loaded plugins, what each registered, and load errors")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run_list)
    sub = parser.add_subparsers(dest="plugins_command", metavar="{matrix}")
    matrix = sub.add_parser("matrix", help="print the compatibility matrix of the loaded plugins")
    matrix.add_argument("--json", action="store_true", help="print JSON (every cell, full reasons)")
    matrix.add_argument("--builtin-only", action="store_true",
                        help="only the built-in plugins (what the README documents)")
    matrix.add_argument("--backend", default=None, metavar="NAME",
                        help="attention backend the cells are checked on (default: what 'auto' picks on the CPU)")
    matrix.add_argument("--write-readme", metavar="PATH",
                        help="rewrite the built-in matrix between the compat-matrix markers of PATH")
    matrix.add_argument("--check-readme", metavar="PATH",
                        help="exit 1 if the matrix in PATH differs from the computed built-in one")
    matrix.set_defaults(func=run_matrix)


# ``cls: Any``: a registered plugin class, whose ``Options`` model and
# ``capabilities`` dataclass the registry checked (``validate_class``) but
# whose static type there is only ``type``.
def option_fields(cls: Any) -> dict[str, Any]:
    """Option name -> default (or ``"(required)"``) of a plugin's Options model; a
    nested options model's default (a factory's) as its own dict of values."""
    out: dict[str, Any] = {}
    for name, f in cls.Options.model_fields.items():
        value = "(required)" if f.is_required() else f.get_default(call_default_factory=True)
        out[name] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def capability_fields(cls: Any) -> dict[str, Any]:
    """The plugin class's capabilities as a dict."""
    return dataclasses.asdict(cls.capabilities)


def registration_dict(reg: Registration) -> dict[str, Any]:
    return {
        "kind": reg.kind,
        "name": reg.name,
        "class": reg.qualname,
        "capabilities": capability_fields(reg.cls),
        "options": option_fields(reg.cls),
    }


def plugin_dict(info: PluginInfo) -> dict[str, Any]:
    src = info.source
    return {
        "name": src.name,
        "distribution": src.distribution,
        "version": src.version,
        "entry_point": src.entry_point,
        "value": src.value,
        "hooks": info.hooks,
        "registered": [registration_dict(r) for r in info.registrations],
    }


def listing_dict(loaded: LoadedPlugins) -> dict[str, Any]:
    return {
        "plugins": [plugin_dict(p) for p in loaded.plugins],
        "errors": [{"plugin": e.source.name, "distribution": e.source.distribution, "version": e.source.version,
                    "entry_point": e.source.entry_point, "value": e.source.value, "cause": e.cause,
                    "message": str(e)} for e in loaded.errors],
    }


def _flags(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items()) or "-"


def render_listing(loaded: LoadedPlugins) -> str:
    lines = []
    for info in loaded.plugins:
        src = info.source
        origin = (f"{src.distribution} {src.version or ''}".strip() if src.distribution else "(in-process)")
        target = f" — entry point {src.entry_point} = {src.value}" if src.entry_point else ""
        lines += [f"{src.name}: {origin}{target}", f"  hooks: {', '.join(info.hooks)}"]
        for reg in info.registrations:
            lines.append(f"  {PLUGIN_KINDS[reg.kind].label} {reg.name!r}: {reg.qualname}")
            lines.append(f"      capabilities: {_flags(capability_fields(reg.cls))}")
            lines.append(f"      options: {_flags(option_fields(reg.cls))}")
    if not loaded.plugins:
        lines.append("no plugin loaded")
    if loaded.errors:
        lines += ["", f"load errors ({len(loaded.errors)}):"] + [f"  - {e}" for e in loaded.errors]
    return "\n".join(lines)


def run_list(args: argparse.Namespace) -> int:
    loaded = load_plugins()
    print(json.dumps(listing_dict(loaded), indent=2, default=str) if args.json else render_listing(loaded))
    return 1 if loaded.errors else 0


def run_matrix(args: argparse.Namespace) -> int:
    loaded = load_plugins()
    for err in loaded.errors:
        print(f"warning: {err}", file=sys.stderr)
    readme = args.write_readme or args.check_readme
    registry = builtin_registry(loaded.registry) if (args.builtin_only or readme) else loaded.registry
    try:
        cells = compute_matrix(registry, attention_backend=args.backend)
    except UnknownPluginError as exc:
        print(f"error: cannot compute the matrix: {exc}", file=sys.stderr)
        return 1
    markdown = render_markdown(cells)
    try:
        if args.write_readme:
            changed = rewrite_readme(args.write_readme, markdown)
            print(f"{args.write_readme}: {'updated' if changed else 'already up to date'}")
            return 0
        if args.check_readme:
            with open(args.check_readme, encoding="utf-8") as f:
                current = readme_section(f.read(), args.check_readme)
            if current != markdown:
                print(f"{args.check_readme}: the compatibility matrix is stale; run "
                      f"`speculant plugins matrix --write-readme {args.check_readme}`", file=sys.stderr)
                return 1
            print(f"{args.check_readme}: up to date")
            return 0
    except (OSError, ReadmeMarkersMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(render_json(cells), indent=2, ensure_ascii=False))
    else:
        print(markdown, end="")
    return 0
