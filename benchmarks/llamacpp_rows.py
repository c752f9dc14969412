"""llama.cpp's rows for the real-size benchmarks, built from the llama-cpp-python 0.3.36
sdist: ``plain`` (its Python bindings over the native ``libllama.so``, timed like Speculant's rows), ``bench``
(``llama-bench`` pp + tg at the prompts' mean length), and the ``llama-lookup`` / ``llama-speculative``
binaries, timed by their own ``encoded``/``decoded`` report (prefill included, load left out; rate M / (X + Y)).
``--ignore-eos`` bans end-of-generation tokens as ``ignore_eos`` does in ours.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LLAMA_PY = "/work/llama-src/llama_cpp_python-0.3.36"
LLAMA_BIN = "/work/llama-build/bin"

_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = re.compile(r"^\S*\s*\S*\s*(n_drafted|n_accept)\s*=\s*(\d+)", re.MULTILINE)


@dataclass
class BinaryRun:
    """One prompt through a llama.cpp speculative binary."""

    prompt_tokens: int
    tokens: int
    encode_s: float
    decode_s: float
    drafted: int | None
    accepted: int | None

    @property
    def seconds(self) -> float:
        return self.encode_s + self.decode_s


def parse_report(text: str) -> BinaryRun:
    """The timing lines ``llama-lookup`` / ``llama-speculative`` print at the end."""
    enc, dec = _ENCODED.search(text), _DECODED.search(text)
    if enc is None or dec is None:
        raise RuntimeError(f"no 'encoded/decoded N tokens in X seconds' lines in the output:\n{text[-2000:]}")
    counts = {k: int(v) for k, v in _COUNT.findall(text)}
    return BinaryRun(int(enc.group(1)), int(dec.group(1)), float(enc.group(2)), float(dec.group(2)),
                     counts.get("n_drafted"), counts.get("n_accept"))


def run_binary(binary: Path, model: str, prompt_file: Path, *, max_tokens: int, threads: int, k: int,
               draft: str | None = None, ctx: int = 4096) -> BinaryRun:
    """``binary`` on one prompt file: greedy, EOS banned, at most ``k`` drafted tokens per step."""
    cmd = [str(binary), "-m", model, "-f", str(prompt_file), "-n", str(max_tokens), "--temp", "0", "--top-k", "1",
           "--ignore-eos", "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "--spec-draft-n-max", str(k)]
    if draft is not None:
        cmd += ["-md", draft, "-td", str(threads), "-tbd", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return parse_report(out.stdout + out.stderr)


def llama_bench_rate(llama_bin: str, model: str, prompt_tokens: int, max_tokens: int, threads: int) -> dict:
    """One ``llama-bench`` run: its prompt and generation rates, and the request rate they give."""
    cmd = [str(Path(llama_bin) / "llama-bench"), "-m", model, "-p", str(prompt_tokens), "-n", str(max_tokens),
           "-t", str(threads), "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
    recs = json.loads(out.stdout)
    pp = next(r["avg_ts"] for r in recs if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in recs if r["n_gen"] > 0)
    seconds = prompt_tokens / pp + max_tokens / tg
    return {"tok_s": max_tokens / seconds, "tokens": max_tokens, "seconds": seconds, "prompt_tok_s": pp,
            "decode_tok_s": tg}


def load_bindings(llama_py: str, llama_lib: str) -> Any:
    """The sdist's ``llama_cpp`` module over the native build's shared libraries."""
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", llama_lib)
    if llama_py not in sys.path:
        sys.path.insert(0, llama_py)
    import llama_cpp

    return llama_cpp


class PlainLlama:
    """llama.cpp without speculation through its Python bindings: one request alone, greedy."""

    def __init__(self, llama_py: str, llama_lib: str, model: str, threads: int, ctx: int = 4096,
                 logits_all: bool = False) -> None:
        llama_cpp = load_bindings(llama_py, llama_lib)
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False, logits_all=logits_all)

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
        """(tokens, seconds from the call to the last token), EOS ignored."""
        from speculant.bench.llamacpp import generate_alone

        tokens, seconds, _, _ = generate_alone(self.llm, prompt, max_tokens)
        return tokens, seconds

    def close(self) -> None:
        self.llm.close()


def binaries(llama_bin: str) -> dict[str, Path]:
    """The two speculative binaries, or an error naming the build command."""
    found = {name: Path(llama_bin) / f"llama-{name}" for name in ("lookup", "speculative")}
    missing = [str(p) for p in found.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: build them with `cmake --build {Path(llama_bin).parent} "
                         "-j2 --target llama-speculative llama-lookup`")
    return found
