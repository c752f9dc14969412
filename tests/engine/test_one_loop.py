"""One class steps the engine: outside the engine package only ``speculant/engine/loop.py`` calls
``step()``, and the front ends reach each other only through the layers below them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "speculant"
FRONT_ENDS = ("batch", "server", "cli", "bench")


def modules() -> list[tuple[str, ast.Module]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    return [(str(p.relative_to(PACKAGE.parent)), ast.parse(p.read_text(), str(p))) for p in paths]


def step_calls(tree: ast.Module) -> list[int]:
    """Lines calling ``<anything>.step(...)`` or ``getattr(<anything>, "step")``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "step":
                lines.append(node.lineno)
            if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) > 1 and \
                    isinstance(node.args[1], ast.Constant) and node.args[1].value == "step":
                lines.append(node.lineno)
    return lines


def test_only_the_engine_loop_steps_the_engine():
    found = {path: lines for path, tree in modules() if (lines := step_calls(tree))}
    outside = {path: lines for path, lines in found.items()
               if not path.startswith("speculant/engine/") or path == "speculant/engine/llm_engine.py"}
    assert outside == {}, f"these modules step the engine themselves; drive speculant.engine.loop.EngineLoop: {outside}"
    assert "speculant/engine/loop.py" in found  # the check sees the one real caller


def test_the_scan_finds_a_step_call():
    tree = ast.parse("def f(engine):\n    for out in engine.step():\n        pass\n    getattr(engine, 'step')()\n")
    assert step_calls(tree) == [2, 4]


def imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_batch_and_server_do_not_import_each_other():
    crossings = []
    for path, tree in modules():
        parts = Path(path).parts
        if len(parts) < 3 or parts[1] not in ("batch", "server"):
            continue
        other = "server" if parts[1] == "batch" else "batch"
        crossings += [(path, m) for m in imported(tree) if m == f"speculant.{other}" or
                      m.startswith(f"speculant.{other}.")]
    assert crossings == []
