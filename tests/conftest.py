from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from tiny_models import build_model, build_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """One tiny random model per architecture (llama, qwen2, mistral-GQA)."""
    out = {}
    for arch in ("llama", "qwen2", "mistral"):
        out[arch] = build_model(arch, tmp_path_factory.mktemp(arch), tokenizer_dir)
    return out


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]
