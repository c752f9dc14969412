"""Draft-model proposer: a smaller HF model with its own paged KV cache.

Per step, one draft forward carries this step's prefill chunks (so the draft's
cache follows the target chunk by chunk, in the same step) together with each
speculating decode's not-yet-drafted tokens; then k - 1 single-token forwards,
batched over all speculating decodes, extend the proposals. After acceptance
the draft's valid length moves back to what the target kept; rejected slots
are overwritten later.

Off is off: a decode planned no proposals costs the draft nothing, and when it
speculates again its first draft forward carries every token it missed (one
batched pass with the other decodes' first proposals). A request whose
``SamplingParams.speculative`` turns speculation off is never fed at all.

Prefix caching: the draft's pool keys its full blocks of committed tokens with
the target's keys (``request.block_hashes``) at commit, and a request the draft
holds nothing for (new, preempted, or reset after a fault) starts by sharing the
cached blocks its sequence begins with; it computes only the rest, wherever the
target's own prefix hit ended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speculant.config.models import ModelConfig
from speculant.interfaces import (
    EngineConfigView,
    Proposals,
    Proposer,
    ProposerCapabilities,
    ProposerContext,
    QuerySpan,
    Scores,
    SequenceHandle,
)
from speculant.interfaces.batch import RequestView, StepBatch
from speculant.model.loading.files import read_text_config
from speculant.model.loading.gguf_source import resolve_model_source
from speculant.proposers.draft_tokenizer import check_draft_tokenizer
from speculant.proposers.drafting import DraftSteps, draw_proposals


class DraftModelOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    """Local HF directory of the draft model (same tokenizer as the target)."""
    dtype: Literal["float32", "float64", "bfloat16", "float16"] | None = None
    """Draft dtype; defaults to the target's."""
    linear_backend: Literal["auto", "default", "onednn", "avx512_bf16"] = "auto"
    confidence_threshold: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Stop drafting a request's proposals after the first one the draft gives a
    probability below this (it is still proposed); 0 always drafts k. Fewer
    draft forwards and verify rows for tokens the target would likely reject;
    the output is unchanged (acceptance is lossless either way)."""


class DraftModelProposer(Proposer):
    name = "draft_model"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False, supports_chunked_prefill=True, draft_probs="full",
        supports_prefix_caching=True)  # shares its own cached blocks under the target's keys, computes the rest
    Options = DraftModelOptions
    options: DraftModelOptions

    @classmethod
    def validate_against(cls, options: DraftModelOptions, config: EngineConfigView) -> list[str]:
        key = "speculative.proposer_options.model"
        draft = Path(options.model)
        if draft.is_file():
            return []  # a GGUF checkpoint (gguf_source.py): converted, then checked against the target at load
        if not (draft / "config.json").is_file():
            return [f"{key} = {options.model!r}: no Hugging Face model directory (config.json) there; "
                    "point it at a local draft model directory"]
        target = Path(config.model.path)
        if not (target / "config.json").is_file():
            return []  # the target's own check reports this
        draft_cfg, target_cfg = read_text_config(options.model), read_text_config(config.model.path)
        problems = []
        if draft_cfg.get("vocab_size") != target_cfg.get("vocab_size"):
            problems.append(
                f"{key} = {options.model!r} has vocab_size {draft_cfg.get('vocab_size')} but the target has "
                f"{target_cfg.get('vocab_size')}: draft and target must share one tokenizer and vocabulary; "
                "pick a draft trained with the target's tokenizer")
        need = config.model.max_model_len or target_cfg.get("max_position_embeddings")
        have = draft_cfg.get("max_position_embeddings")
        if isinstance(need, int) and isinstance(have, int) and have < need:
            problems.append(
                f"{key} = {options.model!r} handles {have} positions but model.max_model_len is {need}: "
                f"the draft must cover every target position; set model.max_model_len <= {have} or use "
                "a draft with more positions")
        return problems

    def __init__(self, options: DraftModelOptions, context: ProposerContext) -> None:
        super().__init__(options, context)
        target = context.target
        cfg = context.config
        draft_dir = resolve_model_source(options.model, None, options.dtype or cfg.model.dtype,
                                         option="speculative.proposer_options.model")  # a GGUF: its cached dir
        check_draft_tokenizer(draft_dir, target.tokenizer, cfg.model.tokenizer or cfg.model.path)
        model_cfg = ModelConfig(
            path=options.model, dtype=options.dtype or cfg.model.dtype, device=cfg.model.device,
            max_model_len=target.max_model_len, linear_backend=options.linear_backend,
            linear_dense_max_rows=cfg.model.linear_dense_max_rows, quantization=cfg.model.quantization,
            attention_backend=cfg.model.attention_backend, cuda_graphs=cfg.model.cuda_graphs,
            fast_forward=cfg.model.fast_forward)
        # on the target's backend and KV geometry: the draft's cache covers at most the target's positions
        self.runner = target.new_runner(model_cfg, option="speculative.proposer_options.model")
        if self.runner.vocab_size != target.vocab_size:
            raise ValueError(
                f"speculative.proposer_options.model = {options.model!r}: draft LM head has "
                f"{self.runner.vocab_size} outputs but the target has {target.vocab_size}; "
                "draft and target must share one vocabulary")
        self._computed: dict[str, int] = {}  # request id -> tokens whose K/V the draft holds
        self._pending: dict[str, tuple[int, int]] = {}  # request id -> (num_tokens at propose, proposals)
        self._seqs: dict[str, SequenceHandle] = {}  # request id -> its sequence on the draft's runner

    # --- helpers -----------------------------------------------------------
    def _span(self, request_id: str, token_ids: list[int], start: int, logits_at: list[int]) -> QuerySpan:
        seq = self._seqs[request_id]
        self.runner.grow(seq, start + len(token_ids))
        return QuerySpan(seq, start, token_ids, logits_at)

    def _done(self, req: RequestView, upto: int) -> int:
        """Tokens of ``req`` whose K/V the draft holds; for a request it holds
        nothing for, the cached blocks (at most ``upto`` tokens) it starts with."""
        done = self._computed.get(req.request_id)
        if done is not None:
            return done
        self._drop_sequence(req.request_id)  # nothing of it is valid
        keys = req.block_hashes[:max(0, upto) // self.runner.block_size]
        self._seqs[req.request_id], done = self.runner.open_sequence(req.request_id, keys)
        self._computed[req.request_id] = done
        return done

    def _drop_sequence(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.runner.free(seq)

    # --- Proposer ------------------------------------------------------------
    def propose(self, batch: StepBatch) -> Proposals:
        spans: list[QuerySpan] = []
        for p in batch.prefills:
            req = p.request
            if not req.params.speculation.enabled:
                continue  # never drafts: the draft holds nothing for it
            end = p.start + p.num_new_tokens
            done = self._done(req, end)
            if done < end:
                spans.append(self._span(req.request_id, req.token_ids[done:end], done, []))
                self._computed[req.request_id] = end
        active = [i for i, d in enumerate(batch.decodes) if d.num_spec_tokens > 0]
        for i in active:
            req = batch.decodes[i].request
            done = self._done(req, req.num_tokens - 1)
            tokens = req.token_ids[done:]  # ends with the last sampled token
            spans.append(self._span(req.request_id, tokens, done, [len(tokens) - 1]))
            self._computed[req.request_id] = req.num_tokens
        k_max = max((batch.decodes[i].num_spec_tokens for i in active), default=0)
        n = len(batch.decodes)
        steps = DraftSteps(n, self.context.target.device)
        if not spans:
            return steps.build()
        logits = self.runner.forward(spans).logits  # [len(active), V]
        threshold = self.options.confidence_threshold
        rows = active
        drafted = [0] * n
        for step in range(k_max):
            decs = [batch.decodes[i] for i in rows]
            draw = draw_proposals(logits, [d.request for d in decs], step, with_confidence=threshold > 0)
            steps.add(step, rows, draw.tokens, draw.probs)
            for i in rows:
                drafted[i] = step + 1
            # extend only rows that want more proposals and whose last one the draft is confident
            # in: feed proposal `step` at its position
            sure = draw.confidence.tolist() if draw.confidence is not None else [1.0] * len(rows)
            nxt = [(i, draw.tokens[j]) for j, i in enumerate(rows)
                   if batch.decodes[i].num_spec_tokens > step + 1 and sure[j] >= threshold]
            if not nxt:
                break
            rows = [i for i, _ in nxt]
            spans = [self._span(batch.decodes[i].request.request_id, [tok],
                                batch.decodes[i].request.num_tokens + step, [0]) for i, tok in nxt]
            logits = self.runner.forward(spans).logits
        for i in active:
            d = batch.decodes[i]
            self._pending[d.request.request_id] = (d.request.num_tokens, drafted[i])
        return steps.build()

    def commit(self, batch: StepBatch, num_accepted: list[int], scores: Scores) -> None:
        for d, a in zip(batch.decodes, num_accepted):
            pending = self._pending.pop(d.request.request_id, None)
            if pending is None:
                continue
            base, k = pending
            # the draft fed last, p1..p_{k-1}; of those, last..p_a are still valid
            self._computed[d.request.request_id] = base + min(a, k - 1)
        for e in batch.entries:  # key full blocks of committed tokens (none holds a rejected proposal)
            req = e.request
            seq = self._seqs.get(req.request_id)
            if req.block_hashes and seq is not None and req.request_id in self._computed:
                n = min(self._computed[req.request_id], req.num_tokens) // self.runner.block_size
                self.runner.cache_prefix(seq, req.block_hashes, n)

    def free(self, request_id: str) -> None:
        self._computed.pop(request_id, None)
        self._pending.pop(request_id, None)
        self._drop_sequence(request_id)
