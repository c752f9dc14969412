"""Every tensor handed between the stages of a step lives on the runner's device,
in the flat layout.

Whole engine runs (ngram + mqa, draft_model + batch_expansion, medusa with
chunked prefill off; greedy and seeded sampling requests, one asking for
log-probs) with the stages wrapped: ``propose``'s ``Proposals``, ``score``'s
``Scores``, what the acceptance method (or ``greedy_accept``) receives and
returns are recorded, and each tensor's device is compared with the runner's.
On a machine with CUDA the engine runs there (``model.device = "cuda"``);
otherwise on the CPU, where the same checks guard the layout invariants
(``n + T`` target rows, offsets consistent between proposals and scores).
"""

from __future__ import annotations

import pytest
import torch

import speculant.engine.step as step_mod
import speculant.engine.step_runner as step_runner
from speculant import LLM, SamplingParams
from tiny_models import random_prompts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = {
    "ngram+mqa": ("ngram", "mqa", True),
    "draft_model+batch_expansion": ("draft_model", "batch_expansion", True),
    "medusa, chunking off": ("medusa", "mqa", False),
}
PROMPTS = random_prompts([7, 12, 5, 16], seed=11)
# repetitive prompts give the n-gram proposer something to propose
PROMPTS += [[3, 4, 5, 6] * 4, [9, 8, 7] * 5]


def params() -> list[SamplingParams]:
    # greedy requests run longer, so the last steps are all-greedy (the greedy_accept path)
    return [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=8, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            SamplingParams(temperature=0.7, seed=4, max_tokens=8, ignore_eos=True, logprobs=2),
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)]


class Recorder:
    """Devices of every tensor seen at each stage boundary, plus layout checks."""

    def __init__(self) -> None:
        self.devices: dict[str, set[torch.device]] = {}
        self.calls: dict[str, int] = {}

    def see(self, where: str, **tensors) -> None:
        self.calls[where] = self.calls.get(where, 0) + 1
        for name, t in tensors.items():
            if t is not None:
                assert isinstance(t, torch.Tensor), f"{where}.{name} is {type(t).__name__}"
                self.devices.setdefault(f"{where}.{name}", set()).add(t.device)


def install(monkeypatch, llm: LLM, rec: Recorder) -> None:
    real_propose, real_score, real_decide = step_runner.propose, step_runner.score, step_runner.decide
    real_greedy = step_mod.greedy_accept
    acceptance = llm.engine.spec.acceptance
    real_accept = acceptance.accept

    def propose(*args, **kwargs):
        p = real_propose(*args, **kwargs)
        rec.see("proposals", token_ids=p.token_ids, cu_num_draft_tokens=p.cu_num_draft_tokens, probs=p.probs)
        assert p.token_ids.dim() == 1 and p.cu_num_draft_tokens.dim() == 1
        if p.probs is not None:
            assert p.probs.shape[0] == p.num_draft_tokens
        return p

    def score(scorer, runner, batch, proposals, want_hidden=False):
        s = real_score(scorer, runner, batch, proposals, want_hidden)
        rec.see("scores", prefill_logits=s.prefill_logits, decode_logits=s.decode_logits,
                cu_num_logits=s.cu_num_logits, prefill_hidden=s.prefill_hidden, decode_hidden=s.decode_hidden)
        n = len(batch.decodes)
        assert s.decode_logits.shape[0] == n + proposals.num_draft_tokens  # flat: no padding rows
        assert s.cu_num_logits.tolist() == [c + i for i, c in enumerate(proposals.cu_num_draft_tokens.tolist())]
        return s

    def decide(acc, batch, proposals, scores):
        rec.see("decide_in", token_ids=proposals.token_ids, cu_num_draft_tokens=proposals.cu_num_draft_tokens,
                decode_logits=scores.decode_logits)
        return real_decide(acc, batch, proposals, scores)

    def greedy_accept(logits, ids, cu):
        out = real_greedy(logits, ids, cu)
        rec.see("greedy_accept", logits=logits, draft_token_ids=ids, cu_num_draft_tokens=cu,
                accepted=out.token_ids, num_accepted=out.num_accepted)
        return out

    def accept(target_logprobs, ids, cu, probs, greedy, generators):
        out = real_accept(target_logprobs, ids, cu, probs, greedy, generators)
        rec.see("accept", target_logprobs=target_logprobs, draft_token_ids=ids, cu_num_draft_tokens=cu,
                draft_probs=probs, greedy=greedy, accepted=out.token_ids, num_accepted=out.num_accepted)
        return out

    monkeypatch.setattr(step_runner, "propose", propose)
    monkeypatch.setattr(step_runner, "score", score)
    monkeypatch.setattr(step_runner, "decide", decide)
    monkeypatch.setattr(step_mod, "greedy_accept", greedy_accept)
    monkeypatch.setattr(acceptance, "accept", accept)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_stage_hands_tensors_on_the_runner_device(case, monkeypatch, llama_dir, spec_noisy_draft_dir,
                                                        random_heads_dirs):
    proposer, scorer, chunked = case
    options = {"ngram": {}, "draft_model": {"model": str(spec_noisy_draft_dir)},
               "medusa": {"path": str(random_heads_dirs["medusa"])}}[proposer]
    llm = LLM(model=str(llama_dir), device=DEVICE, block_size=4, max_model_len=96,
              max_num_batched_tokens=48 if chunked else 96, max_num_seqs=6, enable_chunked_prefill=chunked,
              speculative={"proposer": proposer, "proposer_options": options, "scorer": scorer,
                           "acceptance": "rejection", "num_speculative_tokens": 3})
    rec = Recorder()
    install(monkeypatch, llm, rec)
    outs = llm.generate(PROMPTS, params(), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params()]

    device = torch.empty(0, device=llm.engine.runner.device).device  # "cuda" -> "cuda:0"
    wrong = {k: v for k, v in rec.devices.items() if v != {device}}
    assert not wrong, f"tensors off the runner's device {device}: {wrong}"
    # the wrapping saw every boundary, draft probabilities included where the proposer has them
    assert rec.calls["accept"] > 0 and rec.calls["greedy_accept"] > 0, rec.calls
    assert llm.get_metrics()["num_draft_tokens"] > 0
    must = {"proposals.token_ids", "scores.decode_logits", "scores.cu_num_logits", "accept.accepted",
            "accept.target_logprobs", "greedy_accept.accepted"}
    if proposer != "ngram":
        must |= {"proposals.probs", "accept.draft_probs"}
    if proposer == "medusa":
        must |= {"scores.decode_hidden"}
    assert must <= set(rec.devices), sorted(must - set(rec.devices))
