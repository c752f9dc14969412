"""The compatibility matrix: every cell the built-in registry yields is either
a config that validates or a config refused with the checker's reason; the
README carries the current table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speculant.cli import main
from speculant.config.compat import combination_reasons, config_problems, validate_config
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
    proposer, scorer, acceptance = (registry.get(k, n) for k, n in
                                    (("proposer", cell.proposer), ("scorer", cell.scorer),
                                     ("acceptance", cell.acceptance)))
    backend = registry.get("attention_backend", cell.attention_backend)
    reasons = combination_reasons(proposer, scorer, acceptance, backend,
                                  enable_chunked_prefill=cell.enable_chunked_prefill,
                                  num_speculative_tokens=cell.num_speculative_tokens, sampling=False)
    assert reasons == cell.reasons
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
        acceptance=[make_class("acceptance", "exact")],
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


def test_markdown_and_json(small_registry):
    cells = compute_matrix(small_registry)
    md = render_markdown(cells)
    assert "| heads | mqa | exact | ✅ | ❌ needs hidden states at every prompt position |" in md.splitlines()
    data = render_json(cells)
    assert json.loads(json.dumps(data)) == data
    heads_on = next(d for d in data if d["proposer"] == "heads" and d["enable_chunked_prefill"])
    assert heads_on["supported"] is False
    assert heads_on["reasons"][0].startswith("proposer 'heads' needs the target's hidden state")


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
                        acceptance=[make_class("acceptance", "m_exact")],
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
