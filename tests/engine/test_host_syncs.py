"""Host reads per step do not grow with the batch.

On a GPU every ``.tolist()`` / ``.item()`` / ``.cpu()`` of a device tensor
stalls the host until the device catches up, so the step between the model
forward and the commit reads the device a fixed number of times, whatever the
number of requests (issue 30). Counted here on the CPU, where the calls are the
same: every such call made from the engine, the scorers, the acceptance
methods, the proposers or the contract's data types during one ``step()``
(the model forward itself, ``speculant/model/``, is a separate boundary)."""

from __future__ import annotations

import collections
import traceback
from pathlib import Path

import pytest
import torch

from speculant import LLM, SamplingParams
from speculant.interfaces import Proposals, Proposer

PACKAGE = Path(__file__).resolve().parents[2] / "speculant"
COUNTED = [PACKAGE / d for d in ("engine", "scorers", "acceptance", "proposers", "interfaces")]
SIZES = (1, 3, 12)


class HostReads:
    """Counts host reads of tensors made by code under ``COUNTED`` while active."""

    def __init__(self, monkeypatch) -> None:
        self.calls: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self.active = False
        for name in ("tolist", "item", "cpu"):
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))

    def _wrap(self, name, original):
        def counted(tensor, *args, **kwargs):
            if self.active:
                caller = traceback.extract_stack(limit=2)[0]
                path = Path(caller.filename).resolve()
                if any(path.is_relative_to(d) for d in COUNTED):
                    self.calls[(name, path.name, caller.lineno or 0)] += 1
            return original(tensor, *args, **kwargs)
        return counted

    def during(self, fn) -> int:
        self.calls.clear()
        self.active = True
        try:
            fn()
        finally:
            self.active = False
        return sum(self.calls.values())


class FullRows(Proposer):
    """Wraps a model-free proposer so every decode gets its full budget of
    proposals (its own, padded with a fixed token): each counted step then has
    the same kind of work whatever the batch (with proposals, all verified)."""

    name = "full_rows"
    api_version = "3.0"

    def __init__(self, real: Proposer) -> None:
        self.real, self.context, self.options, self.capabilities = real, real.context, real.options, real.capabilities

    def propose(self, batch):
        rows = self.real.propose(batch).to_lists()
        return Proposals.from_lists([(r + [5] * d.num_spec_tokens)[:d.num_spec_tokens]
                                     for r, d in zip(rows, batch.decodes)])

    def commit(self, batch, num_accepted, scores) -> None:
        self.real.commit(batch, num_accepted, scores)

    def free(self, request_id: str) -> None:
        self.real.free(request_id)


SPECS = {
    "none": None,
    "ngram_mqa": {"proposer": "ngram", "num_speculative_tokens": 3},
    "ngram_batch_expansion": {"proposer": "ngram", "num_speculative_tokens": 3, "scorer": "batch_expansion"},
    "suffix": {"proposer": "suffix", "num_speculative_tokens": 3},
    "draft": "draft",
}


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_host_reads_per_step_do_not_grow_with_the_batch(monkeypatch, llama_dir, spec_noisy_draft_dir, spec_name,
                                                        temperature):
    spec = SPECS[spec_name]
    if spec == "draft":
        spec = {"proposer": "draft_model", "num_speculative_tokens": 3,
                "proposer_options": {"model": str(spec_noisy_draft_dir)}}
    reads = HostReads(monkeypatch)
    counts = {}
    for n in SIZES:
        llm = LLM(model=str(llama_dir), max_num_seqs=16, max_num_batched_tokens=512,
                  **({"speculative": spec} if spec else {}))
        engine = llm.engine
        if spec and spec["proposer"] in ("ngram", "suffix"):
            engine.spec.proposer = FullRows(engine.spec.proposer)
        for i in range(n):  # a repeating prompt, so the model-free proposers find matches
            engine.add_request(None, [5, 6, 7, 8] * 4, SamplingParams(temperature=temperature, max_tokens=24,
                                                                     ignore_eos=True, seed=i))
        engine.step()  # the prefills
        per_step = [reads.during(engine.step) for _ in range(4)]
        counts[n] = max(per_step)
        assert engine.has_unfinished_requests()  # every counted step ran the whole batch
    assert counts[SIZES[-1]] == counts[SIZES[0]], (counts, dict(reads.calls))
    assert counts[SIZES[0]] <= 20, dict(reads.calls)  # today 8-14 (the draft model: 2 more per drafted token)


def test_the_counter_sees_reads_made_by_speculant_code(monkeypatch):
    reads = HostReads(monkeypatch)
    proposals = Proposals.from_lists([[1, 2], [3]])
    one = reads.during(proposals.to_lists)
    five = reads.during(lambda: [proposals.to_lists() for _ in range(5)])
    assert one > 0 and five == 5 * one
    assert reads.during(lambda: torch.ones(3).tolist()) == 0  # this test file's own reads are not counted
