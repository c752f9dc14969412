"""``speculant serve`` refuses bad arguments and configs before opening a port,
and refuses to listen beyond loopback without an API key (with ``--ray`` too)."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from speculant.cli import main
from speculant.cli.serve_cmd import is_loopback
from speculant.server.body_limit import DEFAULT_MAX_REQUEST_BYTES

EXPOSED = "--allow-unauthenticated"


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv("SPECULANT_API_KEY", raising=False)


@pytest.mark.parametrize("argv,message", [
    (["serve"], "pass --config FILE (TOML/YAML) or --model DIR|FILE.gguf"),
    (["serve", "--model", "m", "--max-queued", "0"], "--max-queued 0: must be at least 1"),
    (["serve", "--model", "m", "--port", "70000"], "--port 70000: must be in [0, 65535]"),
    (["serve", "--model", "m", "--threads", "0"], "--threads 0: need at least 1 thread"),
    (["serve", "--model", "m", "--max-request-bytes", "0"], "--max-request-bytes 0: must be at least 1 byte"),
    (["serve", "--model", "m", "--api-key", ""], "--api-key: key 1 of 1 is empty"),
    (["serve", "--model", "m", "--api-key", "ok", "--api-key", "with space"], "--api-key: key 2 of 2 holds a space"),
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


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-host.example"])
def test_listening_beyond_loopback_without_a_key_is_refused_at_start(chat_model_dir, host, capsys):
    """A model that would load: the refusal comes first, and names both ways out."""
    assert main(["serve", "--model", str(chat_model_dir), "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"--host {host} listens beyond this machine" in err and "--api-key" in err and EXPOSED in err, err


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed: pip install speculant[ray]")
@pytest.mark.parametrize("replicas", ["1", "2"])
def test_serving_on_ray_beyond_loopback_without_a_key_is_refused_at_start(chat_model_dir, replicas, monkeypatch,
                                                                          capsys):
    """``--ray`` (Ray Serve's proxy listens on --host) is refused the same way, before Ray starts."""
    started = types.ModuleType("speculant.server.ray_serve")  # in place of the real one, which would start Ray
    started.serve_on_ray = lambda args: pytest.fail("Ray Serve started on an open host")
    monkeypatch.setitem(sys.modules, "speculant.server.ray_serve", started)
    assert main(["serve", "--model", str(chat_model_dir), "--ray", "--replicas", replicas, "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 listens beyond this machine" in err and "--api-key" in err and EXPOSED in err, err


@pytest.mark.parametrize("extra,env", [([EXPOSED], None), (["--api-key", "k"], None), ([], "k1, k2")])
def test_a_key_or_allow_unauthenticated_lifts_the_refusal(extra, env, monkeypatch, tmp_path, capsys):
    """These get past the check, and stop at the next one (a bad config) before a port opens."""
    if env is not None:
        monkeypatch.setenv("SPECULANT_API_KEY", env)
    config = tmp_path / "bad.toml"
    config.write_text('[model]\npath = "models/demo-target"\n[scheduler]\nmax_num_seqs = 0\n')
    assert main(["serve", "--config", str(config), "--host", "0.0.0.0", *extra]) == 2
    err = capsys.readouterr().err
    assert "listens beyond this machine" not in err and "scheduler.max_num_seqs" in err, err


def test_keys_from_the_environment_are_checked_without_being_shown(monkeypatch, capsys):
    monkeypatch.setenv("SPECULANT_API_KEY", "secret-one,,secret-two")
    assert main(["serve", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "SPECULANT_API_KEY: key 2 of 3 is empty" in err and "stray comma" in err and "secret" not in err


def test_loopback_hosts():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))


def test_help_states_the_default_body_limit(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert str(DEFAULT_MAX_REQUEST_BYTES) in capsys.readouterr().out
