"""Load a local Hugging Face causal LM through the speculant attention seam
and refuse model features that our attention does not implement."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from speculant.model.attention.hf_seam import register_seam
from speculant.model.loading.files import SafetensorError, UnsupportedModelError, check_weight_files, weight_load_error
from speculant.model.loading.skeleton import parameters_on_meta

if TYPE_CHECKING:
    from transformers import PreTrainedModel

_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_model_dir(path: str, option: str = "model.path") -> Path:
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(
            f"{option} = {path!r}: no such directory. Point it at a local Hugging Face model "
            "directory (config.json + *.safetensors + tokenizer files); nothing is downloaded.")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{option} = {path!r}: directory has no config.json, so it is not "
                                "a Hugging Face model directory; save one with model.save_pretrained().")
    return p


def unsupported_features(config: PretrainedConfig, max_model_len: int) -> list[str]:
    """Every attention feature of ``config`` the paged backends do not handle."""
    cfg = config.get_text_config()
    problems = []
    problems.extend(_layer_problems(cfg, max_model_len))
    if getattr(cfg, "use_bidirectional_attention", False):
        problems.append("bidirectional attention (use_bidirectional_attention=True); use a causal model")
    softcap = getattr(cfg, "attn_logit_softcapping", None)
    if softcap:
        problems.append(f"attention logit soft-capping (attn_logit_softcapping={softcap}); "
                        "use a model without it")
    attn_cfg = getattr(cfg, "attn_config", None)
    if getattr(cfg, "alibi", False) or getattr(cfg, "position_embedding_type", None) == "alibi" \
            or getattr(attn_cfg, "alibi", False) or (isinstance(attn_cfg, dict) and attn_cfg.get("alibi")):
        problems.append("ALiBi position biases; use a model with rotary or learned positions")
    if getattr(config, "is_encoder_decoder", False) or type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        problems.append("not a decoder-only causal LM (transformers' AutoModelForCausalLM has no class for "
                        f"{type(config).__name__}: an encoder-decoder or encoder-only model); "
                        "use a decoder-only model")
    return problems


def _layer_problems(cfg: PretrainedConfig, max_model_len: int) -> list[str]:
    """Attention layouts the config declares: the masks that would express them are
    never built for the seam, so each is checked here against max_model_len."""
    window = getattr(cfg, "sliding_window", None)
    window_problem = (f"sliding-window attention (sliding_window={window} < max_model_len={max_model_len}); "
                      f"set model.max_model_len <= {window} or use a model without a window")
    layer_types = list(dict.fromkeys(str(t) for t in (getattr(cfg, "layer_types", None) or [])))
    if not layer_types:  # no per-layer list: the window, if any and switched on, applies everywhere
        on = getattr(cfg, "use_sliding_window", True)
        return [window_problem] if window is not None and on and window < max_model_len else []
    problems = []
    for kind in layer_types:
        if kind == "full_attention":
            continue
        if kind == "sliding_attention":
            if window is None or window < max_model_len:
                problems.append(window_problem)
        elif kind == "chunked_attention":
            chunk = getattr(cfg, "attention_chunk_size", None)
            if chunk is None or chunk < max_model_len:
                problems.append(f"chunked attention (attention_chunk_size={chunk} < max_model_len={max_model_len}); "
                                f"set model.max_model_len <= {chunk} or use a model without it")
        else:
            problems.append(f"layers of type {kind!r} (config.layer_types), which are not softmax attention "
                            "(state-space, convolution or linear-attention layers); use a model without them")
    return problems


def unsupported_model_error(option: str, config: PretrainedConfig, problems: list[str]) -> UnsupportedModelError:
    """The one refusal message: which model, every feature, and that nothing was loaded half-way."""
    path = getattr(config, "_name_or_path", "") or "?"
    return UnsupportedModelError(
        f"{option} = {path!r} ({config.model_type}) uses features speculant's attention does not "
        "implement: " + "; ".join(problems) + ". Refusing to load rather than compute wrong outputs.")


def require_device(device: torch.device) -> torch.device:
    """``device`` if torch can use it (``config.resolve_device`` resolves ``auto``)."""
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device = 'cuda' but torch sees no CUDA device; set model.device = 'cpu' or 'auto'")
    return device


def default_max_model_len(config: PretrainedConfig) -> int:
    cfg = config.get_text_config()
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def checked_config(model_dir: Path, path: str, max_model_len: int | None,
                   option: str = "model.path") -> tuple[PretrainedConfig, int]:
    """``model_dir``'s config and the resolved max_model_len, refusing what our attention does not implement."""
    config = AutoConfig.from_pretrained(model_dir)
    limit = default_max_model_len(config)
    if max_model_len is None:
        max_model_len = limit
    elif max_model_len > limit:
        raise ValueError(f"model.max_model_len = {max_model_len} exceeds the model's {limit} positions; "
                         f"set it to at most {limit}")
    problems = unsupported_features(config, max_model_len)
    if problems:
        config._name_or_path = path
        raise unsupported_model_error(option, config, problems)
    return config, max_model_len


