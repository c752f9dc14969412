"""Shared by the batch tests: JSONL files, a chat-capable tiny model, and what LLM.generate says."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from speculant import LLM, SamplingParams

CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|bos|>assistant:{% endif %}")
PROMPTS = ["def foo(x):", "import os", "x = 1", "class A:", "for i in range(3):", "# a comment", "return x + y",
           "print('hi')", "while True:", "if a and b:", "y = [i for i", "async def main():"]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Rows as lines: a dict is dumped, a str is written as is (a bad line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def chat_model(llama_dir: Path, out: Path) -> Path:
    """The tiny llama with a chat template."""
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(llama_dir).iterdir():
        shutil.copy(f, out / f.name)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


def greedy_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    """``n`` greedy prompt lines of different lengths."""
    return [{"id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)),
             "max_tokens": 3 + i % 7, "temperature": 0, "ignore_eos": True} for i in range(start, start + n)]


def expected_texts(llm: LLM, rows: list[dict[str, Any]]) -> dict[str, str]:
    """id -> LLM.generate's greedy text for each prompt row."""
    params = [SamplingParams(max_tokens=r["max_tokens"], temperature=0, ignore_eos=True) for r in rows]
    outs = llm.generate([r["prompt"] for r in rows], params, use_tqdm=False)
    return {r["id"]: o.outputs[0].text for r, o in zip(rows, outs)}
