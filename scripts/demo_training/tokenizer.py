"""Byte-level BPE tokenizer trained on the train split, and the token arrays.

Every file becomes its tokens followed by the EOS token ``<|endoftext|>``; the
train stream concatenates the train files in a seeded order, the held-out
stream the held-out files in path order (with each file's start offset, which
the evaluation uses to pick prompts). Arrays are uint16 (vocab < 65536).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .corpus import read_texts

EOS = "<|endoftext|>"


def train_tokenizer(manifest: dict, out_dir: Path, vocab_size: int, max_len: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for _, t in read_texts(manifest, "train")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   model_max_length=max_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(tok_dir: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tok_dir)


def tokenizer_digest(tok_dir: Path) -> str:
    return hashlib.sha256((tok_dir / "tokenizer.json").read_bytes()).hexdigest()


def _encode(tok, texts: list[str]) -> list[np.ndarray]:
    backend = tok.backend_tokenizer
    eos = tok.convert_tokens_to_ids(EOS)
    out = []
    for i in range(0, len(texts), 64):
        for enc in backend.encode_batch(texts[i:i + 64], add_special_tokens=False):
            out.append(np.asarray(enc.ids + [eos], dtype=np.uint16))
    return out


def build_token_arrays(manifest: dict, tok_dir: Path, data_dir: Path, seed: int) -> dict:
    tok = load_tokenizer(tok_dir)
    assert len(tok) <= 65536
    data_dir.mkdir(parents=True, exist_ok=True)
    train = read_texts(manifest, "train")
    # seeded file order for the train stream (windows straddling two files mix modules, not neighbours)
    order = sorted(range(len(train)), key=lambda i: hashlib.sha256(f"{seed}:order:{train[i][0]}".encode()).digest())
    train_ids = _encode(tok, [train[i][1] for i in order])
    np.save(data_dir / "train.npy", np.concatenate(train_ids))
    held = read_texts(manifest, "heldout")
    held_ids = _encode(tok, [t for _, t in held])
    offsets = np.cumsum([0] + [len(a) for a in held_ids]).tolist()
    np.save(data_dir / "heldout.npy", np.concatenate(held_ids))
    n_train_bytes = sum(len(t.encode()) for _, t in train)
    meta = {
        "manifest_digest": manifest["digest"],
        "tokenizer_digest": tokenizer_digest(tok_dir),
        "vocab_size": len(tok),
        "eos_token_id": tok.convert_tokens_to_ids(EOS),
        "n_tokens": {"train": int(offsets[0] + sum(len(a) for a in train_ids)), "heldout": int(offsets[-1])},
        "bytes_per_token_train": n_train_bytes / sum(len(a) for a in train_ids),
        "heldout_docs": [{"path": p, "start": offsets[i], "end": offsets[i + 1]} for i, (p, _) in enumerate(held)],
    }
    (data_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def load_arrays(data_dir: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    meta = json.loads((data_dir / "meta.json").read_text())
    return np.load(data_dir / "train.npy"), np.load(data_dir / "heldout.npy"), meta
