"""Drive a Hugging Face causal LM over flattened, paged batches.

A forward takes a list of ``PagedSpan``s (block tables resolved by the
engine's ``RunnerView`` from a plugin's sequence handles), lays their tokens out as one row of
``T`` tokens with explicit positions, writes K/V into the paged cache through
the attention seam and returns logits (and optionally final hidden states)
only at the requested offsets.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from speculant.config.models import CacheConfig, ModelConfig, resolve_device
from speculant.interfaces import AttentionBackend
from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model import cuda_graphs
from speculant.model.attention.context import ForwardContext, forward_context
from speculant.model.attention.hf_seam import SEAM_NAME
from speculant.model.attention.seam_probe import probe_attention, seam_refusals
from speculant.model.attention.span_bounds import check_spans
from speculant.model.cuda_graphs import GraphedForward, GraphLimits
from speculant.model.fast_forward.decoder import FastDecoder
from speculant.model.fast_forward.setup import FastForwardStatus, select_fast_forward
from speculant.model.fused_norms import fuse_rms_norms
from speculant.model.kernels.build import kernel_report
from speculant.model.linear.backend import pack_linear_layers
from speculant.model.linear.huge_pages import place_packed_weights
from speculant.model.linear.merged import merge_sibling_linears
from speculant.model.loading.gguf_quant import (
    QuantReport,
    keep_quantized,
    load_kept_quantized,
    release_freed_memory,
)
from speculant.model.loading.gguf_source import gguf_source_file, resolve_model_source
from speculant.model.loading.hf_model import (
    eos_token_ids,
    load_hf_model,
    load_tokenizer,
    require_device,
    unsupported_model_error,
)
from speculant.model.loading.skeleton import SkeletonMiss
from speculant.model.resources import total_memory_bytes
from speculant.model.seam_selftest import SeamSelfTestError, SelfTestResult, seam_self_test

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

# Auto rows for the kept dense weight copy, by model weight bytes, on Intel CPUs;
# other vendors get 0. The measurements behind these numbers are in
# benchmarks/README.md, "Why the linear-layer defaults are what they are".
AUTO_DENSE_MAX_ROWS = ((128 << 20, 8), (2 << 30, 3))  # (up to this many bytes, rows); larger: 0


def cpu_vendor() -> str:
    """``vendor_id`` of /proc/cpuinfo (e.g. GenuineIntel, AuthenticAMD); '' if unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def auto_dense_max_rows(weight_bytes: int, vendor: str) -> int:
    if vendor != "GenuineIntel":
        return 0
    return next((rows for limit, rows in AUTO_DENSE_MAX_ROWS if weight_bytes <= limit), 0)


@dataclass(frozen=True)
class ForwardOutput:
    logits: torch.Tensor  # [R, V] float32, R = total len(span.logits_at), span order
    hidden_states: torch.Tensor | None  # [R, H] final (normed) hidden states, if asked
    token_hidden: torch.Tensor | None = None  # [T, H] the same at every token of the forward (span order)


