"""The EAGLE proposer on the tiny llama with randomly initialised heads
(correctness never depends on training): greedy output equals no speculation
with chunked prefill on and off; the head's cache stays in sync chunk by
chunk (its first proposal at every decode equals the head run over the whole
prefix of the target's real hidden states, and drafts are the same whatever
the chunk size); the checker now lets it run chunked."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from speculant import LLM, SamplingParams
from speculant.config.models import ConfigError
from speculant.engine.draft_length import FixedDraftLength
from speculant.proposers.eagle.model import EagleHead, SeqKV
from tiny_eagle import save_random_eagle
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = random_prompts([5, 40, 70, 13, 1], seed=3)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def heads(llama_dir, random_heads_dirs, tmp_path_factory):
    """{"draft vocab": 256 of 384 ids (the shared fixture), "full vocab": the target's LM head}"""
    full = save_random_eagle(llama_dir, tmp_path_factory.mktemp("eagle_full"), None, seed=1)
    return {"draft vocab": random_heads_dirs["eagle"], "full vocab": full}


@pytest.fixture(scope="module")
def reference(llama_dir):
    llm = LLM(model=str(llama_dir), max_num_batched_tokens=128, enable_chunked_prefill=False)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def eagle_llm(llama_dir, head, chunked: bool, budget: int = 16, **spec) -> LLM:
    return LLM(model=str(llama_dir), max_num_batched_tokens=budget if chunked else 128, max_num_seqs=4,
               enable_chunked_prefill=chunked, block_size=4,
               speculative={"proposer": "eagle", "proposer_options": {"path": str(head)},
                            "num_speculative_tokens": 3, **spec})


def record_first_proposals(llm: LLM) -> dict[tuple[str, int], list[int]]:
    """(request id, position of the decode's last token) -> its proposals, every step."""
    proposer = llm.engine.spec.proposer
    seen: dict[tuple[str, int], list[int]] = {}
    real = proposer.propose

    def propose(batch):
        out = real(batch)
        for d, row in zip(batch.decodes, out.to_lists()):
            if row:
                seen[(d.request.request_id, d.start)] = row
        return out

    proposer.propose = propose
    return seen


def test_extend_chunk_by_chunk_equals_the_whole_sequence():
    cfg = {"hidden_size": 32, "vocab_size": 50, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "intermediate_size": 48, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
           "draft_vocab_size": None}
    torch.manual_seed(0)
    head = EagleHead(cfg).eval()
    emb, hidden = torch.randn(1, 23, 32), torch.randn(1, 23, 32)
    with torch.no_grad():
        whole = head(emb, hidden)[0]
        kv, parts, start = SeqKV(2, 8, torch.float32, torch.device("cpu")), [], 0
        for m in (5, 1, 9, 3, 1, 4):
            parts.append(head.extend(emb[0, start:start + m], hidden[0, start:start + m],
                                     torch.arange(start, start + m), [(kv, m)]))
            start += m
    assert torch.allclose(torch.cat(parts), whole, atol=1e-5)


@pytest.mark.parametrize("vocab", ["draft vocab", "full vocab"])
@pytest.mark.parametrize("chunked", [False, True], ids=["chunking-off", "chunked"])
@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_greedy_equals_no_speculation(llama_dir, heads, reference, vocab, chunked, scorer):
    llm = eagle_llm(llama_dir, heads[vocab], chunked, scorer=scorer)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    m = llm.get_metrics()
    assert m["num_draft_tokens"] > 0 and m["proposer_errors"] == 0
    assert not llm.engine.spec.proposer._state  # every request's state freed


@torch.no_grad()
def test_first_proposal_equals_the_head_over_the_whole_prefix(llama_dir, heads):
    """Chunk by chunk (budget 8 splits the 40- and 70-token prompts), the
    cache holds exactly one entry per position from the target's real hidden
    states: the head run once over the whole prefix proposes the same token."""
    llm = eagle_llm(llama_dir, heads["full vocab"], chunked=True, budget=8)
    seen = record_first_proposals(llm)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert first_proposals_match_the_head_over_the_prefix(llama_dir, llm.engine.spec.proposer, outs, seen) >= 20


def first_proposals_match_the_head_over_the_prefix(llama_dir, proposer, outs, seen) -> int:
    """Assert every recorded first proposal equals the head run once over the whole
    prefix of the target's real hidden states; returns how many were checked."""
    target = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    head = proposer.head
    checked = 0
    for o in outs:
        tokens = list(o.prompt_token_ids) + list(o.outputs[0].token_ids)
        for (rid, pos), row in seen.items():
            if rid != o.request_id:
                continue
            ids = torch.tensor([tokens[:pos]])
            h = target.base_model(input_ids=ids).last_hidden_state  # [1, pos, H]: h_0 .. h_{pos-1}
            emb = target.get_input_embeddings()(torch.tensor([tokens[1:pos + 1]]))
            feature = head(emb, h)[0, -1]
            assert int(head.draft_logits(feature, target.get_output_embeddings()).argmax()) == row[0], \
                f"request {rid}: the head's cache drifted from the target's hidden states at position {pos}"
            checked += 1
    return checked


class EveryOtherStep(FixedDraftLength):
    """k proposals for each decode on even steps, none on odd ones (and never for the
    second request in arrival order on steps divisible by 3): decodes stop and
    resume speculating, as under the adaptive policy."""

    name = "every_other_step"

    def lengths(self, decoding, ceilings, fixed, fixed_requests=()):
        self.step = getattr(self, "step", -1) + 1
        return {r.request_id: 0 if self.step % 2 or (i == 1 and self.step % 3 == 0) else self.max_k
                for i, r in enumerate(decoding)}


@torch.no_grad()
@pytest.mark.parametrize("chunked", [False, True], ids=["chunking-off", "chunked"])
@pytest.mark.parametrize("catch_up_rows", [512, 3])
def test_decodes_planned_no_proposals_defer_the_head_and_stay_in_sync(llama_dir, heads, reference, chunked,
                                                                      catch_up_rows, monkeypatch):
    """A request planned k = 0 leaves its entries pending (the head does no work for
    it); when it speculates again they all enter its cache (``catch_up_rows`` per
    head forward: 3 splits every catch-up of more than 3 entries), and its first
    proposal still equals the head over the whole prefix; output equals no speculation."""
    from speculant.proposers.eagle import proposer as eagle_proposer

    monkeypatch.setattr(eagle_proposer, "CATCH_UP_ROWS", catch_up_rows)
    llm = eagle_llm(llama_dir, heads["full vocab"], chunked, budget=8)
    llm.engine.draft_length = EveryOtherStep(llm.config.speculative)
    proposer = llm.engine.spec.proposer
    seen = record_first_proposals(llm)
    deferred = []
    recording = proposer.propose

    def propose(batch):
        deferred.extend(len(proposer._state[d.request.request_id].pending_tokens) for d in batch.decodes
                        if d.num_spec_tokens > 0 and d.request.request_id in proposer._state)
        return recording(batch)

    proposer.propose = propose
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert deferred and max(deferred) >= 4  # entries of several steps waited, then caught up at once
    assert first_proposals_match_the_head_over_the_prefix(llama_dir, proposer, outs, seen) >= 10


class Never(FixedDraftLength):
    name = "never"

    def lengths(self, decoding, ceilings, fixed, fixed_requests=()):
        return {r.request_id: 0 for r in decoding}


def test_a_decode_that_never_speculates_costs_no_head_forward(llama_dir, heads, reference, monkeypatch):
    """Held at k = 0 for a whole run, a request makes no head forward and no
    ``propose`` call in a step of decodes alone; ``commit`` keeps every
    position's hidden state pending, in few pieces (``MAX_PIECES``)."""
    from speculant.proposers.eagle import proposer as eagle_proposer

    monkeypatch.setattr(eagle_proposer, "MAX_PIECES", 4)
    llm = eagle_llm(llama_dir, heads["draft vocab"], chunked=True)
    llm.engine.draft_length = Never(llm.config.speculative)
    proposer = llm.engine.spec.proposer
    calls: list[tuple[str, int]] = []
    for name in ("propose", "commit"):
        real = getattr(proposer, name)

        def spy(batch, *args, _real=real, _name=name):
            calls.append((_name, len(batch.prefills)))
            return _real(batch, *args)
        setattr(proposer, name, spy)
    extends = []
    real_extend = proposer.head.extend
    proposer.head.extend = lambda *a, **kw: extends.append(1) or real_extend(*a, **kw)
    pending = {}
    real_free = proposer.free

    def free(request_id):
        st = proposer._state.get(request_id)
        if st is not None:
            pending[request_id] = (len(st.pending_tokens), st.next_position, len(st.pending_hidden),
                                   sum(h.shape[0] for h in st.pending_hidden))
        real_free(request_id)
    proposer.free = free
    outs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference[:2]
    assert llm.get_metrics()["num_draft_tokens"] == 0
    assert not extends  # the head never ran
    assert all(num_prefills > 0 for name, num_prefills in calls if name == "propose")
    decode_only = [c for c in calls if c[1] == 0]
    assert decode_only and all(name == "commit" for name, _ in decode_only)
    for o in outs:  # every position but the last has its entry waiting, in at most MAX_PIECES pieces
        n = len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1
        assert pending[o.request_id][:2] == (n, n)
        assert pending[o.request_id][2] < 4 and pending[o.request_id][3] == n


def test_drafts_do_not_depend_on_the_chunk_size(llama_dir, heads):
    drafts = []
    for chunked, budget in ((False, 128), (True, 8), (True, 24)):
        llm = eagle_llm(llama_dir, heads["draft vocab"], chunked, budget=budget)
        seen = record_first_proposals(llm)
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        index = {o.request_id: i for i, o in enumerate(outs)}
        drafts.append({(index[rid], pos): row[0] for (rid, pos), row in seen.items()})
    common = drafts[0].keys() & drafts[1].keys() & drafts[2].keys()
    assert len(common) >= 20
    assert all(drafts[0][key] == drafts[1][key] == drafts[2][key] for key in common)


def test_sampling_runs_lossless_rows(llama_dir, heads):
    """Sampling rows get full draft distributions (checked by proposal_checks:
    finite, summing to 1) and the run completes without proposer faults."""
    llm = eagle_llm(llama_dir, heads["draft vocab"], chunked=True)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=5, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert llm.get_metrics()["proposer_errors"] == 0


def test_a_head_for_another_target_is_refused(llama_dir, tmp_path):
    cfg_dir = save_random_eagle(llama_dir, tmp_path / "eagle", None)
    text = (cfg_dir / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 65')
    (cfg_dir / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="the head has hidden_size 65 but the target has 64; train a head on "
                                          r"this target \(scripts/train_eagle.py\)"):
        eagle_llm(llama_dir, cfg_dir, chunked=True)


@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
def test_unsure_head_proposes_one_token_and_stays_exact(llama_dir, heads, reference, scorer):
    """``confidence_threshold``: a random head never gives a token probability
    0.99, so every request's run stops after its first proposal; the output
    stays exact and the head's rolled-back entries leave its cache in sync."""
    llm = eagle_llm(llama_dir, heads["draft vocab"], chunked=True, scorer=scorer, proposer_options={
        "path": str(heads["draft vocab"]), "confidence_threshold": 0.99})
    seen = record_first_proposals(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    assert len(seen) >= 20 and all(len(row) == 1 for row in seen.values())
    assert llm.get_metrics()["num_draft_tokens"] == len(seen)


def test_confident_runs_match_drafting_k(llama_dir, heads):
    """A threshold the head always clears drafts the same k tokens as no threshold."""
    runs = []
    for threshold in (0.0, 1e-9):
        llm = eagle_llm(llama_dir, heads["full vocab"], chunked=True, proposer_options={
            "path": str(heads["full vocab"]), "confidence_threshold": threshold})
        seen = record_first_proposals(llm)
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        runs.append(sorted(seen.values()))
    assert runs[0] == runs[1] and any(len(row) == 3 for row in runs[0])


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_confidence_threshold_out_of_range_is_refused(llama_dir, heads, value):
    with pytest.raises(ConfigError, match="confidence_threshold"):
        eagle_llm(llama_dir, heads["draft vocab"], chunked=True, proposer_options={
            "path": str(heads["draft vocab"]), "confidence_threshold": value})


def test_packed_head_drafts_what_the_default_linears_draft(llama_dir, heads, reference):
    """``linear_backend``: 'onednn' packs the head's layers and its draft-vocabulary
    output layer; proposals and output match the unpacked ('default') head."""
    from speculant.model.linear.onednn import OneDNNLinear

    runs = {}
    for backend in ("default", "onednn"):
        llm = eagle_llm(llama_dir, heads["draft vocab"], chunked=True, proposer_options={
            "path": str(heads["draft vocab"]), "linear_backend": backend})
        proposer = llm.engine.spec.proposer
        packed = [m for m in (proposer.head.fc, proposer.head.down_proj, proposer._draft_out)
                  if isinstance(m, OneDNNLinear)]
        assert len(packed) == (3 if backend == "onednn" else 0)
        seen = record_first_proposals(llm)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
        runs[backend] = sorted(seen.values())
    assert runs["default"] == runs["onednn"]


def test_onednn_on_a_float16_head_is_refused_with_the_option_named(llama_dir, heads):
    with pytest.raises(ConfigError, match=r"speculative.proposer_options.linear_backend = 'onednn': the head "
                                          r"runs in model.dtype = 'float16', and oneDNN packing supports float32 "
                                          r"and bfloat16; choose 'auto'"):
        LLM(model=str(llama_dir), dtype="float16", speculative={
            "proposer": "eagle", "num_speculative_tokens": 2,
            "proposer_options": {"path": str(heads["draft vocab"]), "linear_backend": "onednn"}})
