"""Export a trained model as an ordinary Hugging Face directory with 16-bit weights,
then load it back the way users will (float32 on CPU) and compare with the fp32 original."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

DISK_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def round_trip_(model: torch.nn.Module, disk_dtype: str) -> torch.nn.Module:
    """In place: round every floating parameter through the on-disk dtype (what users will load)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(DISK_DTYPES[disk_dtype]).to(p.dtype))
    return model


def export_model(src_dir: Path, out_dir: Path, tokenizer_dir: Path, disk_dtype: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32)
    limit = torch.finfo(DISK_DTYPES[disk_dtype]).max
    biggest = max(p.abs().max().item() for p in model.parameters())
    if biggest >= limit:
        raise ValueError(f"{src_dir}: a weight of magnitude {biggest} does not fit {disk_dtype}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.safetensors"):
        old.unlink()
    model.to(DISK_DTYPES[disk_dtype]).save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.save_pretrained(out_dir)
    eos = tok.eos_token_id
    GenerationConfig(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos).save_pretrained(out_dir)


@torch.no_grad()
def verify(src_dir: Path, out_dir: Path, heldout: np.ndarray, seq_len: int, n_windows: int = 8) -> dict:
    """Load the export with dtype=float32 and compare logits with the fp32 training weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ref = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32).eval()
    got = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    dtypes = {str(p.dtype) for p in got.parameters()}
    n_all = (len(heldout) - 1) // seq_len
    idx = np.linspace(0, n_all - 1, min(n_windows, n_all)).round().astype(np.int64)
    b = torch.from_numpy(np.stack([heldout[i * seq_len:i * seq_len + seq_len + 1] for i in idx]).astype(np.int64))
    a = ref(input_ids=b[:, :-1]).logits
    c = got(input_ids=b[:, :-1]).logits

    def loss(lg):
        return F.cross_entropy(lg.reshape(-1, lg.size(-1)), b[:, 1:].reshape(-1)).item()

    files = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir()) if p.is_file()}
    return {
        "loaded_dtypes": sorted(dtypes),
        "max_abs_logit_diff": (a - c).abs().max().item(),
        "mean_abs_logit_diff": (a - c).abs().mean().item(),
        "argmax_agreement": (a.argmax(-1) == c.argmax(-1)).float().mean().item(),
        "loss_fp32": loss(a), "loss_export": loss(c),
        "tokenizer_eos": tok.eos_token, "params": sum(p.numel() for p in got.parameters()),
        "files": files, "bytes": sum(files.values()),
    }


def write_report(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=1))
