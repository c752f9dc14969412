"""The suffix hybrids (``eagle_suffix``, ``draft_suffix``): proposals merge
decode by decode with one-hot rows for the suffix's tokens; greedy output
equals no speculation under both scorers with chunked prefill on and off, with
both parts drafting in the same runs; option errors name the nested key."""

from __future__ import annotations

import pytest
import torch

from speculant import LLM, SamplingParams
from speculant.config.models import ConfigError
from speculant.interfaces import Proposals
from speculant.proposers.hybrid import merge
from tiny_models import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

# min_match_len 1 (below): the tiny random llama repeats single tokens often enough for the suffix part
PROMPTS = random_prompts([5, 40, 13, 1], seed=3) + [random_prompts([6], seed=4)[0] * 5]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_merge_takes_each_decode_from_its_part_with_one_hot_suffix_rows():
    probs = torch.softmax(torch.randn(5, 7), -1)
    model = Proposals(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2, 2, 5]), probs)  # rows: [1 2] [] [3 4 5]
    out = merge([False, True, True], [[9], [6, 0], [4]], model)
    assert out.to_lists() == [[1, 2], [6, 0], [4]]
    assert torch.equal(out.probs[:2], probs[:2])
    assert torch.equal(out.probs[2:], torch.nn.functional.one_hot(torch.tensor([6, 0, 4]), 7).float())
    greedy = merge([True, False, False], [[3, 3], [], []], Proposals(model.token_ids, model.cu_num_draft_tokens))
    assert greedy.to_lists() == [[3, 3], [], [3, 4, 5]] and greedy.probs is None  # argmax-verified: no probs


@pytest.fixture(scope="module")
def reference(llama_dir):
    llm = LLM(model=str(llama_dir), max_num_batched_tokens=128, enable_chunked_prefill=False)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def options(kind: str, llama_dir, random_heads_dirs) -> dict:
    part = {"eagle": {"path": str(random_heads_dirs["eagle"])}} if kind == "eagle_suffix" else \
        {"draft": {"model": str(llama_dir)}}
    return {**part, "min_match_len": 1}


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-prompts", "chunked"])
@pytest.mark.parametrize("scorer", ["mqa", "batch_expansion"])
@pytest.mark.parametrize("kind", ["eagle_suffix", "draft_suffix"])
def test_greedy_equals_no_speculation_with_both_parts_drafting(kind, scorer, chunked, llama_dir, random_heads_dirs,
                                                              reference):
    llm = LLM(model=str(llama_dir), max_num_batched_tokens=16 if chunked else 256, max_num_seqs=4,
              enable_chunked_prefill=chunked, block_size=4,
              speculative={"proposer": kind, "scorer": scorer, "num_speculative_tokens": 3,
                           "proposer_options": options(kind, llama_dir, random_heads_dirs)})
    out = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert out == reference
    hybrid = llm.engine.spec.proposer
    assert hybrid.num_suffix_drafts > 0 and hybrid.num_model_drafts > 0, (
        hybrid.num_suffix_drafts, hybrid.num_model_drafts)
    assert llm.get_metrics()["num_accepted_tokens"] > 0


def test_option_errors_name_the_nested_key(llama_dir, tmp_path):
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "eagle_suffix",
                                               "proposer_options": {"eagle": {"path": str(tmp_path)}}})
    assert any(p.startswith(f"speculative.proposer_options.eagle.path = {str(tmp_path)!r}: no config.json")
               for p in err.value.problems), err.value.problems
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "draft_suffix",
                                               "proposer_options": {"draft": {"model": str(tmp_path)}}})
    assert any(p.startswith("speculative.proposer_options.draft.model") for p in err.value.problems), \
        err.value.problems
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "eagle_suffix", "proposer_options": {}})
    assert any("eagle" in p and "missing" in p for p in err.value.problems), err.value.problems
    with pytest.raises(ConfigError) as err:
        LLM(model=str(llama_dir), speculative={"proposer": "eagle_suffix", "proposer_options": {
            "eagle": {"path": "x"}, "min_match_len": 0}})
    assert any("min_match_len" in p for p in err.value.problems), err.value.problems
