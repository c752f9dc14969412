"""LLMEngine: requests in, one step at a time, RequestOutputs out.

Faults stay with their request: a step is computed in full before any request
changes (``step_runner``), a request at fault fails alone with finish_reason
"error" and a message naming it, a faulty proposer only costs speculation
(``proposer_guard``), and ``add_request`` / ``abort_request`` from other threads
are applied between steps (``inbox``).
"""

from __future__ import annotations

import itertools
import logging
import operator
from typing import TYPE_CHECKING

import torch

from speculant.config.compat import default_plugins, sampling_reasons, structured_reasons, validate_config
from speculant.config.models import EngineConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.block_manager import BlockManager
from speculant.engine.commit import apply
from speculant.engine.cost_cache import load_cost_model
from speculant.engine.cost_model import CostModel
from speculant.engine.detokenizer import Detokenizer, TextDecoder
from speculant.engine.draft_length import DraftLengthPolicy
from speculant.engine.grammar import RequestGrammar, StructuredOutputs
from speculant.engine.inbox import Inbox
from speculant.engine.prefix_caching import PrefixCache
from speculant.engine.proposer_guard import ProposerGuard
from speculant.engine.request import Request, RequestOutput, RequestStatus, SpecStats
from speculant.engine.runner_view import SequenceRunner
from speculant.engine.scheduler import Scheduler
from speculant.engine.spec_accounting import account_step
from speculant.engine.spec_components import SpecComponents, build_spec_components, resolve_backend
from speculant.engine.step import StepTimes, proposer_commits
from speculant.engine.step_runner import StepParts, StepRun, failure, run_step
from speculant.engine.tree_shape import AdaptiveTreeShapes, build_policy
from speculant.interfaces import AttentionBackend
from speculant.interfaces.data import AcceptedNodes
from speculant.model.cuda_graphs import GraphLimits
from speculant.model.runner import ModelRunner

