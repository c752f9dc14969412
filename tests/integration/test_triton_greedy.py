"""A slice of the architecture matrix on the ``triton`` attention backend,
its kernels run on the CPU by Triton's interpreter: greedy generation with
``attention_backend = "triton"`` equals transformers' greedy output, token for
token (near-ties judged on transformers' logits, ``greedy_compare``).

Two tiny architectures, each in a setting that sends every span kind through
the kernel: llama (GQA, 2 query heads per K/V head) with n-gram proposals
scored as multi-token verify runs next to prefill chunks, and mistral (MQA)
with tiny chunks of a block size of 3. Fewer and shorter prompts than the
matrix: the interpreter pays tens of milliseconds per kernel program.
"""

from __future__ import annotations

import pytest

from arch_zoo import matrix_prompts
from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams
from speculant.model.attention.triton_backend import TritonAttentionBackend
from triton_interpreter import interpreted_kernels, use_interpreted_kernels

interpreted_kernels()  # skips this module without triton
pytestmark = pytest.mark.usefixtures("one_thread")

MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
CELLS = {
    "llama-ngram-verify": ("llama", dict(block_size=4, max_num_batched_tokens=24, max_num_seqs=5, speculative=dict(
        proposer="ngram", scorer="mqa", num_speculative_tokens=3))),
    "mistral-mqa-tiny-chunks": ("mistral", dict(block_size=3, max_num_batched_tokens=7, max_num_seqs=5)),
}


@pytest.mark.parametrize("cell", list(CELLS))
def test_greedy_matches_transformers_on_the_triton_backend(cell, zoo, hf_reference):
    arch, settings = CELLS[cell]
    prompts = [matrix_prompts()[i] for i in (0, 2, 3, 5, 6)]  # 1, 4, 5, 17 tokens and the repeated pattern
    with use_interpreted_kernels(cpu_device=True):
        llm = LLM(str(zoo(arch)), attention_backend="triton", **settings)
        assert isinstance(llm.engine.runner.backend, TritonAttentionBackend)
        outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    refs = [hf_reference(zoo(arch)).greedy(p, MAX_TOKENS) for p in prompts]
    check_all_greedy([o.outputs[0].token_ids for o in outs], refs, f"{cell} on triton")
    if "speculative" in settings:
        assert llm.get_metrics()["num_draft_tokens"] > 0, f"{cell}: nothing was proposed"
