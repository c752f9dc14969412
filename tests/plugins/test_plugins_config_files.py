"""Config files select plugins by name: TOML and YAML round-trip, and every
problem comes back at once with the file and the key path."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from speculant.cli import main
from speculant.cli.config_cmd import format_settings
from speculant.config.compat import build_config, load_config
from speculant.config.models import ConfigError

TOML = """
[model]
path = "models/tiny"
attention_backend = "t_attn"
device = "cpu"

[scheduler]
max_num_batched_tokens = 64
enable_chunked_prefill = true

[speculative]
proposer = "t_lookup"
scorer = "t_mqa"
acceptance = "t_exact"
num_speculative_tokens = 3
disable_by_batch_size = 8
"""

YAML = """
model:
  path: models/tiny
  attention_backend: t_attn
  device: cpu
scheduler:
  max_num_batched_tokens: 64
  enable_chunked_prefill: true
speculative:
  proposer: t_lookup
  scorer: t_mqa
  acceptance: t_exact
  num_speculative_tokens: 3
  disable_by_batch_size: 8
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name, text", [("engine.toml", TOML), ("engine.yaml", YAML)])
def test_file_selects_plugins(tmp_path, test_plugin, name, text):
    cfg = load_config(write(tmp_path, name, text))
    assert cfg.speculative.proposer == "t_lookup"
    assert cfg.speculative.num_speculative_tokens == 3
    assert cfg.speculative.disable_by_batch_size == 8


@pytest.mark.parametrize("fmt", ["toml", "yaml", "json"])
def test_round_trip(tmp_path, test_plugin, fmt):
    original = load_config(write(tmp_path, "engine.toml", TOML), ["speculative.proposer_options={}"])
    suffix = {"toml": "toml", "yaml": "yaml", "json": "yaml"}[fmt]  # JSON is valid YAML
    dumped = write(tmp_path, f"dumped.{suffix}", format_settings(original, fmt))
    again = load_config(dumped)
    assert again == original
    assert format_settings(again, fmt) == format_settings(original, fmt)


def test_toml_and_yaml_give_the_same_config(tmp_path, test_plugin):
    assert load_config(write(tmp_path, "a.toml", TOML)) == load_config(write(tmp_path, "a.yaml", YAML))


def test_round_trip_of_nested_options(tmp_path, test_plugin):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli backport, a dependency there
        import tomli as tomllib

    from speculant.cli.config_cmd import dump_toml

    data = {"speculative": {"proposer_options": {"paths": ["a b", "c\"d"], "weights": {"x y": 0.5, "z": True}},
                            "num_speculative_tokens": 2}}
    assert tomllib.loads(dump_toml(data)) == data


def test_errors_carry_file_and_key_path(tmp_path, test_plugin):
    path = write(tmp_path, "bad.toml", TOML.replace('proposer = "t_lookup"', 'proposer = "t_lookup"\n'
                                                      'proposer_options = { max_nn = 3 }'))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    assert str(info.value).startswith(f"invalid configuration in {path}:\n")
    assert info.value.problems == ["speculative.proposer_options.max_nn: unknown key; allowed keys: max_n, min_n"]


def test_yaml_errors_carry_file_and_key_path(tmp_path, test_plugin):
    path = write(tmp_path, "bad.yaml", YAML.replace("proposer: t_lookup", "proposer: t_lokup"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.source == str(path)
    problem = info.value.problems[0]
    assert problem.startswith("speculative.proposer = 't_lokup': no proposer named 't_lokup'; available: ")
    assert "t_heads, t_lookup" in problem and "(did you mean 't_lookup'?)" in problem


def test_unsupported_combination_never_reaches_the_engine(tmp_path, test_plugin):
    path = write(tmp_path, "heads.toml", TOML.replace('proposer = "t_lookup"', 'proposer = "t_heads"'))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "proposer 't_heads' needs the target's hidden state at every prompt position, which chunked prefill "
        "splits across steps: set scheduler.enable_chunked_prefill = false or choose another proposer"]
    assert load_config(path, ["scheduler.enable_chunked_prefill=false"]).speculative.proposer == "t_heads"


def test_schema_and_plugin_problems_reported_together(tmp_path, test_plugin):
    text = TOML.replace("max_num_batched_tokens = 64", "max_num_batched_token = 64").replace(
        'scorer = "t_mqa"', 'scorer = "t_mqq"')
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "two.toml", text))
    problems = [p for p in info.value.problems if "plugin(s) failed to load" not in p]  # built-ins may be absent
    assert problems[0].startswith("scheduler.max_num_batched_token: unknown key; allowed keys: ")
    assert problems[1].startswith("speculative.scorer = 't_mqq': no scorer named 't_mqq'")
    assert len(problems) == 2


