"""``speculant serve`` refuses bad arguments and configs before opening a port."""

from __future__ import annotations

import pytest

from speculant.cli import main


@pytest.mark.parametrize("argv,message", [
    (["serve"], "pass --config FILE (TOML/YAML) or --model DIR|FILE.gguf"),
    (["serve", "--model", "m", "--max-queued", "0"], "--max-queued 0: must be at least 1"),
    (["serve", "--model", "m", "--port", "70000"], "--port 70000: must be in [0, 65535]"),
    (["serve", "--model", "m", "--threads", "0"], "--threads 0: need at least 1 thread"),
])
def test_bad_arguments_exit_2_with_the_reason(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_bad_config_exits_2_naming_the_problem(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('[model]\npath = "models/demo-target"\n[scheduler]\nmax_num_seqs = 0\n')
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "scheduler.max_num_seqs" in err and str(config) in err
