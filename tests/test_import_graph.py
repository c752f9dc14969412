"""The package's module-level import graph, read with ``ast``: the layering
of docs/ARCHITECTURE.md, with no circle, type-only imports included.

Layers, bottom to top (a module imports only its own layer or lower ones):

0. ``speculant.interfaces`` (the contract) and ``speculant.version``;
1. ``speculant.sampling`` (sampler, logits processing, acceptance arithmetic);
2. ``speculant.config`` (config models, compatibility rules);
3. ``speculant.model`` (runner, loading, attention backends, linears);
4. ``speculant.engine`` (requests, scheduler, the step pipeline, the engine);
5. ``speculant.plugins`` (hookspecs, manager, registry; not ``builtin``): the
   layers below get its registry handed in, or through the loader ``import
   speculant`` installs (``interfaces.catalog``), never by importing it;
6. the built-in plugins: ``proposers``, ``scorers``, ``acceptance``, ``plugins.builtin``,
   which never import the engine (they get what it hands plugins: the contract);
7. the Python API: ``speculant`` itself, ``llm``, ``chat``, ``plugin_api``;
8. the front ends: ``cli``, ``server``, ``bench``.

Module-level imports (including those inside ``try`` / ``if`` blocks) and
type-only ones (under ``if TYPE_CHECKING:``) both count. Imports inside
functions are counted separately: they must respect the layering too, and
their number stays in sight.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "speculant"
CONTRACT = "speculant.interfaces"
LAYERS: list[tuple[str, ...]] = [
    ("speculant.interfaces", "speculant.version"),
    ("speculant.sampling",),
    ("speculant.config",),
    ("speculant.model",),
    ("speculant.engine",),
    ("speculant.plugins",),
    ("speculant.proposers", "speculant.scorers", "speculant.acceptance", "speculant.plugins.builtin"),
    ("speculant", "speculant.llm", "speculant.chat", "speculant.plugin_api"),
    ("speculant.cli", "speculant.server", "speculant.bench", "speculant.batch"),
]
MAX_FUNCTION_LEVEL_IMPORTS = 32
"""Function-level imports of speculant modules: the CLI sub-commands and
``speculant.bench`` load their heavy parts on use, ``speculant`` and
``speculant.interfaces`` resolve names on first use (so the CLI and the
plugin layer load without torch), ``speculant batch`` builds its engine where
it runs (the local job, a Ray actor: the ``--ray`` driver loads no torch).
Lower it when one goes."""


def layer_of(name: str) -> int:
    """The layer of module ``name``: the one whose longest prefix matches."""
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


@dataclass
class Module:
    name: str
    path: Path
    imports: set[str] = field(default_factory=set)  # speculant modules imported at module level
    type_imports: set[str] = field(default_factory=set)  # ... under ``if TYPE_CHECKING:``
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
        while name and name not in known:  # `import speculant.engine.x.y` binds the closest module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _walk(body: list[ast.stmt], module: Module, package: str, known: set[str], top: bool,
          typing_only: bool = False) -> None:
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            targets = _targets(node, package, known)
            if top:
                into = module.type_imports if typing_only else module.imports
                into.update(t for t in targets if t != module.name)
            elif targets:
                module.function_imports.append((node.lineno, tuple(sorted(set(targets)))))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            _walk(node.body, module, package, known, top, typing_only=True)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(node.body, module, package, known, False)
        else:  # class bodies, if / try / with blocks: their statements run when the module does
            for attr in ("body", "orelse", "finalbody"):
                block = getattr(node, attr, None)
                if isinstance(block, list):
                    _walk(block, module, package, known, top, typing_only)
            for handler in getattr(node, "handlers", []):
                _walk(handler.body, module, package, known, top, typing_only)


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
        for dep in sorted(graph[name].imports | graph[name].type_imports):
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


def test_the_walk_sees_module_level_and_type_only_imports():
    source = ast.parse(
        "import speculant.config.models\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from speculant.engine.llm_engine import LLMEngine\n"
        "try:\n    from speculant.engine import request\nexcept ImportError:\n    pass\n"
        "def f():\n    from speculant.llm import LLM\n"
        "class C:\n    def m(self):\n        import speculant.engine.scheduler\n")
    known = {"speculant", "speculant.engine", "speculant.config.models", "speculant.engine.llm_engine",
             "speculant.engine.request", "speculant.llm", "speculant.engine.scheduler"}
    module = Module("speculant.x", Path("x.py"))
    _walk(source.body, module, "speculant", known, True)
    assert module.imports == {"speculant.config.models", "speculant.engine.request"}
    assert module.type_imports == {"speculant.engine.llm_engine"}
    assert [t for _, t in module.function_imports] == [("speculant.llm",), ("speculant.engine.scheduler",)]


def test_a_cycle_is_found():
    graph = {n: Module(n, Path(n)) for n in "abc"}
    graph["a"].imports, graph["b"].imports, graph["c"].imports = {"b"}, {"c"}, {"a"}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    graph["c"].imports = set()
    assert find_cycle(graph) is None


def test_module_level_imports_are_acyclic_type_only_ones_included(graph):
    assert find_cycle(graph) is None


def test_every_module_has_a_layer(graph):
    assert [name for name in graph if layer_of(name) < 0] == []


def test_the_layering_is_respected_type_only_and_function_level_imports_included(graph):
    wrong = []
    for module in graph.values():
        function_level = {t for _, targets in module.function_imports for t in targets}
        for dep in sorted(module.imports | module.type_imports | function_level):
            if layer_of(dep) > layer_of(module.name):
                wrong.append(f"{module.name} (layer {layer_of(module.name)}) imports {dep} "
                             f"(layer {layer_of(dep)})")
    assert wrong == []


def test_a_layer_violation_is_seen():
    assert layer_of("speculant.engine.step") > layer_of("speculant.model.runner") > layer_of("speculant.config.models")
    assert layer_of("speculant.plugins.builtin") > layer_of("speculant.plugins.registry") > \
        layer_of("speculant.engine.llm_engine") > layer_of("speculant.config.compat")
    assert layer_of("speculant") > layer_of("speculant.proposers.ngram")


def test_the_contract_imports_nothing_else_from_speculant(graph):
    contract = [m for m in graph.values() if m.name == CONTRACT or m.name.startswith(CONTRACT + ".")]
    assert len(contract) > 1
    for module in contract:
        function_level = {t for _, targets in module.function_imports for t in targets}
        deps = module.imports | module.type_imports | function_level
        outside = {i for i in deps if not (i == CONTRACT or i.startswith(CONTRACT + "."))}
        assert outside == set(), f"{module.name} imports {sorted(outside)}"


BUILT_INS = ("speculant.proposers", "speculant.scorers", "speculant.acceptance")


def test_the_built_ins_never_import_the_engine(graph):
    """Built-in plugins are written against the contract like anyone's: no
    ``speculant.engine`` import in any form (module level, type-only, inside a function)."""
    wrong = []
    for module in graph.values():
        if not module.name.startswith(BUILT_INS):
            continue
        function_level = {t for _, targets in module.function_imports for t in targets}
        for dep in sorted(module.imports | module.type_imports | function_level):
            if dep == "speculant.engine" or dep.startswith("speculant.engine."):
                wrong.append(f"{module.name} imports {dep}")
    assert wrong == []


def test_the_plugin_api_reexports_only_the_contract(graph):
    deps = graph["speculant.plugin_api"].imports | graph["speculant.plugin_api"].type_imports
    assert {d for d in deps if not d.startswith(CONTRACT)} == {"speculant.plugins.hookspecs"}


def test_function_level_imports_stay_few(graph):
    found = [(m.name, line, targets) for m in graph.values() for line, targets in m.function_imports]
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, "\n".join(f"{n}:{line} -> {t}" for n, line, t in found)


def test_the_command_line_and_plugin_layer_load_without_torch():
    """Only the step's data types need torch (``speculant.interfaces.data``,
    imported on first use): building the CLI parser and loading the plugin
    layer stay fast, and so does the driver of ``speculant batch --ray``
    (its engines load in the actors)."""
    code = ("import sys; import speculant.cli as cli, speculant.plugins.manager, speculant.config.compat; "
            "import speculant.batch.command; cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_ROOT.parent)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("overrides", [
    [],  # examples/demo.toml: a draft model verified by MQA
    ["speculative.proposer=ngram", "speculative.proposer_options={}", "model.attention_backend=cpu_kernel"],
    ["speculative.proposer=suffix", "speculative.proposer_options={}", "speculative.scorer=batch_expansion"],
])
def test_checking_a_config_loads_no_model_code(overrides):
    """The driver of ``speculant batch --ray`` checks the config (plugins loaded, every rule run) and runs no
    engine: it must not import transformers' model classes or our runner (~2 s that each actor pays again)."""
    code = ("import sys; from speculant.config.compat import build_config; "
            "from speculant.config.models import read_config; "
            f"build_config(read_config('examples/demo.toml', {overrides!r}), 'demo.toml'); "
            "print(sorted(m for m in ('transformers.modeling_utils', 'speculant.model.runner', "
            "'speculant.model.loading.hf_model', 'speculant.engine.llm_engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE_ROOT.parent)
    assert out.stdout.strip() == "[]", out.stdout
