"""Engine configuration: pydantic v2 models, loadable from TOML or YAML.

Every model forbids unknown keys and is strict about types: an integer
setting takes an integer (not ``true`` or ``"8"``), a boolean takes ``true``
or ``false`` (not ``"yes"`` or 1), a string takes a string; float settings
also take integers but never NaN or infinity. ``load_config`` turns validation
failures into one ``ConfigError`` that lists every problem with the file, the
key path, the value received, what is allowed and how to fix it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from speculant.config.dtype_choice import choose_dtype

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli before it joined the standard library
    import tomli as tomllib

if TYPE_CHECKING:
    import torch

MAX_SEED = 2**63 - 1
"""Largest ``model.seed`` (``torch.Generator.manual_seed`` takes [0, 2**63 - 1])."""
MAX_MODEL_LEN = 1 << 24
"""Largest ``model.max_model_len`` accepted (16M tokens; the model's own limit is checked at load)."""
MAX_NUM_BLOCKS = 1 << 22
"""Largest ``cache.num_blocks`` (4M blocks); hold more tokens with a larger ``cache.block_size``."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class ModelConfig(StrictModel):
    path: str
    """Local Hugging Face model directory (config.json, safetensors, tokenizer), or
    a GGUF checkpoint: a ``.gguf`` file, or the directory holding ``gguf_file``
    (converted once and cached, see ``speculant.model.loading.gguf_source``)."""
    gguf_file: str | None = Field(default=None, min_length=1)
    """File name of a GGUF checkpoint inside the ``path`` directory."""
    tokenizer: str | None = None
    """Tokenizer directory; defaults to ``path``."""
    dtype: Literal["auto", "float32", "float64", "bfloat16", "float16"] = "auto"
    """Weights and activations dtype, or ``auto`` (the default: left out means ``auto``),
    resolved when the config is validated: bfloat16 where the CPU has a vector bfloat16
    path of ours (AVX2+FMA or AVX-512) or the device is CUDA, and the checkpoint is
    bfloat16 or GGUF; float32 elsewhere (``dtype_choice`` says which and why; see
    ``config/dtype_choice.py``). float32 is the exact mode."""
    dtype_choice: str | None = None
    """Why ``dtype`` is what it is when it came from ``auto`` (written by the validator; leave it unset)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto`` picks CUDA when available, else the CPU."""
    max_model_len: int | None = Field(default=None, ge=2, le=MAX_MODEL_LEN)
    """Longest prompt + output; defaults to the model's max_position_embeddings."""
    attention_backend: str = "auto"
    """``auto``, ``torch`` (reference) or a registered backend name."""
    quantization: Literal["gguf", "dequantize"] = "gguf"
    """For a quantized GGUF checkpoint: ``gguf`` keeps each quantized linear
    layer (and the embedding table) in the file's block format and runs it on
    Speculant's quantized kernels (``speculant/model/linear/quantized.py``); a
    block type without a kernel is dequantized, with a notice. ``dequantize``
    converts every tensor to ``model.dtype``. No effect on other checkpoints."""
    linear_backend: Literal["auto", "default", "onednn", "avx512_bf16"] = "auto"
    """``avx512_bf16`` runs linears on Speculant's bfloat16 C kernel (the name is
    historical: it runs on the CPU's best path, AVX2+FMA, AVX-512 or AVX512-BF16;
    model.dtype bfloat16); ``onednn`` pre-packs weights
    for oneDNN (CPU, float32/bfloat16); ``auto`` takes the first of the two that
    supports each layer, where exact; ``default`` is ``F.linear``."""
    linear_dense_max_rows: int | None = Field(default=None, ge=0, le=64)
    """With packed (oneDNN) linears, inputs of at most this many rows use a kept
    dense copy of the weight instead (MKL is faster for 1-3 rows on the Intel
    CPUs measured here, slower on AMD). Costs a second copy of the weights;
    ``None`` means, on Intel CPUs, 8 for models whose weights take at most
    128 MiB, 3 up to 2 GiB, else 0; 0 on other CPUs."""
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    """Engine seed, in [0, 2**63 - 1]: requests without their own seed draw theirs from it."""
    load_format: Literal["auto", "dummy"] = "auto"
    """``auto`` loads the weights in ``path``; ``dummy`` builds the model from
    ``path``'s config.json alone with random weights (seeded by ``seed``),
    allocated on the device: for benchmarks at sizes no checkpoint here has
    (vLLM's ``load_format = "dummy"``). Its output is meaningless text."""
    cuda_graphs: Literal["auto", "off"] = "auto"
    """``auto``: on CUDA with a graph-capturable attention backend (``triton``),
    forwards of up to 512 tokens replay CUDA graphs captured per padded token
    count, whatever their mix of prefill chunks, decodes and verify runs
    (``speculant/model/cuda_graphs.py``); elsewhere they run eagerly, the reason
    logged once. ``off``: always eager."""
    fast_forward: Literal["auto", "on", "off"] = "auto"
    """Run the decoder as speculant's own layer loop instead of transformers'
    modules (``speculant/model/fast_forward/``: merged q/k/v and gate/up GEMMs,
    one rotary table, in-place residuals; the same attention backend and KV
    cache). ``auto``: where the architecture is supported (llama, mistral, qwen2
    families) and a load-time probe against transformers' modules passes, else
    transformers' modules with the reason logged. ``on``: the same, but a model
    the fast path cannot run is an error. ``off``: transformers' modules."""

    @field_validator("gguf_file")
    @classmethod
    def _bare_file_name(cls, value: str | None) -> str | None:
        if value is not None and Path(value).name != value:
            raise ValueError(f"give the file name inside model.path, not a path: point model.path at "
                             f"{value!r} itself, or set model.path to its directory and model.gguf_file "
                             f"to {Path(value).name!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _resolve_auto_dtype(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("dtype", "auto") == "auto" and isinstance(data.get("path"), str):
            gguf = data.get("gguf_file") if isinstance(data.get("gguf_file"), str) else None
            device = data.get("device", "auto")
            dtype, why = choose_dtype(data["path"], gguf, device if isinstance(device, str) else "auto")
            data = {**data, "dtype": dtype, "dtype_choice": why}
        return data

    @property
    def dtype_reason(self) -> str:
        """Which dtype the model runs in and why ('auto' resolved, or set by the user)."""
        return self.dtype_choice or f"{self.dtype}: set by model.dtype"


class CacheConfig(StrictModel):
    block_size: int = Field(default=16, ge=1, le=1024)
    """Tokens per KV block."""
    num_blocks: int | None = Field(default=None, ge=1, le=MAX_NUM_BLOCKS)
    """Exact pool size in blocks; overrides ``memory_gb``."""
    memory_gb: float = Field(default=1.0, gt=0)
    """KV pool budget in GiB when ``num_blocks`` is not set."""
    enable_prefix_caching: bool = True
    """Keep full KV blocks of finished and preempted requests, keyed by their
    tokens, and skip the prefill of a prompt's cached leading blocks (least
    recently used blocks are evicted when the pool needs room). Output is
    unchanged; with a proposer that cannot restore its state for a cached
    prefix (``supports_prefix_caching = False``) nothing is skipped."""


class SchedulerConfig(StrictModel):
    max_num_batched_tokens: int = Field(default=512, ge=1)
    """Token budget of one step (prefill chunk tokens + decode tokens + drafts)."""
    max_num_seqs: int = Field(default=64, ge=1)
    """Most requests in one step."""
    enable_chunked_prefill: bool = True
    """Split prompts longer than the remaining budget across steps."""


ADAPTIVE_DEFAULT_K = 8
"""``speculative.num_speculative_tokens`` left unset under the adaptive policy (a ceiling)."""
FIXED_DEFAULT_K = 4
"""``speculative.num_speculative_tokens`` left unset under the fixed policy (every decode's k)."""


class FixedDraftLengthConfig(StrictModel):
    """Every decode may get ``num_speculative_tokens`` proposals each step (the
    scheduler still trims them to the token budget and the request's room)."""

    policy: Literal["fixed"] = "fixed"


class AdaptiveDraftLengthConfig(StrictModel):
    """Per request, k follows the acceptance observed so far; per batch, drafts
    are added only while they raise the expected tokens per unit of step
    cost, priced by the target's measured cost curve t(n)/t(1) and the
    proposer's cost per drafted token (``speculant/engine/draft_length.py``
    states the rule, ``speculant/engine/cost_cache.py`` how the figures are found)."""

    policy: Literal["adaptive"] = "adaptive"
    token_cost: float | None = Field(default=None, ge=0, le=1)
    """None (the default): the target's cost of n query rows is measured at load
    on this model, dtype, backend and CPU (about a second, cached on disk; the
    environment variable ``SPECULANT_TOKEN_COST`` replaces it). A number: a
    linear model instead, one more token costing this fraction of a one-token
    forward (``benchmarks/verify_rows.py`` measures the curve); 0 means tokens
    are free: every decode drafts k."""
    draft_token_cost: float | None = Field(default=None, ge=0, le=10)
    """The cost per drafted token outside the target's forward (the proposer's
    time and what verifying the row adds to acceptance), in one-token target
    forwards. None (the default): learnt from this engine's own step timings (0
    until a proposal was timed; ``SPECULANT_DRAFT_TOKEN_COST`` replaces it).
    Small for ngram and suffix; about the draft's forward over the target's for draft_model."""
    acceptance_decay: float = Field(default=0.8, ge=0, lt=1)
    """Weight of the past in a request's running acceptance estimate, per verify
    step; a step without proposals moves the estimate back toward the prior
    by the same factor (so a request held at k = 0 is tried again)."""
    prior_acceptance: float = Field(default=0.5, gt=0, lt=1)
    """Acceptance assumed before a request has been verified (worth two observations)."""


DraftLengthConfig = Annotated[FixedDraftLengthConfig | AdaptiveDraftLengthConfig, Field(discriminator="policy")]


class SpeculativeConfig(StrictModel):
    proposer: str | None = None
    """Registered proposer name; None turns speculation off."""
    proposer_options: dict[str, Any] = Field(default_factory=dict)
    """Options validated against the chosen proposer's options model."""
    scorer: str = "mqa"
    """Registered scorer name."""
    acceptance: str = "rejection"
    """Registered acceptance method name."""
    acceptance_options: dict[str, Any] = Field(default_factory=dict)
    """Options validated against the chosen acceptance method's options model."""
    num_speculative_tokens: int = Field(default=ADAPTIVE_DEFAULT_K, ge=1, le=64)
    """k: the most proposals per decode per step (with token trees: the deepest level).
    Left unset, it follows the policy: 8 under ``draft_length.policy = "adaptive"``
    (the default, which picks each step's k up to it, so a high ceiling costs
    nothing where drafts do not pay), 4 under ``"fixed"`` (every decode drafts all
    k). An unset value above the proposer's ``max_num_speculative_tokens`` is
    lowered to it (``config.compat.resolved_config``); a value set
    above it is refused. ``SamplingParams.speculative`` may lower it per request."""
    tree_width: int = Field(default=1, ge=1, le=16)
    """Most children per node of a decode's token tree (1: chains, the default).
    Above 1, a proposer that declares ``proposes_trees`` may propose several
    candidate continuations per decode, verified in one forward."""
    max_tree_tokens: int = Field(default=16, ge=1, le=64)
    """Most tokens of one decode's tree when ``tree_width`` > 1 (the step's
    ceiling per decode then, in place of ``num_speculative_tokens``)."""
    disable_by_batch_size: int | None = Field(default=None, ge=1)
    """Above this many running requests, speculation is off for the step."""
    draft_length: DraftLengthConfig = Field(default_factory=AdaptiveDraftLengthConfig)
    """How many of the k proposals each decode gets per step: ``{policy = "adaptive", ...}``
    (the default, ``AdaptiveDraftLengthConfig``: only where they are expected to
    pay) or ``{policy = "fixed"}`` (all k)."""

    @model_validator(mode="after")
    def _policy_default_k(self) -> SpeculativeConfig:
        if "num_speculative_tokens" not in self.model_fields_set and self.draft_length.policy == "fixed":
            self.__dict__["num_speculative_tokens"] = FIXED_DEFAULT_K  # still unset: a default, not a choice
        return self

    @property
    def enabled(self) -> bool:
        return self.proposer is not None

    @property
    def trees(self) -> bool:
        """Token trees are asked for (``tree_width`` > 1)."""
        return self.tree_width > 1


class EngineConfig(StrictModel):
    model: ModelConfig
    cache: CacheConfig = Field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)

    @model_validator(mode="after")
    def _check_budget(self) -> EngineConfig:
        if self.scheduler.max_num_batched_tokens < self.scheduler.max_num_seqs:
            raise ValueError(
                f"scheduler.max_num_batched_tokens={self.scheduler.max_num_batched_tokens} is below "
                f"scheduler.max_num_seqs={self.scheduler.max_num_seqs}: every running request needs "
                "at least one token per step. Raise max_num_batched_tokens or lower max_num_seqs."
            )
        return self


class ConfigError(ValueError):
    """A config file or override that failed validation; lists every problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration in {source}:\n{lines}")


def _walk(model: type[BaseModel], loc: tuple) -> tuple[tuple, Any]:
    """``loc`` without the tags pydantic inserts after a discriminated union
    (``draft_length.adaptive.token_cost`` reads ``draft_length.token_cost``),
    and the model holding its last key (None where the walk gets lost)."""
    current: Any = model
    shown: list = []
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        shown.append(part)
        if not parts:
            break
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return tuple(shown + parts), None
        current = field.annotation
        tagged = {_tag(m): m for m in getattr(current, "__args__", ()) if _tag(m)}
        if tagged and parts[0] in tagged:
            current = tagged[parts.pop(0)]
    return tuple(shown), current


def _tag(model: Any) -> str | None:
    """The ``policy`` literal of a tagged config model (e.g. 'adaptive'), if it is one."""
    field = getattr(model, "model_fields", {}).get("policy")
    args = getattr(field.annotation, "__args__", ()) if field is not None else ()
    return args[0] if args else None


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """Field names of the model at ``loc`` (minus the offending key)."""
    _, current = _walk(model, loc)
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else None


def format_validation_error(err: ValidationError, root: type[BaseModel] = EngineConfig,
                            prefix: str = "") -> list[str]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        shown, _ = _walk(root, loc)
        path = prefix + ".".join(str(p) for p in shown) if loc else prefix.rstrip(".") or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(root, loc)
            hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            problems.append(f"{path}: unknown key{hint}")
        elif e["type"] == "missing":
            problems.append(f"{path}: required key is missing")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            fix = _FIELD_HINTS.get(path) if e["type"] in _BOUND_ERRORS else \
                _TAG_HINTS.get(path) or _TYPE_HINTS.get(e["type"])
            problems.append(f"{path} = {e.get('input')!r}: {msg}" + (f"; {fix}" if fix else ""))
    return problems


_TYPE_HINTS = {
    "int_type": "write a whole number without quotes (true/false, 8.0 and \"8\" are not integers)",
    "bool_type": "write true or false without quotes",
    "float_type": "write a number without quotes",
    "finite_number": "write a finite number (not nan or inf)",
    "string_type": "write a quoted string",
}
_TAG_HINTS = {
    "speculative.draft_length": 'write a table naming the policy: {policy = "fixed"} or {policy = "adaptive"} '
                                '(options: token_cost, draft_token_cost, acceptance_decay, prior_acceptance)',
}
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_FIELD_HINTS = {
    "model.seed": "pick a seed in [0, 2**63 - 1]",
    "model.max_model_len": "leave it unset to use the model's max_position_embeddings, or pick a smaller length",
    "speculative.draft_length.token_cost": "it is a fraction of a one-token forward's cost; measure it with "
                                           "benchmarks/verify_cost.py (0 makes every token free)",
    "cache.num_blocks": "lower it, or raise cache.block_size to hold the same tokens in fewer blocks "
                        "(or leave it unset and size the pool with cache.memory_gb)",
}


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [f"file not found: {path} (pass a .toml, .yaml or .yml file)"])
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(str(path), [f"unknown config format {path.suffix!r}: use .toml, .yaml or .yml"])
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), [f"cannot parse: {exc}"]) from exc
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["top level must be a table/mapping of sections"])
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings (value parsed as TOML, else a string;
    ``null`` clears a value, e.g. ``speculative.proposer=null``)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", [f"{item!r}: expected key.path=value"])
        key, raw = item.split("=", 1)
        try:
            value = None if raw.strip() == "null" else tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError("--set", [f"{key}: {part} is not a section"])
        node[parts[-1]] = value
    return data


def read_config(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """A config file's mapping with ``overrides`` applied, not yet validated
    (``speculant.config.compat.load_config`` validates it)."""
    return apply_overrides(read_config_file(path), overrides or [])


def resolve_device(device: str) -> torch.device:
    """``model.device`` as a torch device, ``auto`` resolved (CUDA when torch
    sees one, else the CPU). Whether an explicit ``cuda`` is present is checked
    where it matters: at load (``model_loading``) and by ``config check``."""
    import torch  # lazy: validating a config needs torch only when the device is 'auto'

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