def load_hf_model(path: str, dtype: str, device: torch.device, max_model_len: int | None,
                  option: str = "model.path", random_seed: int | None = None,
                  skeleton: bool = False) -> tuple[PreTrainedModel, int]:
    """Load the model with our attention; return it and the resolved max_model_len.
    With ``random_seed`` (``model.load_format = "dummy"``) the weights are not
    read: the model is built from config.json with seeded random weights,
    allocated directly on ``device``. With ``skeleton`` nothing is read either: every
    parameter is on the meta device, buffers are real (``loading/skeleton.py`` fills it in)."""
    model_dir = check_model_dir(path, option)
    config, max_model_len = checked_config(model_dir, path, max_model_len, option)
    seam = register_seam()
    if random_seed is not None:
        return _random_model(config, dtype, device, seam, random_seed), max_model_len
    check_weight_files(model_dir, option)
    try:
        if skeleton:
            with parameters_on_meta():
                model = AutoModelForCausalLM.from_config(config, dtype=_DTYPES[dtype], attn_implementation=seam)
            model.eval()
            return model, max_model_len
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_DTYPES[dtype], attn_implementation=seam)
    except SafetensorError as exc:
        raise weight_load_error(exc, model_dir, option) from exc
    except (ValueError, KeyError, NotImplementedError) as exc:
        if isinstance(exc, KeyError) or "attn_implementation" in str(exc) or "attention" in str(exc).lower():
            how = (f"it picks its attention class from its own table, which has no {seam!r} entry"
                   if isinstance(exc, KeyError) else str(exc))
            raise UnsupportedModelError(
                f"{option} = {path!r} ({config.model_type}) does not route attention through transformers' "
                f"AttentionInterface, which speculant needs ({how}); use a model that does") from exc
        raise
    # transformers types PreTrainedModel.to as functools.wraps(nn.Module.to), whose
    # signature keeps the unbound `self`, so the device reads as the wrong argument
    model.to(device).eval()  # type: ignore[arg-type]
    model.requires_grad_(False)
    return model, max_model_len


def _random_model(config: PretrainedConfig, dtype: str, device: torch.device, seam: str,
                  seed: int) -> PreTrainedModel:
    """``config``'s model with seeded random weights, built on ``device`` (no host copy)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=_DTYPES[dtype], attn_implementation=seam)
    model.eval()
    model.requires_grad_(False)
    return model


def load_tokenizer(path: str, option: str = "model.tokenizer"):
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"{option} = {path!r}: cannot load a tokenizer there ({exc}). "
                                "Save one with tokenizer.save_pretrained() into the model directory "
                                "or set model.tokenizer.") from exc


def eos_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(model.config, "eos_token_id", None),
                   getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(t) for t in source)
        if ids:
            break
    return frozenset(ids)
