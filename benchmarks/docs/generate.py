"""The result tables of the docs, generated from ``benchmarks/results/*.json``.

``python -m benchmarks.docs`` (from the repository root) rewrites every block
between ``<!-- results:NAME:start -->`` and ``<!-- results:NAME:end -->`` in
README.md, docs/benchmarks.md and docs/scaling.md; ``--check`` only reports
stale blocks (exit 1), which is what the test suite checks. Every row names
the machine, date and commit its file was measured on (``commit not
recorded`` for files written before benchmarks recorded it), so a figure
can't drift from its source or lose its label. These generators live beside
the benchmarks, not in the wheel: they read the repository's result files.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from .eagle_tree_tables import eagle_trees
from .fast_forward_tables import cpu_kernels, cpu_kernels_headline, fast_forward, fast_forward_headline
from .gate_tables import engine_loop_gate
from .isa_tables import isa_compare, isa_compare_avx2, isa_step_profile
from .quant_tables import quant_1p5b
from .random_tables import random_llama
from .ray_tables import ray_breakdown, ray_scaling, ray_split
from .real_size_tables import (
    agreement,
    concurrency,
    long_prompt_cold_start,
    real_size_rows,
    smollm2_q4_1,
    step_profile,
)
from .spec_cost_tables import sampling_filter, spec_cost
from .structured_tables import structured, structured_headline
from .tables import (
    HEADLINE_HEADER,
    eagle_headline,
    eagle_rounds,
    gpu_headline,
    gpu_rows,
    graphs,
    graphs_headline,
    heldout_acceptance,
    llamacpp,
    llamacpp_headline,
    prefix_cache,
    prefix_headline,
    smollm2_batch1,
    smollm2_headline,
)
from .tree_tables import tree_step_profile, trees

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "scaling.md")

Table = Callable[[Path], list[str]]


MAX_HEADLINE_ROWS = 12
"""The README's table stays short: a new claim replaces an old one."""


def headline_rows(results: Path) -> list[str]:
    """The README's short table: one line per claim, each with its source, newest subjects first."""
    rows = (llamacpp_headline(results) + fast_forward_headline(results) + cpu_kernels_headline(results)
            + smollm2_headline(results) + eagle_headline(results) + prefix_headline(results)
            + structured_headline(results) + gpu_headline(results) + graphs_headline(results))
    if len(rows) > MAX_HEADLINE_ROWS:
        raise ValueError(f"the README's headline table would have {len(rows)} rows, over {MAX_HEADLINE_ROWS}: "
                         "drop or merge one in benchmarks/docs/generate.py")
    return HEADLINE_HEADER + rows


BLOCKS: dict[str, Table] = {
    "headline": headline_rows,
    "smollm2-batch-1": smollm2_batch1,
    "eagle": eagle_rounds,
    "eagle-trees": eagle_trees,
    "heldout": heldout_acceptance,
    "gpu": gpu_rows,
    "graphs": graphs,
    "llamacpp": llamacpp,
    "prefix": prefix_cache,
    "spec-cost": spec_cost,
    "sampling-filter": sampling_filter,
    "random-llama": random_llama,
    "structured": structured,
    "fast-forward": fast_forward,
    "cpu-kernels": cpu_kernels,
    "isa-compare": isa_compare,
    "isa-compare-avx2": isa_compare_avx2,
    "isa-step-profile": isa_step_profile,
    "quant-1.5b": quant_1p5b,
    "real-size-1.5b": real_size_rows,
    "long-prompt-1.5b": long_prompt_cold_start,
    "agreement-1.5b": agreement,
    "smollm2-q4-1": smollm2_q4_1,
    "concurrency-1.5b": concurrency,
    "step-profile-1.5b": step_profile,
    "ray-scaling": ray_scaling,
    "ray-breakdown": ray_breakdown,
    "ray-split": ray_split,
    "engine-loop-gate": engine_loop_gate,
    "trees": trees,
    "tree-step-profile": tree_step_profile,
}
"""Block name -> the function that renders it. docs/benchmarks.md holds a
``tables`` block that gathers every block but the headline, each under its
own heading (anchors ``results-<name>``)."""


def render(results: Path = RESULTS) -> dict[str, str]:
    """Every block's generated text (without its markers)."""
    blocks = {name: "\n".join(fn(results)) for name, fn in BLOCKS.items()}
    parts = []
    for name, text in blocks.items():
        if name != "headline" and text:
            doc = (BLOCKS[name].__doc__ or name).strip().splitlines()[0]
            parts.append(f'<a id="results-{name}"></a>\n**{doc}**\n\n{text}')
    blocks["tables"] = "\n\n".join(parts)
    return blocks


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"


def apply(text: str, blocks: dict[str, str]) -> str:
    """``text`` with every results block it has marked replaced by the generated one."""
    for name, body in blocks.items():
        start, end = _markers(name)
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        block = f"{start}\n{body}\n{end}" if body else f"{start}\n{end}"
        text = pattern.sub(lambda _m: block, text)  # noqa: B023 - used at once, within this iteration
    return text


def stale_files(paths: tuple[Path, ...] = DOCS, results: Path = RESULTS) -> list[Path]:
    """The docs whose generated blocks differ from what ``results`` gives."""
    blocks = render(results)
    return [p for p in paths if apply(p.read_text(encoding="utf-8"), blocks) != p.read_text(encoding="utf-8")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale blocks (exit 1 if any)")
    args = ap.parse_args(argv)
    stale = stale_files()
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)}: generated result tables are stale; run python -m benchmarks.docs")
        return 1 if stale else 0
    blocks = render()
    for p in stale:
        p.write_text(apply(p.read_text(encoding="utf-8"), blocks), encoding="utf-8")
        print(f"updated {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
