"""Off is off, and on again is exact: a decode planned no proposals costs a
stateful proposer no work, and when it speculates again the proposer catches
up on what it missed in one batched pass. The draft model's and EAGLE's
proposals after resuming equal those of a run that never turned speculation
off (greedy, token for token, at every position both runs drafted from), and
the draft model's first proposals equal the draft run once over the whole
prefix; also with requests preempted and aborted while they are off."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from spec_helpers import StepProbe, token_ids
from speculant import LLM, SamplingParams
from speculant.engine.draft_length import FixedDraftLength
from tiny_eagle import save_random_eagle
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

K = 3
PROMPTS = random_prompts([5, 23, 12, 9], seed=8)
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


class OnOff(FixedDraftLength):
    """Off for three steps out of every five (every request; on steps, request
    i also sits out when i + step is divisible by 4): requests stop and resume
    speculating at different positions."""

    name = "on_off"

    def lengths(self, decoding, ceilings, fixed, fixed_requests=()):
        self.step = getattr(self, "step", -1) + 1
        on = self.step % 5 in (0, 4)
        return {r.request_id: ceilings[r.request_id] if on and (i + self.step) % 4 else 0
                for i, r in enumerate(decoding)}


@pytest.fixture(scope="module")
def eagle_head(llama_dir, tmp_path_factory):
    return save_random_eagle(llama_dir, tmp_path_factory.mktemp("eagle_catch_up"), None, seed=4)


def spec_llm(llama_dir, proposer: str, draft, on_off: bool, **kw) -> LLM:
    options = {"model": str(draft)} if proposer == "draft_model" else {"path": str(draft)}
    llm = LLM(model=str(llama_dir), block_size=4, max_num_seqs=4, max_num_batched_tokens=kw.pop("budget", 16),
              speculative={"proposer": proposer, "proposer_options": options, "num_speculative_tokens": K,
                           "draft_length": {"policy": "fixed"}}, **kw)
    if on_off:
        llm.engine.draft_length = OnOff(llm.config.speculative)
    return llm


def drive(llm: LLM, abort_at: int | None = None) -> tuple[dict, dict, set[str]]:
    """Run PROMPTS to the end, recording each decode's proposals by (prompt
    index, position of its last token); with ``abort_at``, prompt 2 is aborted
    at that step. Returns (outputs by prompt index, proposals, aborted ids)."""
    eng = llm.engine
    ids = [eng.add_request(None, list(p), GREEDY) for p in PROMPTS]
    index = {rid: i for i, rid in enumerate(ids)}
    seen: dict[tuple[int, int], list[int]] = {}
    proposer, real = eng.spec.proposer, eng.spec.proposer.propose

    def propose(batch):
        out = real(batch)
        for d, row in zip(batch.decodes, out.to_lists()):
            if row:
                seen[(index[d.request.request_id], d.start)] = row
        return out

    proposer.propose = propose
    outs, steps, aborted = {}, 0, set()
    while eng.has_unfinished_requests():
        steps += 1
        assert steps < 2000
        if steps == abort_at:
            assert eng.abort_request(ids[2])
            aborted.add(ids[2])
        for o in eng.step():
            if o.finished:
                outs[index[o.request_id]] = o
    return outs, seen, aborted


@pytest.fixture(scope="module")
def reference(llama_dir):
    llm = LLM(model=str(llama_dir), block_size=4)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def drafts(request, proposer: str):
    return request.getfixturevalue("spec_noisy_draft_dir" if proposer == "draft_model" else "eagle_head")


@pytest.mark.parametrize("proposer", ["draft_model", "eagle"])
def test_resumed_proposals_equal_a_run_that_never_turned_off(llama_dir, reference, request, proposer):
    draft = drafts(request, proposer)
    always, always_seen, _ = drive(spec_llm(llama_dir, proposer, draft, on_off=False))
    llm = spec_llm(llama_dir, proposer, draft, on_off=True)
    probe = StepProbe(llm)
    outs, seen, _ = drive(llm)
    assert [outs[i].outputs[0].token_ids for i in range(len(PROMPTS))] == reference
    assert [always[i].outputs[0].token_ids for i in range(len(PROMPTS))] == reference
    shared = set(seen) & set(always_seen)
    assert len(shared) >= 10, "too few positions drafted in both runs to compare"
    assert {key: seen[key] for key in shared} == {key: always_seen[key] for key in shared}
    resumed = sum(o.metrics["num_off_steps"] > 0 and o.metrics["num_steps"] > 0 for o in outs.values())
    assert resumed == len(PROMPTS)  # every request stopped and resumed
    if probe.has_draft:  # off is off: a step of decodes that all sit out runs no draft forward
        idle = [s for s in probe.steps if not s["prefill"] and s["k"] and not any(s["k"])]
        assert idle and all(s["draft_forwards"] == 0 for s in idle)
    else:  # the head ran no forward for a request while it was off (its entries wait)
        assert not llm.engine.spec.proposer._state  # and all state was freed at the end


@torch.no_grad()
def test_resumed_draft_model_proposes_what_the_draft_says_over_the_whole_prefix(llama_dir, spec_noisy_draft_dir):
    outs, seen, _ = drive(spec_llm(llama_dir, "draft_model", spec_noisy_draft_dir, on_off=True))
    draft = AutoModelForCausalLM.from_pretrained(spec_noisy_draft_dir, dtype=torch.float32).eval()
    for (i, pos), row in seen.items():
        tokens = PROMPTS[i] + outs[i].outputs[0].token_ids
        logits = draft(torch.tensor([tokens[:pos + 1]])).logits[0, -1]
        top2 = logits.topk(2).values
        if float(top2[0] - top2[1]) > 1e-4:  # not a near-tie
            assert int(logits.argmax()) == row[0], f"prompt {i}: the draft's cache is stale at position {pos}"


@pytest.mark.parametrize("proposer", ["draft_model", "eagle"])
def test_switching_under_preemption_and_aborts(llama_dir, reference, request, proposer):
    """A pool of 20 blocks of 4 cannot hold all four requests: the latest
    arrivals are preempted (their proposer state dropped) and recomputed while
    speculation switches on and off; prompt 2 is aborted mid-run. Survivors
    equal no speculation, and proposals equal a run without either."""
    draft = drafts(request, proposer)
    always, always_seen, _ = drive(spec_llm(llama_dir, proposer, draft, on_off=False))
    llm = spec_llm(llama_dir, proposer, draft, on_off=True, num_blocks=20)
    probe = StepProbe(llm)
    outs, seen, aborted = drive(llm, abort_at=12)
    assert sum(s["preempted"] for s in probe.steps) > 0
    assert aborted and 2 not in outs  # an abort is answered by whoever asked for it, not by a step
    assert [outs[i].outputs[0].token_ids for i in (0, 1, 3)] == [reference[i] for i in (0, 1, 3)]
    shared = {key for key in set(seen) & set(always_seen) if key[0] != 2}
    assert len(shared) >= 8
    assert {key: seen[key] for key in shared} == {key: always_seen[key] for key in shared}
    eng = llm.engine
    assert eng.blocks.num_used_blocks == 0
    if proposer == "draft_model":
        assert not eng.spec.proposer._computed and eng.spec.proposer.runner._blocks.num_used_blocks == 0
    else:
        assert not eng.spec.proposer._state
    assert token_ids([outs[i] for i in (0, 1, 3)]) == [reference[i] for i in (0, 1, 3)]