class ModelRunner:
    def __init__(self, model_cfg: ModelConfig, cache_cfg: CacheConfig, backend: AttentionBackend,
                 *, path_option: str = "model.path", tokenizer_option: str = "model.tokenizer",
                 graph_limits: GraphLimits | None = None) -> None:
        self.device = require_device(resolve_device(model_cfg.device))
        self.backend = backend
        self.block_size = cache_cfg.block_size
        # a GGUF checkpoint becomes its cached HF directory (gguf_source.py); a directory stays as it is
        source = resolve_model_source(model_cfg.path, model_cfg.gguf_file, model_cfg.dtype, option=path_option)
        # the tokenizer's JSON parsing (Python, 1.2 s at 1.5B) runs beside the weights' copy and repack
        # (C, the GIL released); an error of either is raised, the model's first
        with ThreadPoolExecutor(1, thread_name_prefix="speculant-tokenizer") as pool:
            tokenizer = pool.submit(load_tokenizer, model_cfg.tokenizer or source, option=tokenizer_option)
            self.model, self.max_model_len, self.quant_report = self._load(model_cfg, source, path_option)
            self.tokenizer = tokenizer.result()
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)
        self.vocab_size = self.model.get_output_embeddings().out_features
        self.norms_fused, self.norms_kept = fuse_rms_norms(self.model)
        self.linear_report = self._pack_linears(model_cfg.linear_backend, model_cfg.linear_dense_max_rows)
        self._captured_hidden: torch.Tensor | None = None
        self._capture = False
        self.graphs: GraphedForward | None = None  # set after the self-test, where model.cuda_graphs allows
        self.hidden_source = self._hidden_source()
        self.hidden_source.register_forward_hook(self._hidden_hook)
        self.kv_shapes = self._probe_kv_shapes(path_option)  # per layer (H_kv, D)
        self.num_blocks = self._num_blocks(cache_cfg, model_cfg.max_model_len is not None)
        self.trash_block = self.num_blocks  # one more block, outside the pool: graph padding writes there
        self.key_caches, self.value_caches = self._allocate_caches()
        self.kernel_report = kernel_report()  # one line: which C kernels run on this CPU, what is lost and why
        self.fast_forward = FastForwardStatus(model_cfg.fast_forward, None, "selected after the self-test")
        self.self_test = self._self_test(path_option)
        self.self_test_deviation = self.self_test.engine_error
        logger.info("%s: self-test passed: %s", path_option, self.self_test.describe())
        self.fast_forward = select_fast_forward(
            model_cfg.fast_forward, self.model, self.max_model_len, self,
            lambda spans, decoder: self._eager_forward(spans, False, decoder).logits, path_option)
        self.graph_limits = graph_limits or GraphLimits()
        self.graphs_off_reason = self._setup_graphs(model_cfg.cuda_graphs, path_option)

    # --- setup -----------------------------------------------------------
    def _load(self, model_cfg: ModelConfig, source: str,
              option: str) -> tuple[PreTrainedModel, int, QuantReport | None]:
        """The model, its max_model_len and, under ``model.quantization = "gguf"``, what was kept
        quantized: a GGUF checkpoint's quantized layers stay in their blocks, the model built as a
        skeleton so their dense weights are never read (``loading/skeleton.py``), else in full first."""
        gguf_file = gguf_source_file(model_cfg.path, model_cfg.gguf_file, option)
        quantize = (gguf_file is not None and model_cfg.quantization == "gguf" and model_cfg.load_format != "dummy"
                    and self.device.type == "cpu" and model_cfg.dtype in ("float32", "bfloat16"))
        if quantize and gguf_file is not None:
            try:
                model, max_len, report = load_kept_quantized(source, gguf_file, model_cfg.dtype, self.device,
                                                             model_cfg.max_model_len, option)
            except SkeletonMiss as miss:
                logger.info("%s: reading the whole conversion before keeping it quantized (%s)", option, miss)
            else:
                logger.info("%s: %s", option, report.describe())
                return model, max_len, report
        model, max_len = load_hf_model(source, model_cfg.dtype, self.device, model_cfg.max_model_len, option=option,
                                       random_seed=model_cfg.seed if model_cfg.load_format == "dummy" else None)
        if not quantize or gguf_file is None:
            return model, max_len, None
        with torch.inference_mode():
            report = keep_quantized(model, gguf_file, model.dtype)
        release_freed_memory()
        logger.info("%s: %s", option, report.describe())
        return model, max_len, report

    def _pack_linears(self, backend: str, dense_max_rows: int | None):
        if dense_max_rows is None:
            weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
            dense_max_rows = auto_dense_max_rows(weight_bytes, cpu_vendor())
        with torch.inference_mode():
            report = pack_linear_layers(self.model, backend, dense_max_rows=dense_max_rows)
            self.merged_linear_groups = merge_sibling_linears(self.model)
            self.huge_pages = place_packed_weights(self.model)
            return report

    def _hidden_source(self) -> torch.nn.Module:
        """The module whose output is the final hidden states: the base model
        (``model`` where ``base_model_prefix`` names no attribute, as in
        llama4_text), or its ``decoder`` where the LM class calls that directly (OPT)."""
        base = self.model.base_model
        if base is self.model:
            base = getattr(self.model, "model", base)
        decoder = getattr(base, "decoder", None)
        return decoder if isinstance(decoder, torch.nn.Module) else base

    def _hidden_hook(self, module, args, output) -> None:
        if self._capture:
            self._captured_hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]

    def _probe_kv_shapes(self, option: str) -> list[tuple[int, int]]:
        """Run a few tokens through the model recording every attention call:
        refuse what the paged backends would get wrong (``seam_probe``), and
        size the cache from what the model really does (GQA, head_dim)."""
        try:
            calls = probe_attention(self.model, self.backend, self.device)
        except Exception as exc:  # any failure here means the model cannot run through the seam
            raise unsupported_model_error(option, self.model.config, [
                f"its forward fails under speculant's attention seam ({type(exc).__name__}: {exc})"]) from exc
        num_layers = getattr(self.model.config.get_text_config(), "num_hidden_layers", None)
        problems = seam_refusals(calls, num_layers if isinstance(num_layers, int) else None, self.max_model_len)
        if problems:
            raise unsupported_model_error(option, self.model.config, problems)
        shapes = {c.layer: (c.key_shape[1], c.key_shape[3]) for c in calls}
        return [shapes[i] for i in range(len(calls))]  # seam_refusals passed: layers 0..L-1, once each

    def _self_test(self, option: str) -> SelfTestResult:
        try:
            return seam_self_test(self, SEAM_NAME)
        except SeamSelfTestError as exc:
            raise unsupported_model_error(option, self.model.config, [str(exc)]) from exc

    @property
    def kv_bytes_per_token(self) -> int:
        elem = torch.empty(0, dtype=self.model.dtype).element_size()
        return sum(2 * h * d * elem for h, d in self.kv_shapes)

    def scratch_tables(self, lengths: list[int]) -> list[list[int]]:
        """Disjoint block tables for the load-time checks' sequences (the self-test, the fast-forward
        probe), taken from the front of the pool: nothing else holds a block while the runner loads.
        As many of ``lengths`` as fit, in order."""
        tables: list[list[int]] = []
        first = 0
        for n in lengths:
            need = -(-n // self.block_size)
            if first + need > self.num_blocks:
                break
            tables.append(list(range(first, first + need)))
            first += need
        return tables

    def _fit_default_length(self, num_blocks: int, setting: str) -> None:
        """Lower a defaulted ``max_model_len`` to what ``num_blocks`` hold, saying so in one line."""
        fits = num_blocks * self.block_size
        logger.warning("model.max_model_len: lowered from the model's %d positions to %d, what %s holds "
                       "(set model.max_model_len, or a larger cache, to change this)", self.max_model_len, fits,
                       setting)
        self.max_model_len = fits

    def _num_blocks(self, cache_cfg: CacheConfig, explicit_len: bool) -> int:
        needed = -(-self.max_model_len // self.block_size)  # one full-length sequence
        if cache_cfg.num_blocks is not None:
            if cache_cfg.num_blocks < needed and not explicit_len and cache_cfg.num_blocks * self.block_size >= 2:
                self._fit_default_length(cache_cfg.num_blocks, f"cache.num_blocks = {cache_cfg.num_blocks}")
            elif cache_cfg.num_blocks < needed:
                raise ValueError(
                    f"cache.num_blocks = {cache_cfg.num_blocks} holds {cache_cfg.num_blocks * self.block_size} "
                    f"tokens, less than one sequence of model.max_model_len = {self.max_model_len}; raise "
                    f"cache.num_blocks to at least {needed} or lower model.max_model_len")
            self._check_pool_fits(cache_cfg.num_blocks)
            return cache_cfg.num_blocks
        per_block = self.kv_bytes_per_token * self.block_size
        num = int(cache_cfg.memory_gb * (1 << 30) // per_block)
        if num < needed and not explicit_len and num * self.block_size >= 2:
            self._fit_default_length(num, f"cache.memory_gb = {cache_cfg.memory_gb}")
            return num
        if num < needed:
            raise ValueError(
                f"cache.memory_gb = {cache_cfg.memory_gb} holds {num} KV blocks of {per_block} bytes, fewer "
                f"than the {needed} one sequence of model.max_model_len = {self.max_model_len} needs; raise "
                "cache.memory_gb or lower model.max_model_len")
        # never more than enough for max_model_len tokens of many sequences
        return min(num, 1 + 256 * -(-self.max_model_len // self.block_size))

    def _check_pool_fits(self, num_blocks: int) -> None:
        """Refuse a pool larger than the device's memory before the allocator does."""
        total = total_memory_bytes(self.device.type)
        need = num_blocks * self.block_size * self.kv_bytes_per_token
        if total is not None and need > total:
            raise ValueError(
                f"cache.num_blocks = {num_blocks}: the KV cache needs {need / (1 << 30):.2f} GiB "
                f"({self.kv_bytes_per_token * self.block_size} bytes per block), more than the "
                f"{total / (1 << 30):.2f} GiB of {self.device.type} memory; lower cache.num_blocks to at most "
                f"{total // (self.kv_bytes_per_token * self.block_size)} or use cache.memory_gb")

    def _allocate_caches(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys, values = [], []
        for h, d in self.kv_shapes:
            shape = (self.num_blocks + 1, self.block_size, h, d)  # + the trash block
            keys.append(torch.zeros(shape, dtype=self.model.dtype, device=self.device))
            values.append(torch.zeros(shape, dtype=self.model.dtype, device=self.device))
        return keys, values

    @torch.inference_mode()
    def move_kv(self, src: list[int], dst: list[int]) -> None:
        """Copy the K/V of cache slots ``src`` to slots ``dst`` in every layer (a token
        tree's accepted path into place, ``engine.trees``); all reads before any write."""
        for cache in (*self.key_caches, *self.value_caches):
            flat = cache.view(-1, *cache.shape[2:])  # [slots, H_kv, D]
            index = torch.tensor(src, dtype=torch.long, device=cache.device)
            flat.index_copy_(0, torch.tensor(dst, dtype=torch.long, device=cache.device), flat.index_select(0, index))

    def _setup_graphs(self, setting: str, option: str) -> str | None:
        """Graph this runner's forwards where ``model.cuda_graphs`` and the
        backend allow; else the reason, logged once."""
        chosen = cuda_graphs.resolve(setting, self.device, self.backend)
        reason = chosen if isinstance(chosen, str) else self._plain_head_problem()
        if reason is None and not isinstance(chosen, str):
            factory, pool = chosen
            self.graphs = GraphedForward(self, self.graph_limits, factory, pool)
            logger.info("%s: CUDA graphs on (token buckets up to %d, %d span slots)", option,
                        self.graphs.buckets[-1], self.graphs.num_span_slots)
        elif setting != "off":
            logger.info("%s: forwards run eagerly, without CUDA graphs: %s", option, reason)
        return reason

    def _plain_head_problem(self) -> str | None:
        """Graphs run the base model and apply the output embedding eagerly: refuse
        a model whose logits are more than that projection of the hidden states."""
        n = min(3, self.block_size)
        span = PagedSpan(block_table=[self.trash_block], start=0, token_ids=list(range(n)), logits_at=list(range(n)))
        with torch.inference_mode():
            out = self._eager_forward([span], want_hidden=True)
            assert out.hidden_states is not None
            head = self.model.get_output_embeddings()(out.hidden_states).float()
        if not torch.equal(head, out.logits):
            return ("the model's logits are not its output embedding applied to the final hidden states "
                    "(a logit scale or soft-cap?), which the graphed forward assumes")
        return None

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every layer's K/V of block ``src`` into block ``dst``, for each
        ``(src, dst)`` (copy-on-write of a block two sequences share)."""
        if not pairs:
            return
        src = torch.tensor([a for a, _ in pairs], dtype=torch.long, device=self.device)
        dst = torch.tensor([b for _, b in pairs], dtype=torch.long, device=self.device)
        for cache in (*self.key_caches, *self.value_caches):
            cache.index_copy_(0, dst, cache.index_select(0, src))

    # --- forward ---------------------------------------------------------
    @torch.inference_mode()
    def forward(self, spans: list[PagedSpan], want_hidden: bool = False) -> ForwardOutput:
        check_spans(spans, self.block_size, self.num_blocks + 1, self.max_model_len)  # + the trash block
        if self.graphs is not None:
            rows = self.graphs.run(spans)  # [Tb, H] or None
            if rows is not None:
                return self._head_output(spans, rows, want_hidden)
        return self._eager_forward(spans, want_hidden, self.fast_forward.decoder)

    def _eager_forward(self, spans: list[PagedSpan], want_hidden: bool,
                       decoder: FastDecoder | None = None) -> ForwardOutput:
        st = SpanTensors.build(spans, self.block_size, self.device)
        metadata = self.backend.build_metadata(st)
        if decoder is not None:  # model.fast_forward: our own layer loop, same backend and caches
            rows = decoder.forward(st.token_ids, st.positions, self.backend, metadata,
                                   self.key_caches, self.value_caches)  # [T, H]
            return self._head_output(spans, rows, want_hidden, copy=False)
        keep_t = self._keep(spans)
        ctx = ForwardContext(self.backend, metadata, self.key_caches, self.value_caches)
        self._capture = want_hidden
        try:
            with forward_context(ctx):
                out = self.model(input_ids=st.token_ids.unsqueeze(0), position_ids=st.positions.unsqueeze(0),
                                 use_cache=False, logits_to_keep=keep_t)
            hidden = every = None
            if want_hidden:
                if self._captured_hidden is None:
                    raise RuntimeError("the base model's forward hook captured no hidden states")
                every = self._captured_hidden[0]
                hidden = every[keep_t]
        finally:
            self._capture = False
            self._captured_hidden = None
        return ForwardOutput(logits=out.logits[0].float(), hidden_states=hidden, token_hidden=every)

    def _keep(self, spans: list[PagedSpan]) -> torch.Tensor:  # -> [R] long: the rows whose logits are needed
        keep: list[int] = []
        offset = 0
        for span in spans:
            keep.extend(offset + i for i in span.logits_at)
            offset += span.num_tokens
        return torch.tensor(keep, dtype=torch.long, device=self.device)

    def _head_output(self, spans: list[PagedSpan], rows: torch.Tensor,  # [Tb, H] final hidden states
                     want_hidden: bool, copy: bool = True) -> ForwardOutput:
        """Logits (and hidden states) from the base model's output rows; ``copy`` for a graph's
        static output, which the next replay overwrites."""
        every = rows[: sum(s.num_tokens for s in spans)]
        kept = every[self._keep(spans)]  # [R, H], a copy
        logits = self.model.get_output_embeddings()(kept).float()
        if not want_hidden:
            return ForwardOutput(logits=logits, hidden_states=None)
        return ForwardOutput(logits=logits, hidden_states=kept, token_hidden=every.clone() if copy else every)
