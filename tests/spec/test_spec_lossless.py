"""Lossless sampling end to end: with ``rejection`` acceptance, the tokens the
engine samples under speculation follow the target's distribution.

Setup: a tiny llama with a 16-token vocabulary, a fixed prompt (a permutation
of the vocabulary; for the n-gram and suffix proposers followed by 16 tokens sampled from
the target, so it finds every first token and proposes continuations the
target often accepts), and N = 2000 requests with seeds 0..N-1 and
max_tokens = 4 in one batch. The first token comes from the prefill; with
k = 2 the first decode step verifies 2 proposals, so tokens 2-3 are accepted
proposals or recovered tokens and token 4 is a bonus token or comes from a
later step.

Reference: transformers' logits for every continuation of the prompt (all
16^3 three-token continuations in one batch), filtered by the request's
temperature / top-k / min-p with an independent implementation, give the exact
marginal of each output position: m1 = p(.|x), m2(b) = sum_a m1(a) p(b|x,a),
and so on.

Statistical test and bound: Pearson's chi-square goodness of fit of the N
observed tokens at each position against that marginal (cells with expected
count < 5 pooled), passing when p > 1e-3. Under a correct sampler a fresh seed
fails one check with probability 1e-3; the seeds are fixed, so the result is
deterministic. Power: the same test at the same N must reject (p < 1e-6) the
marginal a sampler would produce if it emitted the proposals unchecked (and,
measured while writing this: dropping the residual max(0, p - q) for p, or
drawing the bonus token from the wrong position, gives p-values of 1e-4 to
1e-28 on some output position).
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from fast_paths import expect_fast_forward
from spec_helpers import run
from speculant import LLM, SamplingParams
from speculant.engine.batch import ScheduledRequest, StepBatch
from speculant.engine.request import Request
from speculant.plugin_api.testing import stats
from speculant.plugin_api.testing.stats import chi_square_p, filtered_probs, next_token_probs  # noqa: F401 - shared
from speculant.proposers.ngram import propose_continuation
from speculant.proposers.suffix import SuffixOptions, SuffixProposer
from tiny_models import build_model

V = 16
N = 2000
K = 2
MAX_TOKENS = 4
P_MIN = 1e-3


def noisy_copy(src, dst, sigma: float, seed: int):
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * sigma * p.std())
    model.save_pretrained(dst)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, dst)
    return dst


@torch.no_grad()
def extend_by_sampling(model_dir, prompt: list[int], num: int, seed: int) -> list[int]:
    """``prompt`` plus ``num`` tokens sampled from the model (so its n-grams are
    ones the model likes: the n-gram proposer's proposals get accepted often)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen, seq = torch.Generator().manual_seed(seed), list(prompt)
    for _ in range(num):
        probs = model(torch.tensor([seq])).logits[0, -1].softmax(-1)
        seq.append(int(torch.multinomial(probs, 1, generator=gen)))
    return seq


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory, tokenizer_dir):
    """(target dir, draft dir, prompts): a 16-token-vocabulary llama, a noisy copy
    as draft, and prompts: {"draft_model": a permutation of the vocabulary,
    "ngram": that permutation + 16 tokens sampled from the target}."""
    target = build_model("llama", tmp_path_factory.mktemp("v16_target"), tokenizer_dir, vocab_size=V, seed=5)
    draft = noisy_copy(target, tmp_path_factory.mktemp("v16_draft"), sigma=0.15, seed=1)
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(0)).tolist()
    sampled = extend_by_sampling(target, perm, 16, seed=3)
    return target, draft, {"draft_model": perm, "ngram": sampled, "suffix": sampled}


def marginals(model_dir, prompt: list[int], sp: SamplingParams, num: int = MAX_TOKENS) -> list[torch.Tensor]:
    """[m_0..m_{num-1}], each [V]: the exact marginal of output token j under ``sp``."""
    return stats.marginals(model_dir, prompt, sp, num, V)


def unchecked_second_token(target, draft, proposer: str, prompt: list[int], sp: SamplingParams,
                           first: torch.Tensor) -> torch.Tensor:
    """[V]: the marginal of output token 1 (the first verified proposal) if a sampler
    emitted the proposal without checking it (and sampled the target when there was none)."""
    seqs = torch.cat([torch.tensor(prompt).expand(V, -1), torch.arange(V).unsqueeze(1)], dim=1)
    if proposer == "draft_model":
        cond = next_token_probs(draft, seqs, sp)[:, -1]  # the draft's own distribution after each t_0
    else:
        cond = next_token_probs(target, seqs, sp)[:, -1]
        for a in range(V):
            proposal = first_proposal(proposer, seqs[a].tolist())
            if proposal:
                cond[a] = torch.nn.functional.one_hot(torch.tensor(proposal[0]), V).double()
    return first @ cond