def test_build_config_without_speculation_loads_no_plugins(fresh_plugins):
    from speculant.plugins import manager

    cfg = build_config({"model": {"path": "m"}})
    assert not cfg.speculative.enabled and manager._loaded is None


def test_config_check_cli_prints_settings(tmp_path, test_plugin, capsys):
    path = write(tmp_path, "engine.yaml", YAML)
    assert main(["config", "check", str(path), "--set", "speculative.num_speculative_tokens=2",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speculative"]["num_speculative_tokens"] == 2
    assert out["cache"]["block_size"] == 16  # defaults are filled in


def test_config_check_cli_toml_names_resolved_plugins(tmp_path, test_plugin, capsys):
    assert main(["config", "check", str(write(tmp_path, "engine.toml", TOML))]) == 0
    out = capsys.readouterr().out
    assert "# speculative.proposer = 't_lookup': " in out and "from plugin 'tests'" in out
    assert "[speculative]" in out


def test_config_check_cli_reports_every_problem(tmp_path, test_plugin, capsys):
    text = TOML.replace('acceptance = "t_exact"', 'acceptance = "t_exakt"').replace(
        'scorer = "t_mqa"', 'scorer = "t_mqq"')
    assert main(["config", "check", str(write(tmp_path, "bad.toml", text))]) == 1
    err = capsys.readouterr().err
    assert "speculative.scorer = 't_mqq'" in err and "speculative.acceptance = 't_exakt'" in err
    assert str(tmp_path / "bad.toml") in err


def test_yaml_written_by_hand_parses_like_dumped_yaml(tmp_path, test_plugin):
    cfg = load_config(write(tmp_path, "engine.yaml", YAML))
    assert yaml.safe_load(format_settings(cfg, "yaml")) == cfg.model_dump(mode="json")


def test_unknown_name_mentions_plugins_that_failed_to_load(site, tmp_path):
    site.add_module("broken_provider", "import a_dependency_that_is_missing\n")
    site.add_dist("provider-pkg", "1.0", {"provider": "broken_provider"})
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "engine.toml", TOML))
    note = info.value.problems[-1]
    assert note.startswith("1 plugin(s) failed to load") or note.startswith("2 plugin(s) failed to load")
    assert "which may be why a name above is unknown" in note
    assert "Run `speculant plugins` to see every load error" in note


def test_no_load_error_note_when_names_resolve(site, tmp_path, fake_plugin, standard_fakes_factory):
    """A broken, unrelated plugin does not clutter a config whose names all resolve."""
    site.add_module("broken_unrelated", "import a_dependency_that_is_missing\n")
    site.add_dist("unrelated-pkg", "1.0", {"unrelated": "broken_unrelated"})
    from speculant.plugins.manager import load_plugins, register_plugin, unregister_plugin

    assert any(e.source.entry_point == "unrelated" for e in load_plugins().errors)
    register_plugin(fake_plugin(**standard_fakes_factory()), "tests")
    try:
        path = write(tmp_path, "heads.toml", TOML.replace('proposer = "t_lookup"', 'proposer = "t_heads"'))
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert len(info.value.problems) == 1
    finally:
        unregister_plugin("tests")
