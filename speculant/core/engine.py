"""LLMEngine: requests in, one step at a time, RequestOutputs out."""

from __future__ import annotations

import itertools
import logging
import operator

import torch

from speculant.core.attention.base import AttentionBackend
from speculant.core.config import EngineConfig
from speculant.core.model_runner import ModelRunner
from speculant.core.request import Request, RequestOutput, RequestStatus, SpecStats
from speculant.core.sampling_params import SamplingParams
from speculant.core.scheduler import Scheduler
from speculant.core.spec_components import SpecComponents, build_spec_components, resolve_backend
from speculant.core.step import StepTimes, Timer, commit, decide, propose, score

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from speculant.core.compat import validate_config

        self.config = validate_config(config)
        backend: AttentionBackend = resolve_backend(config)
        self.runner = ModelRunner(config.model, config.cache, backend)
        self.tokenizer = self.runner.tokenizer
        self.max_model_len = self.runner.max_model_len
        self.scheduler = Scheduler(config.scheduler, self.runner.block_manager, self.max_model_len)
        self.spec: SpecComponents = build_spec_components(config, self.runner)
        self._counter = itertools.count()
        self._requests: dict[str, Request] = {}
        self._seed_gen = torch.Generator().manual_seed(config.model.seed)
        self.times = StepTimes()
        self.spec_stats = SpecStats()
        self.num_steps = 0
        self.stream_text = True  # detokenize unfinished requests every step; LLM.generate turns it off

    @classmethod
    def from_config_file(cls, path: str, overrides: list[str] | None = None) -> "LLMEngine":
        from speculant.core.config import load_config

        return cls(load_config(path, overrides))

    # --- requests ------------------------------------------------------------
    def add_request(self, request_id: str | None, prompt: str | list[int],
                    params: SamplingParams | None = None) -> str:
        """Validate and queue a request; raises ValueError naming the problem
        (the engine's other requests are untouched)."""
        params = params or SamplingParams()
        if request_id is None:
            request_id = f"req-{next(self._counter)}"
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use; pick a unique id")
        self._check_sampling(params)
        text, token_ids = self._tokenize(prompt)
        self._check_prompt(token_ids)
        seed = params.seed if params.seed is not None else int(
            torch.randint(0, 2**62, (1,), generator=self._seed_gen))
        req = Request(request_id=request_id, prompt=text, prompt_token_ids=token_ids, params=params,
                      arrival_index=len(self._requests), seed=seed, eos_token_ids=self.runner.eos_token_ids)
        self._requests[request_id] = req
        self.scheduler.add(req)
        return request_id

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """Text and token ids of a prompt: a str, or a list/tuple of int token ids
        (integer-like objects such as numpy ints are converted; bools, floats and
        anything else are refused with TypeError, ids outside the vocabulary and
        text that is not valid Unicode with ValueError)."""
        if isinstance(prompt, str):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"prompt contains {prompt[exc.start:exc.end]!r} at index {exc.start}, which cannot be "
                    f"encoded as UTF-8 ({exc.reason}); remove the lone surrogates, e.g. with "
                    "text.encode('utf-8', 'replace').decode('utf-8')") from None
            return prompt, list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if isinstance(prompt, (list, tuple)):
            ids = []
            for i, t in enumerate(prompt):
                try:
                    if isinstance(t, bool):
                        raise TypeError("a bool is not a token id")
                    ids.append(operator.index(t))
                except TypeError:
                    raise TypeError(f"prompt must be a str or a list of int token ids, but item {i} is "
                                    f"{t!r} ({type(t).__name__}); pass integer token ids from this model's "
                                    "tokenizer") from None
            vocab = self.runner.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab}); "
                                 "pass ids produced by this model's tokenizer")
            return None, ids
        raise TypeError(f"prompt must be a str or a list of int token ids, got {type(prompt).__name__}; "
                        "pass text or a list of token ids (one prompt per call)")

    def _check_sampling(self, params: SamplingParams) -> None:
        if self.spec.proposer is None or params.greedy:
            return
        from speculant.core.compat import sampling_reasons

        reasons = sampling_reasons(type(self.spec.proposer), type(self.spec.acceptance))
        if reasons:
            raise ValueError(f"temperature={params.temperature} is not supported by this speculative "
                             "configuration: " + "; ".join(reasons))

    def _check_prompt(self, token_ids: list[int]) -> None:
        n, limit = len(token_ids), self.max_model_len
        if n == 0:
            raise ValueError("prompt is empty (0 tokens); pass at least one token")
        if n >= limit:
            raise ValueError(f"prompt has {n} tokens but max_model_len is {limit}, leaving no room to "
                             "generate; shorten the prompt or raise model.max_model_len")
        sched = self.config.scheduler
        if not sched.enable_chunked_prefill and n > sched.max_num_batched_tokens:
            raise ValueError(
                f"prompt has {n} tokens, more than scheduler.max_num_batched_tokens="
                f"{sched.max_num_batched_tokens}, and scheduler.enable_chunked_prefill is false; "
                "enable chunked prefill or raise max_num_batched_tokens")
        blocks = self.runner.block_manager
        if blocks.num_blocks_for(n + 1) > blocks.num_blocks:
            raise ValueError(f"prompt needs {blocks.num_blocks_for(n + 1)} KV blocks but the pool has "
                             f"{blocks.num_blocks}; raise cache.num_blocks or cache.memory_gb")

    def abort_request(self, request_id: str) -> bool:
        req = self._requests.get(request_id)
        if req is None or req.finished:
            return False
        self._finish(req, "abort")
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def _finish(self, req: Request, reason: str | None = None) -> None:
        if reason is not None:
            req.status = RequestStatus.FINISHED
            req.finish_reason = reason
        self.scheduler.remove(req)
        if self.spec.proposer is not None:
            self.spec.proposer.free(req.request_id)
        self.spec_stats.merge(req.spec_stats)
        self._requests.pop(req.request_id, None)

    # --- stepping ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return outputs of the requests it touched."""
        spec_cfg = self.config.speculative
        k = spec_cfg.num_speculative_tokens if self.spec.proposer is not None else 0
        batch = self.scheduler.schedule(k, spec_cfg.disable_by_batch_size)
        for req in batch.preempted:
            if self.spec.proposer is not None:
                self.spec.proposer.free(req.request_id)
        if batch.is_empty:
            return []
        timer, times = Timer(), StepTimes()
        proposals = propose(self.spec.proposer, batch)
        times.propose_s = timer.lap()
        scores = score(self.spec.scorer, self.runner, batch, proposals, self.spec.want_hidden)
        times.score_s = timer.lap()
        decisions = decide(self.spec.acceptance, batch, proposals, scores)
        times.accept_s = timer.lap()
        finished = commit(batch, decisions, self.runner, self._detokenize)
        if self.spec.proposer is not None:
            self.spec.proposer.commit(batch, decisions.num_accepted, scores)
        self.times.add(times)
        self.num_steps += 1
        outputs = [self._output(e.request) for e in batch.entries]
        for req in finished:
            self._finish(req)
        return outputs

    def _detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _output(self, req: Request) -> RequestOutput:
        stopped_by_string = req.finish_reason == "stop" and isinstance(req.stop_reason, str)
        if req.finished and not stopped_by_string:
            req.output_text = self._detokenize(req.output_token_ids)
        elif not req.finished and self.stream_text:
            req.output_text = self._stable_text(req)
        return RequestOutput.from_request(req)

    def _stable_text(self, req: Request) -> str:
        """Text of an unfinished request that later steps will only extend:
        a trailing partial character (U+FFFD) and any tail that could still
        become the start of a stop string are held back."""
        text = self._detokenize(req.output_token_ids).rstrip("\ufffd")
        hold = max((len(s) for s in req.params.stop), default=1) - 1
        return text[: len(text) - hold] if hold > 0 else text

    def reset_metrics(self) -> None:
        """Forget the counters of finished requests and step timings."""
        self.times = StepTimes()
        self.spec_stats = SpecStats()
        self.num_steps = 0

    def get_metrics(self) -> dict:
        stats = SpecStats()
        stats.merge(self.spec_stats)
        for req in self._requests.values():
            stats.merge(req.spec_stats)
        return {
            "num_engine_steps": self.num_steps,
            "propose_s": self.times.propose_s,
            "score_s": self.times.score_s,
            "accept_s": self.times.accept_s,
            **stats.as_dict(),
        }
