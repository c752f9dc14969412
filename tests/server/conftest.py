"""Fixtures of the server tests: a tiny model with a chat template, its config,
and the main ``speculant serve`` process (started once per session, stopped with
SIGTERM at the end, which must exit 0)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from server_proc import CHAT_TEMPLATE, ServerProcess, engine_config, write_toml
from transformers import AutoTokenizer

from speculant import LLM

MAX_NUM_SEQS = 16


@pytest.fixture(scope="session")
def chat_model_dir(llama_dir, tmp_path_factory) -> Path:
    """The tiny llama with a chat template."""
    out = tmp_path_factory.mktemp("chat-llama")
    for f in Path(llama_dir).iterdir():
        shutil.copy(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def server(chat_model_dir, tmp_path_factory):
    """The main server: n-gram speculation, a small KV pool, up to 256 queued."""
    d = tmp_path_factory.mktemp("server")
    config = write_toml(engine_config(chat_model_dir, max_num_seqs=MAX_NUM_SEQS), d / "serve.toml")
    proc = ServerProcess(["--config", str(config), "--served-model-name", "tiny"], d).start()
    yield proc
    assert proc.stop() == 0, proc.read_log()


@pytest.fixture(scope="session")
def reference(chat_model_dir):
    """The offline API on the same model, without speculation and with a pool
    that never preempts: what every greedy request must equal."""
    data = engine_config(chat_model_dir, proposer=None, num_blocks=4096)
    return LLM.from_dict(data, "reference")


@pytest.fixture(scope="session")
def spec_reference(chat_model_dir):
    """The offline API with the server's own config: seeded sampling draws
    depend on the proposals verified, so they equal this, run alone."""
    return LLM.from_dict(engine_config(chat_model_dir), "spec reference")
