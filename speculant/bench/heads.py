"""Hidden-state head rows of ``speculant bench`` (``--medusa DIR``, ``--mlp-speculator DIR``, ``--eagle DIR``).

A head directory (``config.json`` + ``model.safetensors``, written by
``scripts/train_heads.py`` or ``save_heads()``) is checked here, before any
model loads, so a wrong directory is a clear CLI error that names the option:

* it must hold a ``config.json`` whose ``model_type`` matches the proposer;
* its ``hidden_size`` / ``vocab_size`` must equal the target's;
* the heads predict at most N tokens (Medusa: ``num_heads``, MLP speculator:
  ``n_predict``; EAGLE drafts autoregressively, without a limit), so the row
  runs with ``k = min(--k, N)`` and says so.

A proposer that declares ``supports_chunked_prefill = False`` gets an engine
with ``scheduler.enable_chunked_prefill = false``; the row's ``note`` says so.
Without chunking a prompt must fit one step's token budget, so the budget is
raised to the longest prompt when that is longer than the default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from speculant.bench.speculant_runs import ADAPTIVE, Method

# proposer name -> CLI option that names its directory
HEAD_OPTIONS = {"medusa": "--medusa", "mlp_speculator": "--mlp-speculator", "eagle": "--eagle"}
TRAINERS = {"medusa": "scripts/train_heads.py --kind medusa", "mlp_speculator": "scripts/train_heads.py --kind "
            "mlp_speculator", "eagle": "scripts/train_eagle.py"}


def _read_json(path: Path, option: str, fix: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{option} {path.parent}: cannot read {path.name} ({exc}); {fix}") from None


def head_method(proposer: str, path: str, target: str, k: int, longest_prompt: int,
                confidence: float = 0.0) -> Method:
    """The Speculant row for heads at ``path`` (proposer ``medusa``,
    ``mlp_speculator`` or ``eagle``) on ``target``; a proposer whose options
    have a ``confidence_threshold`` gets ``confidence`` there. Raises
    ``ValueError`` naming the option."""
    from speculant.config.models import SchedulerConfig
    from speculant.plugins import get_registry

    option = HEAD_OPTIONS[proposer]
    cls = get_registry().get_proposer(proposer)
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{option} {path}: no config.json there, so these are not trained {proposer} heads; "
                         f"point {option} at a directory written by {TRAINERS[proposer]}")
    head_cfg = _read_json(cfg_path, option, f"point {option} at a directory written by {TRAINERS[proposer]}")
    if head_cfg.get("model_type") != cls.model_type:
        raise ValueError(f"{option} {path}: config.json has model_type {head_cfg.get('model_type')!r}, but "
                         f"{option} needs {cls.model_type!r} heads; pass this directory to the option "
                         f"that matches its heads (--medusa, --mlp-speculator or --eagle)")
    target_cfg = _read_json(Path(target) / "config.json", "--target", "pass a Hugging Face model directory")
    target_cfg = target_cfg.get("text_config", target_cfg)
    for key in ("hidden_size", "vocab_size"):
        if head_cfg.get(key) != target_cfg.get(key):
            raise ValueError(f"{option} {path}: the heads have {key} {head_cfg.get(key)} but --target {target} "
                             f"has {target_cfg.get(key)}; heads only fit the model they were trained on, so "
                             f"train heads for this target ({TRAINERS[proposer]}) or pass its own target")
    max_k = cls.max_tokens(head_cfg)
    k_eff = k if max_k is None else min(k, max_k)
    notes = []
    kwargs: dict[str, Any] = {}
    if not cls.capabilities.supports_chunked_prefill:
        kwargs["enable_chunked_prefill"] = False
        notes.append(f"chunked prefill off ({proposer} does not support prompts split across steps)")
        budget = SchedulerConfig().max_num_batched_tokens
        if longest_prompt > budget:
            kwargs["max_num_batched_tokens"] = longest_prompt
            notes.append(f"step token budget raised from {budget} to {longest_prompt} so the longest "
                         "prompt fits one step")
    if k_eff < k:
        notes.append(f"k={k_eff}: --k {k} capped to the {max_k} tokens these heads predict")
    options: dict[str, Any] = {"path": str(path)}
    if "confidence_threshold" in cls.Options.model_fields:
        options["confidence_threshold"] = confidence
    spec = {"proposer": proposer, "scorer": "mqa", "num_speculative_tokens": k_eff, "proposer_options": options,
            "draft_length": {"policy": "fixed"}}  # the *_adaptive rows replace it
    return Method(proposer, spec, engine_kwargs=kwargs, note="; ".join(notes) or None,
                  fields={"k": k_eff, "heads_max_k": max_k})


def head_methods(heads: dict[str, str] | None, target: str, k: int, longest_prompt: int,
                 confidence: float = 0.0) -> list[Method]:
    """``head_method`` for each given directory, in ``HEAD_OPTIONS`` order (with
    ``--eagle``, ``eagle_adaptive`` and ``eagle_suffix`` rows after the ``eagle`` row)."""
    heads = heads or {}
    unknown = sorted(set(heads) - set(HEAD_OPTIONS))
    if unknown:
        raise ValueError(f"heads={unknown}: unknown head kinds; use {sorted(HEAD_OPTIONS)}")
    methods = []
    for name in HEAD_OPTIONS:
        if heads.get(name):
            methods.append(head_method(name, heads[name], target, k, longest_prompt, confidence))
            if name == "eagle":  # with the adaptive draft length, and the head behind suffix decoding
                eagle = methods[-1]
                methods += [eagle_adaptive_method(eagle), eagle_suffix_method(eagle)]
    return methods


def eagle_suffix_method(eagle: Method) -> Method:
    """The ``eagle_suffix`` row: ``eagle``'s row with its head as the hybrid's model part."""
    assert eagle.speculative is not None  # head_method always speculates
    spec = {**eagle.speculative, "proposer": "eagle_suffix",
            "proposer_options": {"eagle": eagle.speculative["proposer_options"]}}
    return Method("eagle_suffix", spec, engine_kwargs=dict(eagle.engine_kwargs), note=eagle.note,
                  fields=dict(eagle.fields))


def eagle_adaptive_method(eagle: Method) -> Method:
    """The ``eagle_adaptive`` row: ``eagle``'s row with the adaptive draft-length policy
    (k per request follows its observed acceptance and total drafts follow the batch
    size; the head's confidence threshold still stops a draft early, as in ``eagle``)."""
    assert eagle.speculative is not None  # head_method always speculates
    return Method("eagle_adaptive", {**eagle.speculative, "draft_length": dict(ADAPTIVE)},
                  engine_kwargs=dict(eagle.engine_kwargs), note=eagle.note, fields=dict(eagle.fields))
