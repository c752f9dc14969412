"""``speculant serve`` with two test plugins registered first (run as a script).

``raising_ngram`` is the n-gram proposer, except that ``propose`` raises when a
request whose prompt starts with ``PROPOSE_FAIL`` is in the batch: the engine
contains it (the step runs without proposals, the request succeeds, and
``proposer_errors`` counts it); it also sleeps in steps holding a request whose
prompt starts with ``SLOW``, so a test can keep running slots busy. ``faulty_scorer`` is the MQA scorer, except
that it raises whenever a request whose prompt starts with ``SCORE_FAIL`` is
in the batch: the engine retries, isolates, and fails that request alone,
with a message naming the plugin.

Plugins see token ids, not prompt text (the contract's ``RequestView``), so
the markers are matched as token ids: the served model's tokenizer (from the
``--config`` file) encodes each marker once at start-up.
"""

from __future__ import annotations

import sys
import time

from speculant.plugins import hookimpl
from speculant.plugins.manager import register_plugin
from speculant.proposers.ngram import NgramProposer
from speculant.scorers.mqa import MQAScorer

PROPOSE_FAIL = "PROPOSE_FAIL"
SCORE_FAIL = "SCORE_FAIL"
SLOW = "SLOW"  # steps with such a request take SLOW_STEP_S more: it holds its slot for a while
SLOW_STEP_S = 0.2


MARKER_IDS: dict[str, tuple[int, ...]] = {}  # marker -> its token ids, set in __main__
SPECIAL_IDS: set[int] = set()


def encode_markers(argv: list[str]) -> None:
    from transformers import AutoTokenizer

    from speculant.config.models import read_config_file

    config = read_config_file(argv[argv.index("--config") + 1])
    tok = AutoTokenizer.from_pretrained(config["model"].get("tokenizer") or config["model"]["path"])
    SPECIAL_IDS.update(tok.all_special_ids)
    for marker in (PROPOSE_FAIL, SCORE_FAIL, SLOW):
        MARKER_IDS[marker] = tuple(tok(marker, add_special_tokens=False).input_ids)


def _starts_with(prompt_ids, marker: str) -> bool:
    ids = MARKER_IDS[marker]
    start = 0
    while start < len(prompt_ids) and prompt_ids[start] in SPECIAL_IDS:
        start += 1
    return tuple(prompt_ids[start:start + len(ids)]) == ids


def _marked(batch, marker: str) -> bool:
    return any(_starts_with(e.request.token_ids[:e.request.num_prompt_tokens], marker) for e in batch.entries)


class RaisingNgram(NgramProposer):
    name = "raising_ngram"
    api_version = "3.0"

    def propose(self, batch):
        if _marked(batch, SLOW):
            time.sleep(SLOW_STEP_S)
        if _marked(batch, PROPOSE_FAIL):
            raise RuntimeError("raising_ngram: injected propose fault")
        return super().propose(batch)


class FaultyScorer(MQAScorer):
    name = "faulty_scorer"
    api_version = "3.0"

    def score(self, runner, batch, proposals, want_hidden=False):
        if _marked(batch, SCORE_FAIL):
            raise RuntimeError("injected scoring fault")
        return super().score(runner, batch, proposals, want_hidden)


class ServerTestPlugin:
    @hookimpl
    def register_proposers(self, register):
        register(RaisingNgram)

    @hookimpl
    def register_scorers(self, register):
        register(FaultyScorer)


if __name__ == "__main__":
    encode_markers(sys.argv)
    register_plugin(ServerTestPlugin(), "server-test-faults")
    from speculant.cli import main

    sys.exit(main(sys.argv[1:]))
