"""``speculant.plugin_api``: one import path for plugin authors. The README's
example proposer runs as written; the example package needs nothing else; the
hooks are the kind table's."""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import pytest

import speculant.plugin_api as api
from speculant import LLM, SamplingParams
from speculant.interfaces import PLUGIN_KINDS
from speculant.plugins import hookspecs
from speculant.plugins.manager import register_plugin, unregister_plugin

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12, 9, 10, 11]]


def readme_example() -> str:
    """The Python block of the README's "Writing a plugin" section."""
    section = (ROOT / "README.md").read_text().split("## Writing a plugin", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


def test_every_public_name_resolves():
    assert sorted(api.__all__) == sorted(set(api.__all__))
    for name in api.__all__:
        assert getattr(api, name) is not None
    from speculant.plugins import hookimpl

    assert api.hookimpl is hookimpl


def test_hooks_are_the_kind_table():
    specs = {name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
             if hasattr(fn, "speculant_spec")}
    assert specs == {k.hook for k in PLUGIN_KINDS.values()}


def test_the_readme_example_needs_one_import_path():
    tree = ast.parse(readme_example())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m for m in modules if m.startswith("speculant")} == {"speculant.plugin_api"}
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Proposer")]
    assert cls.end_lineno - cls.lineno + 1 <= 20


def test_the_example_package_needs_one_import_path():
    sources = sorted((ROOT / "examples" / "plugin-package" / "src").rglob("*.py"))
    assert sources
    for path in sources:
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert {m for m in imported if m and m.split(".")[0] == "speculant"} <= {"speculant.plugin_api"}, path


@pytest.fixture
def readme_plugin(fresh_plugins):
    module = types.ModuleType("speculant_lookback_plugin")
    exec(compile(readme_example(), "README.md", "exec"), module.__dict__)
    register_plugin(module, "readme-example")
    try:
        yield module
    finally:
        unregister_plugin("readme-example")


def test_the_readme_example_runs_and_keeps_greedy_output(readme_plugin, llama_dir):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    base = LLM(model=str(llama_dir), max_num_seqs=4)
    expected = [o.outputs[0].token_ids for o in base.generate(PROMPTS, params, use_tqdm=False)]
    llm = LLM(model=str(llama_dir), max_num_seqs=4,
              speculative={"proposer": "lookback", "proposer_options": {"window": 64}, "num_speculative_tokens": 3})
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)] == expected
    assert llm.get_metrics()["num_draft_tokens"] > 0


@pytest.mark.slow
def test_the_readme_example_passes_the_conformance_kit(readme_plugin, kit_models):
    from speculant.plugin_api.testing import check_proposer

    report = check_proposer(readme_plugin.LookbackProposer, kit_models, options={"window": 64})
    assert report.num_draft_tokens > 0
