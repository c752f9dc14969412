"""An oracle proposer, for benchmarks only.

It proposes the target's own greedy continuation, corrupted at a chosen rate:
each proposed token is the true next token with probability ``alpha`` and a
wrong token otherwise. It always proposes the full ``num_spec_tokens`` (it does
not stop at its first wrong token), so under greedy verification a proposal is
accepted at position j with probability alpha given that positions < j were,
and a step emits E = (1 - alpha^(k+1)) / (1 - alpha) tokens on average, the
expected-length formula of the speculative bound. Proposing costs ~nothing,
so oracle runs show the best case of a free, perfectly-calibrated proposer.

"True" means the continuation a non-speculative greedy run produced for that
prompt, computed beforehand and passed in a JSON file::

    [{"prompt_token_ids": [...], "continuation": [...]}, ...]

Requests are looked up by their prompt token ids; a request whose prompt is
not in the file, or that has generated past the stored continuation, gets no
proposals (never silent guesses). If a speculative run's output leaves the
stored continuation (an fp32 near-tie broken differently by a k+1-token
forward), the oracle notices and stops proposing for that request; the
``diverged`` counter reports it, since the realized acceptance then drops.

Register at runtime (never as an installed entry point)::

    from speculant.bench.oracle import register
    register()   # speculative={"proposer": "oracle", "proposer_options": {...}}
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from speculant.interfaces import Proposals, Proposer, ProposerCapabilities, ProposerContext
from speculant.plugins.hookspecs import hookimpl
from speculant.plugins.manager import load_plugins, register_plugin, unregister_plugin

PLUGIN_NAME = "benchmark-oracle"


class OracleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    continuations: str = Field(min_length=1)
    """JSON file: a list of {"prompt_token_ids": [...], "continuation": [...]}."""
    alpha: float = Field(default=0.8, ge=0.0, le=1.0)
    """Probability that each proposed token is the true next token."""
    seed: int = 0
    """Seeds the per-request stream of right/wrong draws and wrong tokens."""


def load_continuations(path: str | Path) -> dict[tuple[int, ...], list[int]]:
    data = json.loads(Path(path).read_text())
    return {tuple(item["prompt_token_ids"]): list(item["continuation"]) for item in data}


def save_continuations(path: str | Path, pairs: list[tuple[list[int], list[int]]]) -> None:
    items = [{"prompt_token_ids": list(p), "continuation": list(c)} for p, c in pairs]
    Path(path).write_text(json.dumps(items))


class OracleProposer(Proposer):
    name = "oracle"
    api_version = "3.0"
    capabilities = ProposerCapabilities(
        needs_target_hidden_states=False, supports_chunked_prefill=True, draft_probs="one_hot",
        max_num_speculative_tokens=None, supports_prefix_caching=True)
    Options: ClassVar[type[BaseModel]] = OracleOptions
    options: OracleOptions

    @classmethod
    def validate_against(cls, options: OracleOptions, config) -> list[str]:
        if not Path(options.continuations).is_file():
            return [f"speculative.proposer_options.continuations = {options.continuations!r}: no such file; "
                    "write it with speculant.bench.oracle.save_continuations"]
        return []

    def __init__(self, options: OracleOptions, context: ProposerContext) -> None:
        super().__init__(options, context)
        self.table = load_continuations(options.continuations)
        self.vocab_size = context.target.vocab_size
        self._rngs: dict[str, random.Random] = {}
        self.diverged: set[str] = set()
        self.num_proposed = 0
        self.num_true = 0

    def _rng(self, request_id: str, prompt: tuple[int, ...]) -> random.Random:
        rng = self._rngs.get(request_id)
        if rng is None:
            rng = self._rngs[request_id] = random.Random(hash((self.options.seed, prompt)))
        return rng

    def _row(self, d) -> list[int]:
        req = d.request
        k = d.num_spec_tokens
        if k <= 0 or req.request_id in self.diverged:
            return []
        prompt = tuple(req.prompt_token_ids)
        cont = self.table.get(prompt)
        if cont is None:
            return []
        out = req.output_token_ids
        n = len(out)
        if out != cont[:n]:  # the run left the oracle's continuation
            self.diverged.add(req.request_id)
            return []
        truth = cont[n:n + k]
        rng = self._rng(req.request_id, prompt)
        row = []
        for tok in truth:
            if rng.random() < self.options.alpha:
                row.append(tok)
                self.num_true += 1
            else:  # any token but the true one: greedy verification rejects it
                row.append((tok + 1 + rng.randrange(self.vocab_size - 1)) % self.vocab_size)
        self.num_proposed += len(row)
        return row

    def reset(self, alpha: float | None = None, seed: int | None = None) -> None:
        """Start afresh (benchmark helper): new alpha and/or seed, no RNG
        streams, counters or divergence marks carried over."""
        update = {k: v for k, v in (("alpha", alpha), ("seed", seed)) if v is not None}
        self.options = OracleOptions.model_validate({**self.options.model_dump(), **update})
        self._rngs.clear()
        self.diverged.clear()
        self.num_proposed = self.num_true = 0

    def propose(self, batch) -> Proposals:
        return Proposals.from_lists([self._row(d) for d in batch.decodes])

    def free(self, request_id: str) -> None:
        self._rngs.pop(request_id, None)


@hookimpl
def register_proposers(register) -> None:
    register(OracleProposer)


def register() -> None:
    """Register this module as a plugin in the current process (idempotent)."""
    if "oracle" in load_plugins().registry.names("proposer"):
        return
    register_plugin(sys.modules[__name__], PLUGIN_NAME)


def unregister() -> None:
    unregister_plugin(PLUGIN_NAME)


__all__ = ["OracleOptions", "OracleProposer", "load_continuations", "register", "save_continuations",
           "unregister"]
