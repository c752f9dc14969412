"""The compatibility matrix: every cell the built-in registry yields is either
a config that validates or a config refused with the checker's reason; the
README carries the current table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speculant.cli import main
from speculant.config.compat import config_problems, validate_config
from speculant.config.matrix import (
    README_END,
    README_START,
    ReadmeMarkersMissing,
    builtin_registry,
    compute_matrix,
    readme_section,
    render_json,
    render_markdown,
    rewrite_readme,
)
from speculant.config.models import ConfigError, EngineConfig
from speculant.plugins.manager import load_plugins, reset_plugins

README = Path(__file__).resolve().parents[2] / "README.md"


def _builtin_cells():
    """Cells of the built-in registry, or one failing sentinel if it cannot be built."""
    reset_plugins()
    loaded = load_plugins()
    try:
        cells = compute_matrix(builtin_registry(loaded.registry))
    except KeyError as exc:
        cells, why = [], str(exc)
    else:
        why = "the built-in registry yielded no cells"
    reset_plugins()
    if not cells:
        errors = "; ".join(str(e) for e in loaded.errors) or "no load errors"
        return [pytest.param(None, id="no-cells")], f"{why} ({errors})"
    return [pytest.param(c, id=f"{c.proposer}-{c.scorer}-{c.acceptance}-"
                                 f"chunked_{'on' if c.enable_chunked_prefill else 'off'}")
            for c in cells], ""


CELLS, NO_CELLS_REASON = _builtin_cells()


def cell_config(cell) -> EngineConfig:
    return EngineConfig.model_validate({
        "model": {"path": "unused", "device": "cpu", "attention_backend": cell.attention_backend},
        "scheduler": {"enable_chunked_prefill": cell.enable_chunked_prefill},
        "speculative": {"proposer": cell.proposer, "scorer": cell.scorer, "acceptance": cell.acceptance,
                        "num_speculative_tokens": cell.num_speculative_tokens},
    })


@pytest.mark.parametrize("cell", CELLS)
def test_builtin_matrix_cell(cell, fresh_plugins):
    assert cell is not None, f"no compatibility-matrix cells to check: {NO_CELLS_REASON}"
    registry = builtin_registry(load_plugins().registry)
    proposer, acceptance = registry.get("proposer", cell.proposer), registry.get("acceptance", cell.acceptance)
    config = cell_config(cell)
    if not cell.supported:
        with pytest.raises(ConfigError) as info:
            validate_config(config, registry)
        assert set(cell.reasons) <= set(info.value.problems)
        return
    required = [n for n, f in proposer.Options.model_fields.items() if f.is_required()]
    if required:  # e.g. a draft model's path: the options cannot be made up here
        assert not [p for p in config_problems(config, registry) if not p.startswith("speculative.proposer_options")]
    else:
        assert validate_config(config, registry) is config
        proposer.Options()
        acceptance.Options()


def test_readme_matrix_is_current(fresh_plugins):
    text = README.read_text(encoding="utf-8") if README.is_file() else ""
    try:
        current = readme_section(text, "README.md")
    except ReadmeMarkersMissing as exc:
        pytest.fail(str(exc))
    expected = render_markdown(compute_matrix(builtin_registry(load_plugins().registry)))
    assert current == expected, "README.md's compatibility matrix is stale: run " \
                                "`speculant plugins matrix --write-readme README.md`"


# ---- the machinery on test plugins --------------------------------------------------------------


@pytest.fixture
def small_registry(make_class, make_registry):
    return make_registry(
        proposer=[make_class("proposer", "lookup"),
                  make_class("proposer", "heads", needs_target_hidden_states=True,
                             needs_prompt_hidden_states=True, supports_chunked_prefill=False,
                             max_num_speculative_tokens=2),
                  make_class("proposer", "sampled", draft_probs="none")],
        scorer=[make_class("scorer", "mqa", needs_multi_token_queries=True)],
        acceptance=[make_class("acceptance", "exact", supports_structured_output=True)],
        attention_backend=[make_class("attention_backend", "torch")],
    )


def test_compute_matrix_cells(small_registry):
    cells = {(c.proposer, c.enable_chunked_prefill): c for c in compute_matrix(small_registry)}
    assert len(cells) == 3 * 2
    assert cells[("lookup", True)].label() == "✅"
    assert cells[("heads", False)].label() == "✅"
    assert cells[("heads", False)].num_speculative_tokens == 2  # clipped to the proposer's maximum
    assert cells[("heads", True)].label() == "❌ needs hidden states at every prompt position"
    assert cells[("sampled", True)].label() == "✅ greedy only: draft distribution unknown"
    assert cells[("sampled", True)].supported and cells[("sampled", True)].greedy_only
    assert all(c.structured_output for c in cells.values() if c.supported)


def test_an_acceptance_method_without_structured_output_is_noted(make_class, make_registry):
    reg = make_registry(proposer=[make_class("proposer", "lookup")], scorer=[make_class("scorer", "mqa")],
                        acceptance=[make_class("acceptance", "plain")],
                        attention_backend=[make_class("attention_backend", "torch")])
    cell = compute_matrix(reg)[0]
    assert cell.label() == "✅ no structured output: acceptance"
    assert cell.supported and not cell.greedy_only and not cell.structured_output
    assert cell.as_dict()["structured_reasons"][0].startswith("acceptance 'plain' does not declare")


# Every rule an incompatible plugin trips, written out by hand: what the matrix and the config
# check must say for it (a rule that stops firing, or says something else, fails here).
HEADS_NEEDS_PROMPT_STATES = (
    "proposer 'x_heads' needs the target's hidden state at every prompt position, which chunked prefill splits "
    "across steps: set scheduler.enable_chunked_prefill = false or choose another proposer")
ACCEPTANCE_NEEDS_FULL_PROBS = (
    "acceptance 'x_full' needs the proposer's full draft distribution, but proposer 'x_heads' provides only its "
    "proposed tokens (draft_probs = 'one_hot'): choose a proposer with draft_probs = 'full' or set "
    "speculative.acceptance to a method that does not need draft probabilities")
K_ABOVE_MAXIMUM = (
    "speculative.num_speculative_tokens = 3 is above the maximum of proposer 'x_heads' (2 tokens per step): "
    "set speculative.num_speculative_tokens to at most 2")
SCORER_NEEDS_MULTI_TOKEN = (
    "scorer 'x_mqa' needs attention over multi-token queries, which attention backend 'x_single' does not "
    "provide (multi_token_queries = false): set model.attention_backend to a backend with multi-token queries "
    "or set speculative.scorer to one that scores single-token rows")
SCORER_CANNOT_MIX = (
    "scorer 'x_mqa' cannot score prefill chunks and speculating decodes in one target forward "
    "(supports_mixed_prefill_decode = false), which chunked prefill does every step: set "
    "scheduler.enable_chunked_prefill = false or choose another scorer")
BACKEND_CANNOT_CHUNK = (
    "attention backend 'x_single' cannot attend from several query tokens over a cached prefix "
    "(multi_token_queries = false), which every prefill chunk after the first does: set "
    "scheduler.enable_chunked_prefill = false or set model.attention_backend to another backend")


def test_incompatible_plugin_reasons(fresh_plugins, make_class, fake_plugin):
    from speculant.plugins.manager import register_plugin, unregister_plugin

    plugin = fake_plugin(
        proposers=[make_class("proposer", "x_heads", needs_target_hidden_states=True, needs_prompt_hidden_states=True,
                              supports_chunked_prefill=False, max_num_speculative_tokens=2)],
        scorers=[make_class("scorer", "x_mqa", needs_multi_token_queries=True, supports_mixed_prefill_decode=False)],
        acceptance=[make_class("acceptance", "x_full", needs_draft_probs=True)],
        backends=[make_class("attention_backend", "x_single", multi_token_queries=False)])
    register_plugin(plugin, "matrix-incompatible")
    try:
        registry = load_plugins().registry
        cells = {c.enable_chunked_prefill: c for c in compute_matrix(registry, attention_backend="x_single")
                 if (c.proposer, c.scorer, c.acceptance) == ("x_heads", "x_mqa", "x_full")}
        # the matrix clips k to the proposer's maximum, so the k rule never decides a cell
        assert cells[False].num_speculative_tokens == 2
        assert cells[False].reasons == [ACCEPTANCE_NEEDS_FULL_PROBS, SCORER_NEEDS_MULTI_TOKEN]
        assert cells[True].reasons == [HEADS_NEEDS_PROMPT_STATES, ACCEPTANCE_NEEDS_FULL_PROBS,
                                       SCORER_NEEDS_MULTI_TOKEN, SCORER_CANNOT_MIX, BACKEND_CANNOT_CHUNK]
        assert not cells[True].supported and not cells[False].supported
        config = EngineConfig.model_validate({
            "model": {"path": "unused", "device": "cpu", "attention_backend": "x_single"},
            "scheduler": {"enable_chunked_prefill": True},
            "speculative": {"proposer": "x_heads", "scorer": "x_mqa", "acceptance": "x_full",
                            "num_speculative_tokens": 3}})
        with pytest.raises(ConfigError) as info:
            validate_config(config, registry)
        assert info.value.problems == [HEADS_NEEDS_PROMPT_STATES, ACCEPTANCE_NEEDS_FULL_PROBS, K_ABOVE_MAXIMUM,
                                       SCORER_NEEDS_MULTI_TOKEN, SCORER_CANNOT_MIX, BACKEND_CANNOT_CHUNK]
    finally:
        unregister_plugin("matrix-incompatible")


def test_markdown_and_json(small_registry):
    cells = compute_matrix(small_registry)
    md = render_markdown(cells)
    assert ("| heads | mqa | exact | ✅ | ❌ needs hidden states at every prompt position | ❌ proposer proposes "
            "chains only; scorer cannot verify trees; acceptance takes chains only; backend lacks tree attention |"
            ) in md.splitlines()
    data = render_json(cells)
    assert json.loads(json.dumps(data)) == data
    heads_on = next(d for d in data if d["proposer"] == "heads" and d["enable_chunked_prefill"])
    assert heads_on["supported"] is False
    assert heads_on["reasons"][0].startswith("proposer 'heads' needs the target's hidden state")
    assert heads_on["token_trees"] is False
    assert heads_on["tree_reasons"][0] == (
        "speculative.tree_width = 2, but proposer 'heads' proposes chains only (proposes_trees = false), so a tree "
        "width would change nothing: set speculative.tree_width = 1 (chains) or choose a proposer that proposes "
        "trees")


def test_rewrite_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{README_START}\nold table\n{README_END}\n\nafter\n")
    assert rewrite_readme(readme, "| a |\n") is True
    assert readme.read_text() == f"# Title\n\n{README_START}\n\n| a |\n\n{README_END}\n\nafter\n"
    assert readme_section(readme.read_text()) == "| a |\n"
    assert rewrite_readme(readme, "| a |\n") is False


def test_rewrite_readme_without_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n")
    with pytest.raises(ReadmeMarkersMissing, match="add a line <!-- compat-matrix:start -->"):
        rewrite_readme(readme, "| a |\n")


def test_matrix_cli(fresh_plugins, make_class, fake_plugin, capsys):
    from speculant.plugins.manager import register_plugin, unregister_plugin

    plugin = fake_plugin(proposers=[make_class("proposer", "m_lookup")], scorers=[make_class("scorer", "m_mqa")],
                        acceptance=[make_class("acceptance", "m_exact", supports_structured_output=True)],
                        backends=[make_class("attention_backend", "m_attn")])
    register_plugin(plugin, "matrix-tests")
    try:
        assert main(["plugins", "matrix", "--backend", "m_attn"]) == 0
        out = capsys.readouterr().out
        assert "| m_lookup | m_mqa | m_exact | ✅ | ✅ |" in out
        assert main(["plugins", "matrix", "--json", "--backend", "m_attn"]) == 0
        cells = json.loads(capsys.readouterr().out)
        chunked = {(c["proposer"], c["enable_chunked_prefill"]) for c in cells}
        assert chunked >= {("m_lookup", False), ("m_lookup", True)}
        assert main(["plugins", "matrix", "--backend", "no_such_backend"]) == 1
        assert "no attention backend named 'no_such_backend'" in capsys.readouterr().err
    finally:
        unregister_plugin("matrix-tests")
