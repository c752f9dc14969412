"""The package's module-level import graph, read with ``ast``: acyclic, the
contract (``speculant.core.interfaces``) a leaf, and core below the plugin
layer.

Only imports that run when a module is imported count: module-level ones,
including those inside ``try`` / ``if`` blocks, but not those inside
functions or under ``if TYPE_CHECKING:``. Function-level imports of speculant
modules are counted separately, to keep the number of cycles dodged that way
in sight.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "speculant"
CONTRACT = "speculant.core.interfaces"
PLUGIN_LAYER = ("speculant.proposers", "speculant.scorers", "speculant.acceptance", "speculant.plugins")
MAX_FUNCTION_LEVEL_IMPORTS = 30
"""Function-level imports of speculant modules: 42 before issue 14, where some
dodged the config <-> compat and core <-> plugins cycles; 30 after: the CLI
sub-commands and ``speculant.bench`` load their heavy parts on use,
``speculant`` and ``speculant.core.interfaces`` resolve names on first use (so
the CLI and the plugin layer load without torch), ``LLM.chat`` and
``resource_checks`` load a helper on use, and ``compat.default_plugins`` is
core's one way up to the plugin layer. Lower it when one goes."""


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)  # speculant modules imported at module level
    function_imports: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (line, modules)


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    """The speculant modules ``node`` imports (``from m import x`` counts ``m.x`` if it is a module)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(parent + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import speculant.core.x.y` binds the closest module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _walk(body: list[ast.stmt], module: Module, package: str, known: set[str], top: bool) -> None:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _targets(node, package, known)
            if top:
                module.imports.update(t for t in targets if t != module.name)
            elif targets:
                module.function_imports.append((node.lineno, tuple(sorted(set(targets)))))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            continue
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(node.body, module, package, known, False)
        else:  # class bodies, if / try / with blocks: their statements run when the module does
            for attr in ("body", "orelse", "finalbody"):
                block = getattr(node, attr, None)
                if isinstance(block, list):
                    _walk(block, module, package, known, top)
            for handler in getattr(node, "handlers", []):
                _walk(handler.body, module, package, known, top)


def import_graph() -> dict[str, Module]:
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    names = {p: _module_name(p) for p in paths}
    known = {name for name, _ in names.values()}
    graph = {}
    for path, (name, is_package) in names.items():
        module = Module(name, path)
        package = name if is_package else name.rpartition(".")[0]
        _walk(ast.parse(path.read_text(encoding="utf-8")).body, module, package, known, True)
        graph[name] = module
    return graph


def find_cycle(graph: dict[str, Module]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name].imports):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, Module]:
    return import_graph()


def test_the_walk_sees_module_level_imports_only():
    source = ast.parse(
        "import speculant.core.config\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from speculant.core.engine import LLMEngine\n"
        "try:\n    from speculant.core import request\nexcept ImportError:\n    pass\n"
        "def f():\n    from speculant.llm import LLM\n"
        "class C:\n    def m(self):\n        import speculant.core.scheduler\n")
    known = {"speculant", "speculant.core", "speculant.core.config", "speculant.core.engine",
             "speculant.core.request", "speculant.llm", "speculant.core.scheduler"}
    module = Module("speculant.x", Path("x.py"))
    _walk(source.body, module, "speculant", known, True)
    assert module.imports == {"speculant.core.config", "speculant.core.request"}
    assert [t for _, t in module.function_imports] == [("speculant.llm",), ("speculant.core.scheduler",)]


def test_a_cycle_is_found():
    graph = {n: Module(n, Path(n)) for n in "abc"}
    graph["a"].imports, graph["b"].imports, graph["c"].imports = {"b"}, {"c"}, {"a"}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    graph["c"].imports = set()
    assert find_cycle(graph) is None


def test_module_level_imports_are_acyclic(graph):
    assert find_cycle(graph) is None


def test_the_contract_imports_nothing_else_from_speculant(graph):
    contract = [m for m in graph.values() if m.name == CONTRACT or m.name.startswith(CONTRACT + ".")]
    assert len(contract) > 1
    for module in contract:
        outside = {i for i in module.imports if not (i == CONTRACT or i.startswith(CONTRACT + "."))}
        assert outside == set(), f"{module.name} imports {sorted(outside)}"


def test_core_imports_no_plugin_layer_at_module_level(graph):
    wrong = {m.name: sorted(i for i in m.imports if i.startswith(PLUGIN_LAYER))
             for m in graph.values() if m.name.startswith("speculant.core")}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_plugin_implementations_depend_on_core_never_the_reverse(graph):
    for module in graph.values():
        if module.name.startswith(("speculant.proposers", "speculant.scorers", "speculant.acceptance")):
            assert not [i for i in module.imports if i.startswith(("speculant.plugins", "speculant.cli",
                                                                   "speculant.llm"))], module.name


def test_function_level_imports_stay_few(graph):
    found = [(m.name, line, targets) for m in graph.values() for line, targets in m.function_imports]
    core_up = [(name, t) for name, _, targets in found if name.startswith("speculant.core")
               for t in targets if t.startswith(PLUGIN_LAYER)]
    assert core_up == [("speculant.core.compat", "speculant.plugins.manager")], \
        "core reaches the plugin layer only in compat.default_plugins"
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, "\n".join(f"{n}:{line} -> {t}" for n, line, t in found)


def test_the_command_line_and_plugin_layer_load_without_torch():
    """Only the step's data types need torch (``speculant.core.interfaces.data``,
    imported on first use): building the CLI parser and loading the plugin
    layer stay fast."""
    code = ("import sys; import speculant.cli as cli, speculant.plugins.manager, speculant.core.compat; "
            "cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_ROOT.parent)
    assert out.stdout.strip() == "False"
