"""``speculant bench --llamacpp FILE.gguf``: llama.cpp rows beside Speculant's,
measured the same way. llama-cpp-python is a benchmark dependency only, so
these tests drive the rows through a stand-in module with its interface."""

from __future__ import annotations

import sys
import types

import pytest

from speculant.bench import llamacpp
from speculant.cli import main


class FakeLlama:
    """llama_cpp.Llama's interface: greedy continuation = the prompt's last token + 1, forever."""

    loaded: list[dict] = []

    def __init__(self, model_path, **kwargs) -> None:
        FakeLlama.loaded.append({"model_path": model_path, **kwargs})

    def n_vocab(self) -> int:
        return 1000

    def reset(self) -> None:
        pass

    def generate(self, tokens, **sampling):
        assert sampling["top_k"] == 1 and sampling["temp"] == 0.0 and sampling["repeat_penalty"] == 1.0
        t = tokens[-1]
        while True:
            t += 1
            yield t


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    FakeLlama.loaded = []
    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=FakeLlama))


def test_rows_count_max_tokens_ignoring_eos(fake_llama_cpp, tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    rows = llamacpp.run_llamacpp([str(f)], [[1, 2, 3], [7]], max_tokens=5, repeats=2, threads=2, log=lambda m: None)
    (row,) = rows
    assert row["status"] == "ok" and row["engine"] == "llama.cpp" and row["method"] == "m.gguf"
    assert row["token_ids"] == [[4, 5, 6, 7, 8], [8, 9, 10, 11, 12]] and row["num_tokens"] == 10
    assert row["tokens_per_s"] > 0 and len(row["tokens_per_s_samples"]) == 2
    assert FakeLlama.loaded[0]["n_threads"] == 2 and FakeLlama.loaded[0]["n_ctx"] >= 3 + 5


def test_a_vocabulary_smaller_than_the_prompts_is_an_error_row(fake_llama_cpp, tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    (row,) = llamacpp.run_llamacpp([str(f)], [[5000]], max_tokens=2, repeats=1, threads=1, log=lambda m: None)
    assert row["status"].startswith("error:") and "vocabulary" in row["status"]


def test_without_llama_cpp_the_row_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails
    (row,) = llamacpp.run_llamacpp([str(tmp_path / "m.gguf")], [[1]], max_tokens=2, repeats=1, threads=1)
    assert row["status"].startswith("skipped:") and "pip install llama-cpp-python" in row["status"]


def test_a_missing_file_is_refused_by_the_cli(capsys, llama_dir, tmp_path):
    assert main(["bench", "--target", str(llama_dir), "--llamacpp", str(tmp_path / "none.gguf")]) == 2
    assert "--llamacpp" in capsys.readouterr().err
