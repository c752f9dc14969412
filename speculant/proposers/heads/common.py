"""Shared machinery of hidden-state proposers.

A head directory is HF-style: ``config.json`` (``model_type``, ``hidden_size``,
``vocab_size`` and the head's own sizes) plus ``model.safetensors``. The target
hidden state that produced a request's newest token is kept per request (from
``Scores`` at commit), and the heads turn it into the next k proposals.

They read the hidden state only at rows that produce a token (a terminal
prefill chunk's last row, a decode's kept rows), never at every prompt
position, so they run under chunked prefill: the chunks before the terminal
one are not theirs to see.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Generator
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file

from speculant.interfaces import EngineConfigView, Proposals, Proposer, ProposerCapabilities, ProposerContext, Scores
from speculant.interfaces.batch import RequestView, StepBatch
from speculant.model.loading.files import read_text_config
from speculant.proposers.drafting import DraftSteps, draw_proposals

HEADS_CAPABILITIES = ProposerCapabilities(
    needs_target_hidden_states=True, needs_prompt_hidden_states=False, supports_chunked_prefill=True,
    draft_probs="full", supports_prefix_caching=True)  # the terminal chunk, always computed, is all they read
OPTION = "speculative.proposer_options.path"


class HeadsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    """Directory with the heads' config.json and model.safetensors."""


def read_head_config(path: str, model_type: str) -> dict:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{OPTION} = {path!r}: no config.json there; point it at a directory "
                                f"written by scripts/train_heads.py or save_heads()")
    data = json.loads(cfg_path.read_text())
    if data.get("model_type") != model_type:
        raise ValueError(f"{OPTION} = {path!r} holds model_type {data.get('model_type')!r}, expected "
                         f"{model_type!r}; choose the proposer that matches these heads")
    return data


def dimension_problems(head_cfg: dict, target_cfg: dict, path: str, num_spec: int, max_k: int) -> list[str]:
    problems = []
    for key in ("hidden_size", "vocab_size"):
        if head_cfg.get(key) != target_cfg.get(key):
            problems.append(f"{OPTION} = {path!r}: heads have {key} {head_cfg.get(key)} but the target has "
                            f"{target_cfg.get(key)}; train heads on this target (scripts/train_heads.py)")
    if num_spec > max_k:
        problems.append(f"speculative.num_speculative_tokens = {num_spec} but the heads at {path!r} predict "
                        f"at most {max_k} tokens; set num_speculative_tokens <= {max_k}")
    return problems


def save_heads(module: torch.nn.Module, config: dict, out_dir: str | Path) -> None:
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    # index tensors (EAGLE's draft vocabulary ids) are stored as int32: vocabularies fit, the file is
    # smaller, and load_state_dict copies them back into the module's long buffers
    save_file({k: (v.to(torch.int32) if v.dtype == torch.int64 else v).contiguous()
               for k, v in module.state_dict().items()}, str(out / "model.safetensors"))


class HiddenStateProposer(Proposer):
    """Keeps the target hidden state behind each request's newest token and
    asks the subclass's heads for proposals."""

    capabilities = HEADS_CAPABILITIES
    Options = HeadsOptions
    options: HeadsOptions
    model_type: str

    @classmethod
    @abstractmethod
    def max_tokens(cls, head_cfg: dict) -> int:
        """How many tokens these heads can propose."""

    @classmethod
    def validate_against(cls, options: HeadsOptions, config: EngineConfigView) -> list[str]:
        try:
            head_cfg = read_head_config(options.path, cls.model_type)
        except (FileNotFoundError, ValueError) as exc:
            return [str(exc)]
        if not (Path(config.model.path) / "config.json").is_file():
            return []
        return dimension_problems(head_cfg, read_text_config(config.model.path), options.path,
                                  config.speculative.num_speculative_tokens, cls.max_tokens(head_cfg))

    @classmethod
    def max_tokens_for(cls, options: HeadsOptions, config: EngineConfigView) -> int | None:
        """The heads' count (None where their config cannot be read: ``validate_against`` says why)."""
        try:
            return cls.max_tokens(read_head_config(options.path, cls.model_type))
        except (FileNotFoundError, ValueError):
            return None

    def __init__(self, options: HeadsOptions, context: ProposerContext) -> None:
        super().__init__(options, context)
        self.head_config = read_head_config(options.path, self.model_type)
        target = context.target
        weight = target.output_embedding.weight  # [V, H]
        assert isinstance(weight, torch.Tensor)
        hidden = weight.shape[1]
        problems = dimension_problems(self.head_config, {"hidden_size": hidden, "vocab_size": target.vocab_size},
                                      options.path, 0, self.max_tokens(self.head_config))
        if problems:
            raise ValueError("; ".join(problems))
        self.heads = self.build_heads(self.head_config)
        state = load_file(str(Path(options.path) / "model.safetensors"))
        self.heads.load_state_dict(state)
        self.heads.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        self._hidden: dict[str, torch.Tensor] = {}  # request id -> [H]

    @abstractmethod
    def build_heads(self, head_cfg: dict) -> torch.nn.Module:
        """The head module for ``head_cfg`` (weights are loaded afterwards)."""

    @abstractmethod
    def head_logits(self, hidden: torch.Tensor,  # [n, H]
                    last_tokens: torch.Tensor,  # [n] long
                    requests: list[RequestView], k: int) -> Generator[torch.Tensor, torch.Tensor, None]:
        """Yield logits [n, V] for proposal 0..k-1; the caller sends back
        (via generator ``send``) the tokens drawn at each step, [n] long."""

    @torch.inference_mode()
    def propose(self, batch: StepBatch) -> Proposals:
        rows = [i for i, d in enumerate(batch.decodes)
                if d.num_spec_tokens > 0 and d.request.request_id in self._hidden]
        k_max = max((batch.decodes[i].num_spec_tokens for i in rows), default=0)
        draws = DraftSteps(len(batch.decodes), self.context.target.device)
        if not rows:
            return draws.build()
        requests = [batch.decodes[i].request for i in rows]
        hidden = torch.stack([self._hidden[r.request_id] for r in requests])
        last = torch.tensor([r.token_ids[-1] for r in requests], dtype=torch.long, device=hidden.device)
        steps = self.head_logits(hidden, last, requests, k_max)
        logits = next(steps)
        for step in range(k_max):
            draw = draw_proposals(logits.float(), requests, step)
            tokens = draw.tokens
            keep = [j for j, i in enumerate(rows) if batch.decodes[i].num_spec_tokens > step]
            draws.add(step, [rows[j] for j in keep], [tokens[j] for j in keep],
                      draw.probs[keep] if draw.probs is not None else None)
            if step + 1 < k_max:
                logits = steps.send(torch.tensor(tokens, dtype=torch.long, device=hidden.device))
        return draws.build()

    def commit(self, batch: StepBatch, num_accepted: list[int], scores: Scores) -> None:
        assert scores.prefill_hidden is not None and scores.decode_hidden is not None, \
            "hidden-state proposer committed without hidden states"
        # terminal chunks, and recomputes ending one token short: both rows produced the newest token
        reporting = [p.request for p in batch.prefills if p.reports]
        for req, hidden in zip(reporting, scores.prefill_hidden):
            self._hidden[req.request_id] = hidden
        first_rows = scores.cu_num_logits[:-1].tolist()
        for d, row, a in zip(batch.decodes, first_rows, num_accepted):
            self._hidden[d.request.request_id] = scores.decode_hidden[row + a]

    def free(self, request_id: str) -> None:
        self._hidden.pop(request_id, None)