def first_proposal(proposer: str, tokens: list[int]) -> list[int]:
    """What a model-free proposer drafts first after ``tokens`` (its own text only:
    at the first verify step no request has finished, so the suffix cache is empty)."""
    if proposer == "ngram":
        return propose_continuation(tokens, 1, 1, 2)
    suffix = SuffixProposer(SuffixOptions(**PROPOSER_OPTIONS["suffix"]),
                            SimpleNamespace(target=SimpleNamespace(device=torch.device("cpu"))))  # type: ignore[arg-type]
    req = Request(request_id="r", prompt=None, prompt_token_ids=tokens, params=SamplingParams(), seed=0)
    return suffix.propose(StepBatch(decodes=[ScheduledRequest(req, 1, K)])).token_ids[:1].tolist()


def assert_follows_marginals(tokens: torch.Tensor,  # [N, MAX_TOKENS] sampled outputs
                             expected: list[torch.Tensor],  # per position [V], the target's marginal
                             what: str) -> None:
    """Every output position follows the target's marginal: no filtered-out token
    sampled, and a chi-square test that does not reject at ``P_MIN``."""
    n = tokens.shape[0]
    for j in range(tokens.shape[1]):
        counts = torch.bincount(tokens[:, j], minlength=V)
        assert int(counts[expected[j] == 0].sum()) == 0, f"{what}: token {j}: sampled a token the filters remove"
        p = chi_square_p(counts, expected[j])
        assert p > P_MIN, (f"{what}: output token {j} does not follow the target's marginal (chi-square "
                           f"p = {p:.2e});\n observed {(counts / n).tolist()}\n expected {expected[j].tolist()}")


CASES = {
    # proposer, sampling settings
    "draft_full": ("draft_model", dict(temperature=1.0)),
    "ngram_one_hot": ("ngram", dict(temperature=1.0)),
    "suffix_one_hot": ("suffix", dict(temperature=1.0)),
    "draft_filtered": ("draft_model", dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.02)),
    # token trees (multi-candidate rejection over one-hot siblings)
    "ngram_tree": ("ngram", dict(temperature=1.0)),
    "suffix_tree": ("suffix", dict(temperature=0.8, top_k=6, min_p=0.02)),
}
TREES = {"tree_width": 3, "max_tree_tokens": 6}
"""The tree cases' settings: up to 3 candidates per node, 6 nodes, K levels."""


PROPOSER_OPTIONS = {"ngram": {"min_n": 1, "max_n": 2}, "suffix": {"max_spec_factor": 2.0, "min_token_prob": 0.0}}


@pytest.mark.parametrize("case", list(CASES))
def test_rejection_sampling_matches_target_distribution(case, small_vocab):
    target, draft, prompts = small_vocab
    proposer, sampling = CASES[case]
    prompt = prompts[proposer]
    options = PROPOSER_OPTIONS[proposer] if proposer != "draft_model" else {"model": str(draft)}
    trees = TREES if case.endswith("_tree") else {}
    llm = LLM(model=str(target), max_num_seqs=1024, max_num_batched_tokens=1024 * (len(prompt) + 1),
              speculative={"proposer": proposer, "proposer_options": options, "acceptance": "rejection",
                           "num_speculative_tokens": K, **trees})
    # the target (and the draft model) run the fast decoder: losslessness is checked on that path
    assert expect_fast_forward(llm) == (["target", "draft"] if proposer == "draft_model" else ["target"])
    params = [SamplingParams(seed=i, max_tokens=MAX_TOKENS, ignore_eos=True, **sampling) for i in range(N)]
    outs = run(llm, [prompt] * N, params)
    tokens = torch.tensor([o.outputs[0].token_ids for o in outs])  # [N, MAX_TOKENS]
    assert tokens.shape == (N, MAX_TOKENS)

    m = llm.get_metrics()
    # both branches of the rejection sampler ran many times: the test is not vacuous
    assert m["num_draft_tokens"] >= N
    assert m["num_accepted_tokens"] >= 100 and m["num_draft_tokens"] - m["num_accepted_tokens"] >= 100, m

    expected = marginals(target, prompt, params[0])
    assert_follows_marginals(tokens, expected, case)

    if trees:  # several candidates per position: "the first proposal, unchecked" is not one marginal
        return
    # power: output token 1 is the first verified proposal; the same test rejects the
    # marginal it would have if proposals were emitted unchecked
    unchecked = unchecked_second_token(target, draft, proposer, prompt, params[0], expected[0])
    counts = torch.bincount(tokens[:, 1], minlength=V)
    assert chi_square_p(counts, unchecked) < 1e-6, "the test cannot tell unchecked proposals apart"
