"""EAGLE proposer: an autoregressive one-layer head on the target's hidden states.

The head's cache follows the target's hidden states, prompt chunks included,
whenever the request is about to draft. At commit it receives the target's
hidden state at every position the step computed (every row of each prefill
chunk, ``Scores.prompt_hidden``, and the kept rows of each decode) with the
token that follows each position; those entries wait as *pending* and enter
the head's cache only when the request next speculates: one batched head
pass over everything the speculating decodes missed (at most
``CATCH_UP_ROWS`` rows per request per head forward, which bounds the
attention scores' memory). So a request held at k = 0 (the adaptive policy,
or ``{"enabled": false}``) costs the head nothing: no head forward, and the
engine does not call ``propose`` in a step where no decode speculates; its
``commit`` only appends the step's hidden rows to the request's pending list.

Why keep the target's hidden states rather than recompute them on resuming:
keeping costs one [m, H] row copy per request per step and H values per
position of memory (SmolLM2-135M in bfloat16: 1.1 KB per position, about 5%
of the target's own K/V); recomputing them would need a target forward over
every missed position each time speculation resumes (t(m)/t(1) target
forwards), and the adaptive policy resumes often to test a request again.

The last pending entry of a speculating decode predicts the target's next
feature and so the first proposal; each further proposal feeds the predicted
feature and the drawn token back in (one single-token head forward per step,
batched over the decodes). Entries made from predicted features are rolled
back at commit and recomputed from the target's real hidden states.

A request whose state was dropped while it runs (a proposer fault) restarts
its cache at the next position it gets hidden states for; a preempted
request restarts from position 0 with its recompute.

Prefix caching (``prefix_store.py``): the head's K/V of full blocks of true
entries are kept under the target's block keys; ``restore_prefix`` rebuilds a
request's cache from them, and the target skips no more than that.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file

from speculant.interfaces import EngineConfigView, Proposals, Proposer, ProposerCapabilities, ProposerContext, Scores
from speculant.interfaces.batch import RequestView, StepBatch
from speculant.interfaces.data import AcceptedNodes
from speculant.interfaces.tree import tree_settings
from speculant.model.linear.backend import pack_linear_layers
from speculant.model.linear.onednn import onednn_unavailable_reason
from speculant.model.loading.files import read_text_config
from speculant.proposers.drafting import DraftDraw, DraftSteps, draw_proposals
from speculant.proposers.eagle.model import MODEL_TYPE, EagleHead, SeqKV
from speculant.proposers.eagle.prefix_store import HeadKVStore, store_blocks, stored_prefix
from speculant.proposers.eagle.tree_draft import RequestTree, build_proposals, draft_trees
from speculant.sampling.acceptance import verifies_by_argmax

OPTION = "speculative.proposer_options.path"
# Catching up, a request's pending entries enter its head cache at most this many per head
# forward (the attention scores of one forward are [heads, rows, cached positions]).
CATCH_UP_ROWS = 512
# Pending hidden rows are joined into one tensor once a request holds this many pieces.
MAX_PIECES = 64


class EagleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    """Directory with the head's config.json and model.safetensors (scripts/train_eagle.py)."""
    linear_backend: Literal["auto", "default", "onednn", "avx512_bf16"] = "auto"
    """The head's linear layers and its draft-vocabulary output layer, as the
    target's ``model.linear_backend``: ``auto`` packs them on the CPU (the
    bfloat16 dot-product kernel where it runs them, else oneDNN), where one-row
    linears run near the memory bound."""
    confidence_threshold: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Stop drafting a request's proposals after the first one the head gives a
    probability below this (it is still proposed); 0 always drafts k. Saves head
    forwards and verify rows for tokens the target would likely reject; the
    output is unchanged (acceptance is lossless either way)."""


def read_eagle_config(path: str) -> dict:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{OPTION} = {path!r}: no config.json there; point it at a directory written "
                                "by scripts/train_eagle.py")
    data = json.loads(cfg_path.read_text())
    if data.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{OPTION} = {path!r} holds model_type {data.get('model_type')!r}, expected "
                         f"{MODEL_TYPE!r}; choose the proposer that matches this head")
    return data


def size_problems(head_cfg: dict, hidden_size: int | None, vocab_size: int | None, path: str) -> list[str]:
    return [f"{OPTION} = {path!r}: the head has {key} {head_cfg.get(key)} but the target has {want}; "
            "train a head on this target (scripts/train_eagle.py)"
            for key, want in (("hidden_size", hidden_size), ("vocab_size", vocab_size))
            if want is not None and head_cfg.get(key) != want]


def onednn_problem(reason: str) -> str:
    return (f"speculative.proposer_options.linear_backend = 'onednn': {reason}; choose 'auto' (packs what "
            "oneDNN supports, runs the rest on the default path) or 'default'")


@dataclass
class SeqState:
    """One request's head state: cache entries for positions ``base ..
    base + kv.length - 1`` (the first ``true_len`` from the target's hidden
    states), then pending entries not yet in the cache."""

    kv: SeqKV
    base: int
    true_len: int = 0
    stored: int = 0  # blocks before this one are in the prefix store (or cannot be)
    pending_tokens: list[int] = field(default_factory=list)
    pending_hidden: list[torch.Tensor] = field(default_factory=list)  # [m, H] each

    @property
    def next_position(self) -> int:
        return self.base + self.true_len + len(self.pending_tokens)

    def queue(self, tokens: Sequence[int], hidden: torch.Tensor) -> None:  # hidden [m, H], a copy
        self.pending_tokens += tokens
        self.pending_hidden.append(hidden)
        if len(self.pending_hidden) >= MAX_PIECES:  # one tensor, not a list growing by a row per step
            self.pending_hidden = [torch.cat(self.pending_hidden)]

    def take(self, n: int) -> tuple[list[int], torch.Tensor]:
        """The first ``n`` pending entries (tokens, hidden [n, H]), removed from the queue."""
        hidden = torch.cat(self.pending_hidden) if len(self.pending_hidden) > 1 else self.pending_hidden[0]
        tokens, self.pending_tokens = self.pending_tokens[:n], self.pending_tokens[n:]
        self.pending_hidden = [hidden[n:]] if self.pending_tokens else []
        return tokens, hidden[:n]


class EagleProposer(Proposer):
    name = "eagle"
    api_version = "3.0"
    capabilities = ProposerCapabilities(needs_target_hidden_states=True, needs_prompt_hidden_states=True,
                                        supports_chunked_prefill=True, draft_probs="full",
                                        supports_prefix_caching=True,  # restore_prefix: its own block store
                                        proposes_trees=True)  # top-k expansion of the head (tree_draft)
    Options = EagleOptions
    options: EagleOptions
    model_type = MODEL_TYPE

    @classmethod
    def max_tokens(cls, head_cfg: dict) -> int | None:
        """No limit: the head drafts autoregressively (for ``speculant bench``'s head rows)."""
        return None

    @classmethod
    def validate_against(cls, options: EagleOptions, config: EngineConfigView) -> list[str]:
        if options.linear_backend == "onednn" and config.model.dtype not in ("float32", "bfloat16"):
            return [onednn_problem(f"the head runs in model.dtype = {config.model.dtype!r}, and oneDNN packing "
                                   "supports float32 and bfloat16")]
        if options.linear_backend == "avx512_bf16" and config.model.dtype != "bfloat16":
            return [f"speculative.proposer_options.linear_backend = 'avx512_bf16': the head runs in model.dtype = "
                    f"{config.model.dtype!r}, and the dot-product kernel is bfloat16-only; choose 'auto' or "
                    "set model.dtype = 'bfloat16'"]
        try:
            head_cfg = read_eagle_config(options.path)
        except (FileNotFoundError, ValueError) as exc:
            return [str(exc)]
        if not (Path(config.model.path) / "config.json").is_file():
            return []  # a GGUF target: checked against the loaded model instead
        target = read_text_config(config.model.path)
        return size_problems(head_cfg, target.get("hidden_size"), target.get("vocab_size"), options.path)

    def __init__(self, options: EagleOptions, context: ProposerContext) -> None:
        super().__init__(options, context)
        target = context.target
        self.head_config = read_eagle_config(options.path)
        weight = target.output_embedding.weight  # [V, H]
        assert isinstance(weight, torch.Tensor)
        problems = size_problems(self.head_config, weight.shape[1], target.vocab_size, options.path)
        if problems:
            raise ValueError("; ".join(problems))
        self.head = EagleHead(self.head_config)
        self.head.load_state_dict(load_file(str(Path(options.path) / "model.safetensors")))
        self.head.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        draft_ids = self.head.draft_ids
        self._draft_ids = draft_ids if draft_ids.numel() else None  # [Vd] target ids, or the full vocabulary
        # the LM head's rows for the draft vocabulary as a layer of their own, read once: a packed LM head
        # makes every .weight read a dense copy of the whole [V, H] matrix
        self._draft_out: torch.nn.Module | None = None
        if self._draft_ids is not None:
            out = torch.nn.Linear(weight.shape[1], len(draft_ids), bias=False, device=target.device,
                                  dtype=target.dtype)
            out.weight.data.copy_(weight[draft_ids])  # [Vd, H]
            self._draft_out = out.requires_grad_(False)
        self._pack(options.linear_backend)
        self._state: dict[str, SeqState] = {}
        self.prefix_store = HeadKVStore(target.num_blocks)  # at most one head block per target block

    def _pack(self, backend: str) -> None:
        reason = onednn_unavailable_reason(self.head.fc.weight) if backend == "onednn" else None
        if reason is not None:  # the device or torch build (the dtype is checked in validate_against)
            raise ValueError(onednn_problem(reason))
        layers = torch.nn.ModuleDict({"head": self.head})
        if self._draft_out is not None:
            layers["out"] = self._draft_out
        pack_linear_layers(layers, backend)
        self._draft_out = layers["out"] if "out" in layers else None

    # --- propose -------------------------------------------------------------
    def _catch_up(self, batch: StepBatch, speculating: list[str]) -> dict[str, torch.Tensor]:
        """Move the pending entries of the ``speculating`` decodes into their
        head caches, batched over them, ``CATCH_UP_ROWS`` rows of each per head
        forward; returns each one's last entry's predicted feature [H]."""
        states = [(rid, st) for rid in speculating
                  if (st := self._state.get(rid)) is not None and st.pending_tokens]
        requests = {e.request.request_id: e.request for e in batch.entries}
        features: dict[str, torch.Tensor] = {}
        while states:
            features.update(self._extend(states, requests))
            states = [(rid, st) for rid, st in states if st.pending_tokens]
        return features

    def _extend(self, states: list[tuple[str, SeqState]],
                requests: dict[str, RequestView]) -> dict[str, torch.Tensor]:
        """One head forward over up to ``CATCH_UP_ROWS`` pending entries of each
        of ``states``; the last row's predicted feature [H] of each."""
        device = self.context.target.device
        tokens, positions, hidden, segments = [], [], [], []
        for _, st in states:
            ids, rows = st.take(CATCH_UP_ROWS)
            start, m = st.base + st.true_len, len(ids)
            tokens += ids
            positions.append(torch.arange(start, start + m))
            hidden.append(rows)
            st.kv.truncate(st.true_len)
            segments.append((st.kv, m))
            st.true_len += m
        ids_t = torch.tensor(tokens, dtype=torch.long, device=device)
        emb = self.context.target.input_embedding(ids_t)
        new_hidden = torch.cat(hidden)
        feats = self.head.extend(emb, new_hidden.to(emb.dtype), torch.cat(positions).to(device), segments)
        row = 0
        for (rid, st), (_, m), pos in zip(states, segments, positions):  # all from the target's hidden states
            req = requests[rid]
            st.stored = store_blocks(self.prefix_store, req.block_hashes, req.token_ids, st.kv.k[:st.true_len],
                                     st.kv.v[:st.true_len], st.base, st.stored, self.context.target.block_size,
                                     int(pos[0]), new_hidden[row: row + m])
            row += m
        ends = torch.tensor([m for _, m in segments]).cumsum(0) - 1
        return {rid: feats[int(end)] for (rid, _), end in zip(states, ends)}

    def restore_prefix(self, request: RequestView, num_cached_tokens: int) -> int:
        """Rebuild ``request``'s head cache from the stored blocks its sequence
        starts with; the target may skip as many tokens as that covers."""
        self._state.pop(request.request_id, None)
        size = self.context.target.block_size
        got = stored_prefix(self.prefix_store, request.block_hashes, request.token_ids, num_cached_tokens // size,
                            size)
        if got is None:
            return 0
        target = self.context.target
        kv = SeqKV(self.head.kv_heads, self.head.head_dim, target.dtype, target.device)
        kv.append(got.k, got.v)
        st = SeqState(kv=kv, base=0, true_len=got.k.shape[0], stored=got.num_tokens // size)
        if got.pending is not None:  # the last position's entry, recomputed at the next catch-up
            st.pending_tokens.append(got.pending[0])
            st.pending_hidden.append(got.pending[1].unsqueeze(0))
        self._state[request.request_id] = st
        return got.num_tokens

    def _draw(self, features: torch.Tensor,  # [n, H] predicted features
              requests: list[RequestView], step: int, with_confidence: bool) -> DraftDraw:
        if self._draft_ids is None or self._draft_out is None:
            return draw_proposals(self.context.target.output_embedding(features).float(), requests, step,
                                  with_confidence)
        logits = self._draft_out(features).float()  # [n, Vd]
        if verifies_by_argmax(requests):  # no distribution needed: the draft vocabulary's argmax, as target ids
            draw = draw_proposals(logits, requests, step, with_confidence)
            return DraftDraw(self._draft_ids[draw.tokens].tolist(), None, draw.confidence)
        full = logits.new_full((logits.shape[0], self.context.target.vocab_size), float("-inf"))  # [n, V]
        full[:, self._draft_ids] = logits
        return draw_proposals(full, requests, step, with_confidence)

    @torch.inference_mode()
    def propose(self, batch: StepBatch) -> Proposals:
        speculating = [i for i, d in enumerate(batch.decodes) if d.num_spec_tokens > 0]
        features = self._catch_up(batch, [batch.decodes[i].request.request_id for i in speculating])
        steps = DraftSteps(len(batch.decodes), self.context.target.device)
        rows = [i for i in speculating if batch.decodes[i].request.request_id in features]
        if not rows:
            return steps.build()
        feats = torch.stack([features[batch.decodes[i].request.request_id] for i in rows])  # [n, H]
        width, depth = tree_settings(self.context)
        if width > 1:
            return self._propose_trees(batch, rows, feats, width, depth)
        threshold = self.options.confidence_threshold
        for step in range(max(batch.decodes[i].num_spec_tokens for i in rows)):
            requests = [batch.decodes[i].request for i in rows]
            draw = self._draw(feats, requests, step, with_confidence=threshold > 0)
            steps.add(step, rows, draw.tokens, draw.probs)
            sure = draw.confidence.tolist() if draw.confidence is not None else [1.0] * len(rows)
            # go on with rows that want more proposals and whose last one the head is confident in
            more = [j for j, i in enumerate(rows) if batch.decodes[i].num_spec_tokens > step + 1
                    and sure[j] >= threshold]
            if not more:
                break
            rows = [rows[j] for j in more]
            ids = torch.tensor([draw.tokens[j] for j in more], dtype=torch.long, device=feats.device)
            states = [self._state[batch.decodes[i].request.request_id] for i in rows]
            positions = torch.tensor([st.base + st.kv.length for st in states], device=feats.device)
            feats = self.head.extend(self.context.target.input_embedding(ids), feats[more], positions,
                                     [(st.kv, 1) for st in states])
        return steps.build()

    def _propose_trees(self, batch: StepBatch, rows: list[int],
                       feats: torch.Tensor,  # [len(rows), H] each row's feature after its catch-up
                       width: int, depth: int) -> Proposals:
        """Token trees from the head (``tree_draft``): decode ``rows`` get up to their
        ``num_spec_tokens`` nodes, ``width`` children per node, ``depth`` levels."""
        trees = {}
        for i in rows:
            d = batch.decodes[i]
            st = self._state[d.request.request_id]
            trees[i] = RequestTree(d.request, st.kv, st.base + st.kv.length, d.num_spec_tokens)
        target = self.context.target
        draft_trees(self.head, target.input_embedding, self._vocab_logits, target.vocab_size, list(trees.values()),
                    feats, width, depth)
        return build_proposals(trees, len(batch.decodes), target.device)

    def _vocab_logits(self, features: torch.Tensor,  # [F, H]
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [F, Vd], the draft vocabulary's ids or None
        if self._draft_ids is None or self._draft_out is None:
            return self.context.target.output_embedding(features), None
        return self._draft_out(features), self._draft_ids

    # --- commit --------------------------------------------------------------
    def _add(self, request_id: str, start: int, hidden: torch.Tensor,  # [m, H] target rows at start..
             token_ids: Sequence[int]) -> None:
        """Queue entries for positions ``start ..``: hidden state at each, with
        the token after it (cut to the tokens the request holds)."""
        following = token_ids[start + 1: start + 1 + hidden.shape[0]]
        if not following:
            return
        st = self._state.get(request_id)
        if st is None or st.next_position != start:  # new, or restarted after its state was dropped
            kv = SeqKV(self.head.kv_heads, self.head.head_dim, self.context.target.dtype, self.context.target.device)
            st = self._state[request_id] = SeqState(kv=kv, base=start)
        st.queue(following, hidden[:len(following)].clone())  # a copy, not a view of the whole forward

    def commit(self, batch: StepBatch, num_accepted: AcceptedNodes, scores: Scores) -> None:
        assert scores.prompt_hidden is not None and scores.decode_hidden is not None, \
            "eagle proposer committed without hidden states"
        row = 0
        # a request whose SamplingParams.speculative turns speculation off never drafts: nothing is kept for it
        for p in batch.prefills:
            n = p.num_new_tokens
            if p.request.params.speculation.enabled:
                self._add(p.request.request_id, p.start, scores.prompt_hidden[row: row + n], p.request.token_ids)
            row += n
        first_rows = scores.cu_num_logits[:-1].tolist()
        for d, first, path in zip(batch.decodes, first_rows, num_accepted.nodes):
            if d.request.params.speculation.enabled:  # the root's row, then the accepted path's (a tree's too)
                kept = [first] + [first + 1 + j for j in path]
                hidden = scores.decode_hidden[first: first + len(kept)] if path == list(range(len(path))) \
                    else scores.decode_hidden[torch.tensor(kept, device=scores.decode_hidden.device)]
                self._add(d.request.request_id, d.start, hidden, d.request.token_ids)

    def free(self, request_id: str) -> None:
        self._state.pop(request_id, None)