if TYPE_CHECKING:
    from speculant.interfaces.batch import RequestView
    from speculant.interfaces.catalog import PluginCatalog as Registry

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, *, registry: Registry | None = None, source: str = "<config>") -> None:
        """Check ``config`` (the one ``validate_config`` of its path; a
        ``ConfigError`` names ``source``), then load. ``registry`` defaults to
        the loaded plugins'."""
        config = self.config = validate_config(config, registry, source=source)  # an unset k resolved
        registry = registry if registry is not None else default_plugins().registry
        backend: AttentionBackend = resolve_backend(config, registry)
        limits = GraphLimits(config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs)
        self.runner = ModelRunner(config.model, config.cache, backend, graph_limits=limits)
        self.tokenizer = self.runner.tokenizer
        self.decoder = TextDecoder.for_tokenizer(self.tokenizer, self._detokenize)
        self.max_model_len = self.runner.max_model_len
        self.blocks = BlockManager(self.runner.num_blocks, self.runner.block_size)  # the target's KV bookkeeping
        self.view = SequenceRunner(self.runner, self.blocks, "target")  # the target as scorers see it (RunnerView)
        prefix = PrefixCache(self.blocks, config.model.path, config.model.gguf_file, config.model.dtype,
                             config.model.quantization) if config.cache.enable_prefix_caching else None
        self.scheduler = Scheduler(config.scheduler, self.blocks, self.max_model_len, prefix)
        self.scheduler.on_preempt = self._preempted
        self.spec: SpecComponents = build_spec_components(config, self.runner, registry)
        self.cost: CostModel | None = None  # the adaptive policy's figures (measured at load, or configured)
        if self.spec.proposer is not None and config.speculative.draft_length.policy == "adaptive":
            self.cost = load_cost_model(config, self.runner, self.view)
        self.draft_length: DraftLengthPolicy = build_policy(config.speculative, self.cost)
        self._counter = itertools.count()
        self._requests: dict[str, Request] = {}  # every unfinished request, queued ones included
        self._aborting: set[str] = set()  # aborts waiting in the inbox
        self._inbox = Inbox()  # its lock guards _requests, _aborting, the counters and _seed_gen
        self._seed_gen = torch.Generator().manual_seed(config.model.seed)
        self.guard = ProposerGuard(self.runner.vocab_size, views=self._view_of)
        self.times = StepTimes()
        self.spec_stats = SpecStats()
        self.num_steps = 0
        self.num_failed_requests = 0
        self.num_fallback_steps = 0  # steps recomputed without speculation or request by request
        self.stream_text = True  # unfinished requests' text every step (incremental); LLM.generate turns it off
        self._structured: StructuredOutputs | None = None  # made by the first structured request

    # --- requests ------------------------------------------------------------
    def add_request(self, request_id: str | None, prompt: str | list[int],
                    params: SamplingParams | None = None) -> str:
        """Validate and queue a request; raises ValueError naming the problem
        (the engine's other requests are untouched). Thread-safe: validation
        runs in the caller's thread, the id is reserved atomically, and the
        request joins the scheduler now or, during a step, when it ends."""
        params = params or SamplingParams()
        if request_id is not None:
            self._check_id_free(request_id)
        self._check_sampling(params)
        params.speculation.check_against(self.config.speculative.proposer,
                                         self.config.speculative.num_speculative_tokens)
        grammar = self._grammar(params)
        text, token_ids = self._tokenize(prompt)
        self._check_prompt(token_ids)
        with self._inbox.lock:
            if request_id is None:
                request_id = f"req-{next(self._counter)}"
                while request_id in self._requests:
                    request_id = f"req-{next(self._counter)}"
            self._check_id_free(request_id)
            seed = params.seed if params.seed is not None else int(
                torch.randint(0, 2**62, (1,), generator=self._seed_gen))
            req = Request(request_id=request_id, prompt=text, prompt_token_ids=token_ids, params=params,
                          seed=seed, eos_token_ids=self.runner.eos_token_ids, grammar=grammar)
            self._requests[request_id] = req
            self._inbox.submit(lambda: self.scheduler.add(req))
        return request_id

    def _check_id_free(self, request_id: str) -> None:
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use by an unfinished request; "
                             "pick a unique id")

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
        assert self.spec.acceptance is not None  # built together with the proposer (build_spec_components)
        reasons = sampling_reasons(type(self.spec.proposer), type(self.spec.acceptance))
        if reasons:
            raise ValueError(f"temperature={params.temperature} is not supported by this speculative "
                             "configuration: " + "; ".join(reasons))

    @property
    def structured(self) -> StructuredOutputs:
        """The structured-output machinery (compiler, grammar cache, mask worker), made on first use."""
        with self._inbox.lock:
            if self._structured is None:
                self._structured = StructuredOutputs(self.tokenizer, self.runner.vocab_size,
                                                     self.runner.eos_token_ids)
            return self._structured

    def _grammar(self, params: SamplingParams) -> RequestGrammar | None:
        """The request's grammar state, or None; ValueError (``GrammarError``) names what cannot compile."""
        spec = params.constraint
        if spec is None:
            return None
        if self.spec.acceptance is not None:
            reasons = structured_reasons(type(self.spec.acceptance))
            if reasons:
                raise ValueError("structured output is not supported by this speculative configuration: "
                                 + "; ".join(reasons))
        return self.structured.new_state(spec)

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
        blocks = self.blocks
        if blocks.num_blocks_for(n + 1) > blocks.num_blocks:
            raise ValueError(f"prompt needs {blocks.num_blocks_for(n + 1)} KV blocks but the pool has "
                             f"{blocks.num_blocks}; raise cache.num_blocks or cache.memory_gb")

    def abort_request(self, request_id: str) -> bool:
        """Abort an unfinished request (thread-safe; during a step it takes
        effect when the step ends). False if unknown, finished or already aborted."""
        with self._inbox.lock:
            req = self._requests.get(request_id)
            if req is None or req.finished or request_id in self._aborting:
                return False
            self._aborting.add(request_id)
            self._inbox.submit(lambda: self._abort_now(req))
            return True

    def _abort_now(self, req: Request) -> None:
        self._aborting.discard(req.request_id)
        if not req.finished:
            self._finish(req, "abort")

    def has_unfinished_requests(self) -> bool:
        with self._inbox.lock:
            return self.scheduler.num_unfinished > 0 or self._inbox.pending > 0

    def _finish(self, req: Request, reason: str | None = None) -> None:
        if reason is not None:
            req.status = RequestStatus.FINISHED
            req.finish_reason = reason
        self.scheduler.remove(req)
        req.detokenizer = Detokenizer()  # its text is output_text now
        if self.spec.proposer is not None:
            self.guard.free(self.spec.proposer, req.request_id)
            self.draft_length.free(req.request_id)
        with self._inbox.lock:
            self.spec_stats.merge(req.spec_stats)
            self._requests.pop(req.request_id, None)

    def _fail(self, req: Request, message: str) -> None:
        """Finish ``req`` with finish_reason "error": its blocks and proposer state are freed."""
        req.error = message
        self.num_failed_requests += 1
        self._finish(req, "error")

    # --- stepping ------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return outputs of the requests it touched.
        Never raises for a request's or a proposer's fault: a failed request's
        output has finish_reason "error" and ``error`` naming it and the cause."""
        with self._inbox.stepping():
            return self._step()

    def at_idle(self) -> None:
        """The loop ran out of work: measure the cost curve again if live step
        timings showed it was taken under load (``CostModel.remeasure_if_due``)."""
        if self.cost is not None and self.cost.remeasure_due:
            with self._inbox.stepping():  # requests added meanwhile join when it ends
                try:
                    self.cost.remeasure_if_due()
                except Exception:  # the old curve still serves: only speed is at stake
                    logger.exception("measuring the cost curve again failed; keeping the current one")

    def _preempted(self, req: Request) -> None:
        """A request lost its blocks (the scheduler tells at once, so a proposer
        restoring it in the same step starts clean)."""
        if self.spec.proposer is not None:
            self.guard.reset(self.spec.proposer, [req.request_id])

    def _restore(self, req: Request, num_cached_tokens: int) -> int:
        proposer = self.spec.proposer
        return num_cached_tokens if proposer is None else \
            self.guard.restore_prefix(proposer, req.view, num_cached_tokens)

    def _view_of(self, request_id: str) -> RequestView | None:
        req = self._requests.get(request_id)
        return req.view if req is not None else None

    @property
    def prefix_caching(self) -> bool:
        """Whether cached prefixes are skipped now: enabled, and the proposer (if
        any) can restore its state for them (``supports_prefix_caching``)."""
        proposer = self.spec.proposer
        return self.scheduler.prefix is not None and (
            proposer is None or proposer.capabilities.supports_prefix_caching)

    def _step(self) -> list[RequestOutput]:
        proposer = self.spec.proposer
        draft_lengths = self.draft_length.plan(self.scheduler.running) if proposer is not None else None
        batch = self.scheduler.schedule(draft_lengths, self._restore if self.prefix_caching else None)
        if batch.is_empty:
            return []
        trees = self.draft_length if isinstance(self.draft_length, AdaptiveTreeShapes) else None
        parts = StepParts(self.view, proposer, self.spec.scorer, self.spec.acceptance, self.guard,
                          self.spec.want_hidden, self.decoder, self.stream_text, self._structured, trees)
        self.view.begin_step(batch.entries)  # each request's handle, for this step's plugins
        try:
            run = run_step(batch, parts)
        except Exception as exc:  # a fault of the step machinery itself: no one to blame
            logger.exception("engine step failed outside any request's computation")
            run = StepRun([], {i: failure(e, "the engine ran its step", exc) for i, e in enumerate(batch.entries)},
                          None, [], fallback="isolated")
        finally:
            self.view.end_step()
        for plan in run.plans:
            apply(plan)  # plain assignments: cannot fail halfway
        drafted = account_step(batch, run.plans, run.times.propose_s, proposer is not None)
        if self.cost is not None:
            asked = 0 if batch.prefills else sum(1 for d in batch.decodes if d.num_spec_tokens)
            self.cost.observe_step(run.times.propose_s, run.times.accept_s, len(batch.decodes), drafted, asked)
            if not batch.prefills and not run.fallback:  # one forward of decodes alone: checks the curve
                # its rows: each decode's token and the proposals verified (a budget may go unused:
                # a proposer that found fewer, a tree cut to its planned shape)
                self.cost.observe_forward(len(batch.decodes) + drafted, run.times.score_s)
        for plan in run.plans:
            self.scheduler.cache_committed(plan.entry.request)
        if proposer is not None and proposer_commits(proposer, batch):
            if run.scores is not None:
                accepted = AcceptedNodes.chain(run.num_accepted) if run.accepted_nodes is None else \
                    AcceptedNodes([path if a else [] for path, a in zip(run.accepted_nodes, run.num_accepted)])
                self.guard.commit(proposer, batch.view(), accepted, run.scores)
            else:  # the step was not computed as one batch: the proposer rebuilds its state
                self.guard.reset(proposer, [e.request.request_id for e in batch.entries])
        if trees is not None:  # the accepted paths of the trees it shaped (None: not verified as planned)
            trees.observe(batch, None if run.scores is None or run.accepted_nodes is None else
                          [path[:a] for path, a in zip(run.accepted_nodes, run.num_accepted)])
        for idx, message in run.errors.items():
            self._fail(batch.entries[idx].request, message)
        self.times.add(run.times)
        self.num_steps += 1
        self.num_fallback_steps += bool(run.fallback)
        outputs = [self._output(e.request) for e in batch.entries]
        for e in batch.entries:
            if e.request.finished and self._requests.get(e.request.request_id) is e.request:
                self._finish(e.request)
        return outputs

    def _detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _output(self, req: Request) -> RequestOutput:
        stopped_by_string = req.finish_reason == "stop" and isinstance(req.stop_reason, str)
        try:
            if req.finished and not stopped_by_string:
                req.output_text = self._detokenize(req.output_token_ids)
            elif not req.finished and self.stream_text:
                req.output_text = self._stable_text(req)
        except Exception as exc:  # noqa: BLE001 - detokenizing one request must not fail the step
            if not req.finished:
                req.status, req.finish_reason = RequestStatus.FINISHED, "error"
                req.error = f"request {req.request_id!r} failed while detokenizing its output: " \
                            f"{type(exc).__name__}: {exc}"
                self.num_failed_requests += 1
        return RequestOutput.from_request(req)

    def _stable_text(self, req: Request) -> str:
        """Text of an unfinished request that later steps will only extend:
        a trailing partial character (U+FFFD) and any tail that could still
        become the start of a stop string are held back. Read from the
        request's incremental text, which planning keeps up to date."""
        hold = max((len(s) for s in req.params.stop), default=1) - 1
        return req.detokenizer.stable_text(hold)

    def reset_metrics(self) -> None:
        """Forget the counters of finished requests and step timings."""
        with self._inbox.lock:
            self.times = StepTimes()
            self.spec_stats = SpecStats()
            self.num_steps = 0
            self.num_failed_requests = self.num_fallback_steps = 0
            self.guard.errors = self.guard.slow_calls = 0
            self.draft_length.reset_metrics()
            if self.scheduler.prefix is not None:
                self.scheduler.prefix.reset_stats()

    def spec_totals(self) -> SpecStats:
        """Speculation counters summed over finished and unfinished requests
        (a copy; safe from any thread). Never decrease, except at ``reset_metrics``."""
        stats = SpecStats()
        with self._inbox.lock:
            stats.merge(self.spec_stats)
            for req in list(self._requests.values()):
                stats.merge(req.spec_stats)
        return stats

    def occupancy(self) -> dict[str, int]:
        """What the engine holds now (safe from any thread): requests waiting
        (queued or preempted, changes still in the inbox included), running, and
        the target's KV blocks in use out of the pool."""
        with self._inbox.lock:
            blocks = self.blocks
            return {"num_waiting": len(self.scheduler.waiting) + self._inbox.pending,
                    "num_running": len(self.scheduler.running),
                    "num_kv_blocks_in_use": blocks.num_used_blocks,
                    "num_kv_blocks_cached": blocks.num_cached_blocks,
                    "num_kv_blocks": blocks.num_blocks}

    def get_metrics(self) -> dict:
        """Counters and timings; safe to call from any thread."""
        stats = self.spec_totals().as_dict()
        stats.pop("propose_s")  # the engine's own timer, below
        return {
            "num_engine_steps": self.num_steps,
            "propose_s": self.times.propose_s,
            "score_s": self.times.score_s,
            "accept_s": self.times.accept_s,
            "proposer_errors": self.guard.errors,
            "slow_proposer_calls": self.guard.slow_calls,
            "failed_requests": self.num_failed_requests,
            "fallback_steps": self.num_fallback_steps,
            **self.draft_length.metrics(),
            "prefix_caching": self.prefix_caching,
            **(self.scheduler.prefix.metrics() if self.scheduler.prefix is not None else {}),
            **stats,
            **(self.cost.describe() if self.cost is not None else {}),
            **(self._structured_metrics()),
        }

    def _structured_metrics(self) -> dict:
        s = self._structured
        if s is None:
            return {}
        return {"structured_mask_s": s.mask_s, "structured_mask_cpu_s": s.mask_cpu_s,
                "structured_wait_s": s.wait_s, "structured_apply_s": s.apply_s,
                "structured_mask_rows": s.num_mask_rows, "structured_cut_tokens": s.num_cut_tokens,
                "structured_grammars_compiled": s.compiler.num_compiled,
                "structured_grammar_cache_hits": s.compiler.num_cache_hits}
