"""``speculant`` command line: one module per sub-command.

Each sub-command module exposes ``add_parser(subparsers)`` which registers its
parser and sets ``func`` (called with the parsed args, returns an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES = (
    "speculant.cli.generate_cmd",
    "speculant.cli.chat_cmd",
    "speculant.cli.config_cmd",
    "speculant.cli.plugins_cmd",
    "speculant.cli.bench_cmd",
    "speculant.cli.serve_cmd",
    "speculant.cli.batch_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speculant", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # sub-command not built yet
                continue
            raise
        module.add_parser(sub)
    return parser


def _quiet_transformers() -> None:
    """No per-model "Loading weights" progress bars or advisory warnings in CLI output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _quiet_transformers()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
