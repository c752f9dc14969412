"""Teacher data for the EAGLE head, computed once and cached on disk.

Two sources of token sequences: chat conversations the target writes itself
(training prompts from ``chat_prompts``, rendered with its chat template,
greedy replies generated through Speculant) and snippets of local text (the
Python standard library's sources, ``pydoc_data`` topics, man pages). One
teacher-forced forward of the target over each sequence gives its final
(normed) hidden states; shards of ``tokens [N, T]`` (long) and
``hidden [N, T, H]`` (float16) are written under ``--cache``.
"""

from __future__ import annotations

import gzip
import json
import random
import sysconfig
import time
from pathlib import Path

import torch

from speculant import LLM, SamplingParams


def chat_sequences(target_dir: str, prompts: list[str], max_tokens: int, dtype: str,
                   max_num_seqs: int = 32) -> list[list[int]]:
    """prompt + greedy reply token ids for each prompt (chat template applied)."""
    llm = LLM(model=target_dir, dtype=dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048)
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts],
                    SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    return [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outs]


def text_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py")) + sorted((stdlib / "pydoc_data").glob("*.py"))
    files += sorted(Path("/usr/share/man/man1").glob("*.gz"))[:400]
    files += sorted(Path("/usr/share/doc").glob("*/README*"))[:200]
    return [f for f in files if f.is_file()]


def read_text(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", errors="ignore") as f:
                return f.read()
        return path.read_text(errors="ignore")
    except OSError:
        return ""


def corpus_sequences(tokenizer, num: int, length: int, seed: int) -> list[list[int]]:
    """``num`` snippets of ``length`` tokens from local text files."""
    files = text_files()
    rng = random.Random(seed)
    seqs: list[list[int]] = []
    while len(seqs) < num:
        ids = tokenizer(read_text(rng.choice(files)), add_special_tokens=False)["input_ids"]
        if len(ids) > length:
            start = rng.randrange(len(ids) - length)
            seqs.append(ids[start: start + length])
    return seqs


def pack(seqs: list[list[int]], length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences cut / padded to ``length``: tokens [N, T] and a validity mask [N, T]."""
    tokens = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), length, dtype=torch.bool)
    for i, s in enumerate(seqs):
        s = s[:length]
        tokens[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = True
    return tokens, mask


@torch.no_grad()
def teacher_hidden(model, tokens: torch.Tensor,  # [N, T]
                   batch: int = 8) -> torch.Tensor:  # [N, T, H] float16
    """The target's final normed hidden states, teacher-forced (causal: padding
    at the end does not change earlier positions)."""
    outs = []
    for i in range(0, tokens.shape[0], batch):
        h = model.base_model(input_ids=tokens[i: i + batch]).last_hidden_state
        outs.append(h.to(torch.float16))
    return torch.cat(outs)


def write_shard(cache: Path, name: str, model, seqs: list[list[int]], length: int, pad_id: int,
                meta: dict) -> None:
    tokens, mask = pack(seqs, length, pad_id)
    t0 = time.time()
    hidden = teacher_hidden(model, tokens)
    torch.save({"tokens": tokens, "mask": mask, "hidden": hidden}, cache / f"{name}.pt")
    meta[name] = {"sequences": len(seqs), "length": length, "tokens": int(mask.sum()),
                  "forward_s": round(time.time() - t0, 1)}
    (cache / "meta.json").write_text(json.dumps(meta, indent=2))
