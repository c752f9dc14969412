"""Bench rows at the sizes people speculate on, with nothing downloaded.

``speculant bench --random-llama 8b --alpha 0.8`` builds a llama-family target
of that size from a config alone (``model.load_format = "dummy"``: seeded
random weights allocated on the device), runs it without speculation to
record each prompt's greedy continuation, then with the oracle proposer
(``speculant.bench.oracle``: each proposed token right with probability
``alpha``). A random model's text is meaningless, but its forward costs what
the real model's does, and the oracle gives a controlled acceptance, so the
speedup is what a proposer of that quality would give on that hardware.

With ``hf=True`` transformers runs the same model side by side: built from the
same config with the same seed (the same random weights), plain greedy
``generate()`` at concurrency 1 and a static padded batch above it. Each row's
``vs_transformers`` is its rate over that row's at the same concurrency, and
``matches_transformers`` the share of requests whose greedy tokens equal
transformers' (random weights give near-flat logits, so near-ties can part
them in reduced precision; the rate comparison holds either way, as both
produce the same number of tokens).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

from speculant.bench.hf_runs import run_hf
from speculant.bench.oracle import register, save_continuations
from speculant.bench.report import drop_raw, environment
from speculant.bench.speculant_runs import Method, run_speculant

SIZES: dict[str, dict[str, Any]] = {
    # Llama-3.2-1B-like and Llama-3.1-8B-like shapes (GQA 4:1 / 8:1, 128k vocabulary)
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False},
    # a tiny one for tests of this path
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "tie_word_embeddings": True},
}


def build_random_target(size: str, out: Path) -> Path:
    """Write ``out/config.json`` for a llama of ``size`` and a word-level
    tokenizer covering its vocabulary (so every id decodes); no weights."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    if size not in SIZES:
        raise ValueError(f"--random-llama {size!r}: unknown size; choose one of {', '.join(SIZES)}")
    shape = SIZES[size]
    cfg = LlamaConfig(**shape, max_position_embeddings=8192, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                      rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}, initializer_range=0.02)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")
    fast.save_pretrained(out)
    return out


def random_prompts(vocab_size: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(length)] for _ in range(n)]


def run_random_bench(size: str, *, alphas: list[float], k: int, max_tokens: int, repeats: int,
                     concurrency: list[int], dtype: str, device: str, num_prompts: int = 4,
                     prompt_len: int = 128, hf: bool = False, seed: int = 0, log=print) -> dict[str, Any]:
    """Rows ``no_spec`` and ``oracle_a<alpha>`` (k proposals per step) on a random target."""
    register()
    env = environment()
    with tempfile.TemporaryDirectory(prefix="speculant-random-") as tmp:
        target = build_random_target(size, Path(tmp) / f"llama-{size}")
        vocab = SIZES[size]["vocab_size"]
        prompts = random_prompts(vocab, num_prompts, prompt_len)
        kw = {"load_format": "dummy", "seed": seed, "max_model_len": prompt_len + max_tokens + k + 8}
        rows = run_speculant(str(target), [Method("no_spec")], prompts, max_tokens=max_tokens, repeats=repeats,
                             concurrency=concurrency, dtype=dtype, device=device, log=log, **kw)
        truth = next(r for r in rows if r["status"] == "ok" and r["concurrency"] == 1)["token_ids"]
        cont = Path(tmp) / "continuations.json"
        save_continuations(cont, list(zip(prompts, truth)))
        methods = [Method(f"oracle_a{a:g}", {"proposer": "oracle", "num_speculative_tokens": k,
                                             "proposer_options": {"continuations": str(cont), "alpha": a}})
                   for a in alphas]
        rows += run_speculant(str(target), methods, prompts, max_tokens=max_tokens, repeats=repeats,
                              concurrency=concurrency, dtype=dtype, device=device, log=log, **kw)
        if hf:
            rows += run_hf(str(target), None, prompts, max_tokens=max_tokens, k=k, repeats=repeats,
                           concurrency=concurrency, batched=True, pad_id=0, dtype=dtype, device=device, log=log,
                           methods=("generate",), random_seed=seed)
    _compare_with_hf(rows)
    base = {r["concurrency"]: r["tokens_per_s"] for r in rows if r["method"] == "no_spec" and r["status"] == "ok"}
    for r in rows:
        b = base.get(r["concurrency"])
        r["vs_baseline"] = r["tokens_per_s"] / b if b and r.get("tokens_per_s") else None
        r["matches_no_spec"] = None
    drop_raw(rows)  # the per-token samples behind the timing fields (and the tokens) stay out of the file
    params = _num_params(SIZES[size])
    return {"env": env, "title": f"random-weight llama-{size} ({params / 1e9:.2f} B parameters), {dtype}, "
                                 f"{num_prompts} prompts × {prompt_len} tokens, {max_tokens} new, k = {k}, oracle "
                                 f"proposer (each token right with probability alpha)",
            "settings": {"random_llama": size, "num_params": params, "alphas": alphas, "k": k,
                         "max_tokens": max_tokens, "repeats": repeats, "concurrency": concurrency, "dtype": dtype,
                         "device": device, "num_prompts": num_prompts, "prompt_len": prompt_len, "hf": hf,
                         "seed": seed},
            "notes": ["expected tokens per verify step for alpha a and k proposals: (1 - a^(k+1)) / (1 - a)"],
            "rows": rows}


def _compare_with_hf(rows: list[dict[str, Any]]) -> None:
    """Set ``vs_transformers`` and ``matches_transformers`` on every Speculant row
    that has a transformers ``generate`` row at its concurrency (else None)."""
    hf = {r["concurrency"]: r for r in rows if r.get("engine") == "transformers" and r["status"] == "ok"}
    for r in rows:
        ref = hf.get(r["concurrency"])
        if r.get("engine") == "transformers" or ref is None or r["status"] != "ok":
            r.setdefault("vs_transformers", None)
            r.setdefault("matches_transformers", None)
            continue
        r["vs_transformers"] = r["tokens_per_s"] / ref["tokens_per_s"]
        ours, theirs = r.get("token_ids") or [], ref.get("token_ids") or []
        same = sum(a == b for a, b in zip(ours, theirs, strict=False))
        r["matches_transformers"] = same / len(theirs) if theirs and len(ours) == len(theirs) else None


def _num_params(shape: dict[str, Any]) -> int:
    h, i, n, v = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["vocab_size"]
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    return n * per_layer + v * h * (1 if shape["tie_word_embeddings"] else 2) + h


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
