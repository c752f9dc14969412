"""Every cell of the built-in compatibility matrix, end to end: supported cells
generate greedy text identical to the engine without speculation; refused
cells raise the checker's reasons before any engine is built."""

from __future__ import annotations

import pytest

from speculant import LLM, SamplingParams
from speculant.config.matrix import builtin_registry, compute_matrix
from speculant.config.models import ConfigError
from speculant.plugins.manager import load_plugins, reset_plugins

PROMPTS = ["def foo(x):\n    return", "import os\nclass A:\n", "for i in range(10):\n    print(i)\n" * 3]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _cells():
    reset_plugins()
    cells = compute_matrix(builtin_registry(load_plugins().registry))
    reset_plugins()
    return [pytest.param(c, id=f"{c.proposer}-{c.scorer}-{c.acceptance}-chunked_"
                              f"{'on' if c.enable_chunked_prefill else 'off'}") for c in cells]


@pytest.fixture(scope="module")
def proposer_options(llama_dir, random_heads_dirs) -> dict[str, dict]:
    """Options that make each built-in proposer runnable on the tiny llama."""
    return {"ngram": {}, "suffix": {}, "draft_model": {"model": str(llama_dir)},
            "medusa": {"path": str(random_heads_dirs["medusa"])},
            "mlp_speculator": {"path": str(random_heads_dirs["mlp_speculator"])},
            "eagle": {"path": str(random_heads_dirs["eagle"])},
            "eagle_suffix": {"eagle": {"path": str(random_heads_dirs["eagle"])}, "min_match_len": 1},
            "draft_suffix": {"draft": {"model": str(llama_dir)}, "min_match_len": 1}}


@pytest.fixture(scope="module")
def reference(llama_dir) -> dict[bool, list[list[int]]]:
    out = {}
    for chunked in (False, True):
        llm = LLM(model=str(llama_dir), max_num_batched_tokens=32 if chunked else 128, max_num_seqs=4,
                  enable_chunked_prefill=chunked)
        out[chunked] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    return out


@pytest.mark.parametrize("cell", _cells())
def test_matrix_cell_end_to_end(cell, llama_dir, proposer_options, reference):
    assert cell.proposer in proposer_options, \
        f"no end-to-end options for proposer {cell.proposer!r}: add them to proposer_options"
    kwargs = dict(model=str(llama_dir), max_num_batched_tokens=32 if cell.enable_chunked_prefill else 128,
                  max_num_seqs=4, enable_chunked_prefill=cell.enable_chunked_prefill,
                  speculative=cell.speculative(proposer_options[cell.proposer]))
    if not cell.supported:
        with pytest.raises(ConfigError) as err:
            LLM(**kwargs)
        assert set(cell.reasons) <= set(err.value.problems)
        return
    llm = LLM(**kwargs)
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert tokens == reference[cell.enable_chunked_prefill]
    assert llm.get_metrics()["num_draft_tokens"] > 0 or cell.proposer == "ngram"
