"""The architecture matrix: every verified decoder architecture × every
attention backend that runs on this machine × {chunking off, tiny chunk
budget, ngram + mqa, draft + batch expansion, eagle (a random head) + mqa with
chunked prefill, suffix + batch expansion with the adaptive draft length, eagle_suffix + batch
expansion with chunked prefill} × the forward path (``model.fast_forward``: architectures
with a fast decoder run it "on" and "off", the others "auto", which must keep
transformers' modules), token for token against
transformers ``generate()`` (near-ties judged on transformers' own logits,
``greedy_compare``); and every refusal case refused at load with its feature
named.

Each cell runs one mixed batch of seven prompts: 1 token, below, at and above
the block size, one chunked several times over, and one that repeats a
pattern (so the n-gram proposer has something to propose). The default run
takes a representative slice (each architecture in one setting, the settings
rotating, on the default backend); ``-m slow`` runs the whole cross product.
CI runs both.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from arch_zoo import EITHER, REFUSED, VERIFIED, build_arch_model, matrix_prompts
from fast_paths import expect_fast_forward
from greedy_compare import check_all_greedy
from speculant import LLM, SamplingParams
from speculant.model.fast_forward.plan import ARCH_SPECS
from speculant.model.loading.hf_model import UnsupportedModelError
from speculant.plugins.manager import get_registry
from tiny_eagle import save_random_eagle

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_TOKENS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)

SETTINGS = {
    "chunking-off": dict(block_size=16, max_num_batched_tokens=128, max_num_seqs=8, enable_chunked_prefill=False),
    "tiny-chunks": dict(block_size=4, max_num_batched_tokens=7, max_num_seqs=7),
    "ngram-mqa": dict(block_size=4, max_num_batched_tokens=24, max_num_seqs=7,
                      speculative=dict(proposer="ngram", scorer="mqa", num_speculative_tokens=3)),
    "draft-batch-expansion": dict(block_size=16, max_num_batched_tokens=40, max_num_seqs=7,
                                  speculative=dict(proposer="draft_model", scorer="batch_expansion",
                                                   num_speculative_tokens=3)),
    "eagle-chunked": dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=7,
                          speculative=dict(proposer="eagle", scorer="mqa", num_speculative_tokens=3)),
    "suffix-adaptive": dict(block_size=8, max_num_batched_tokens=20, max_num_seqs=7,
                            speculative=dict(proposer="suffix", scorer="batch_expansion", num_speculative_tokens=4,
                                             draft_length={"policy": "adaptive", "token_cost": 0.3})),
    "eagle-suffix-chunked": dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=7,
                                 speculative=dict(proposer="eagle_suffix", scorer="batch_expansion",
                                                  num_speculative_tokens=3)),
}
SPECULATES = {"ngram-mqa", "draft-batch-expansion", "eagle-chunked", "suffix-adaptive", "eagle-suffix-chunked"}


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""The device the engines take from the environment (model.device = 'auto'): on a
GPU machine the matrix walks the CUDA backends, on the CPU the CPU ones."""
DEFAULT_BACKEND = {"cpu": "cpu_kernel", "cuda": "triton"}[DEVICE]


def device_backends() -> list[str]:
    """The registered attention backends that run on ``DEVICE`` here (dtype float32)."""
    registry = get_registry()
    out = []
    for n in registry.names("attention_backend"):
        caps = registry.get("attention_backend", n).capabilities
        if DEVICE in caps.devices and not getattr(caps, "unavailable", None):
            out.append(n)
    return sorted(out)


FAST_DEFAULT_EXTRA = {("llama", "eagle-chunked"), ("qwen2", "ngram-mqa"), ("mistral", "suffix-adaptive")}
"""Cells with the fast decoder on in the default selection beyond the rotation: EAGLE reading
its hidden states, verify runs of n-gram and suffix proposals."""


def fast_forward_values(arch: str) -> list[str]:
    """The forward paths a cell runs: the fast decoder first (the default selection's), or "auto"."""
    return ["on", "off"] if arch in ARCH_SPECS else ["auto"]


def _cells():
    archs, settings, backends = list(VERIFIED), list(SETTINGS), device_backends()
    for i, arch in enumerate(archs):
        for backend in backends:
            for j, setting in enumerate(settings):
                for f, fast in enumerate(fast_forward_values(arch)):
                    chosen = j == i % len(settings) or (arch, setting) in FAST_DEFAULT_EXTRA
                    default = backend == DEFAULT_BACKEND and chosen and f == 0
                    marks = () if default else (pytest.mark.slow,)
                    yield pytest.param(arch, backend, setting, fast, marks=marks,
                                       id=f"{arch}-{backend}-{setting}-fast_{fast}")


@pytest.mark.parametrize("arch,backend,setting,fast", list(_cells()))
def test_architecture_matches_transformers(arch, backend, setting, fast, zoo, hf_reference, tmp_path):
    overrides = dict(SETTINGS[setting])
    if "speculative" in overrides:
        spec = dict(overrides["speculative"])
        if spec["proposer"] == "draft_model":
            spec["proposer_options"] = {"model": str(zoo(arch, draft=True))}
        if spec["proposer"] in ("eagle", "eagle_suffix"):
            head = {"path": str(save_random_eagle(zoo(arch), tmp_path / "eagle", 64))}
            # min_match_len 1: the suffix part drafts often enough on 20-token outputs
            spec["proposer_options"] = head if spec["proposer"] == "eagle" else {"eagle": head, "min_match_len": 1}
        overrides["speculative"] = spec
    model_dir = zoo(arch)
    llm = LLM(str(model_dir), attention_backend=backend, fast_forward=fast, **overrides)
    expect_fast_forward(llm)
    prompts = matrix_prompts()
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    ours = [o.outputs[0].token_ids for o in outs]
    refs = [hf_reference(model_dir).greedy(p, MAX_TOKENS) for p in prompts]
    distinct = sum(len(set(r.tokens)) for r in refs) / len(refs)
    assert distinct >= 5, f"{arch}: transformers' greedy text is degenerate ({distinct:.1f} distinct tokens " \
                          "per output), so this cell would prove little; widen the init"
    matches = check_all_greedy(ours, refs, f"{arch}/{backend}/{setting}")
    for i, m in enumerate(matches):
        if m.near_tie_at is not None:  # tolerated, but shown in the run's summary (-rw)
            warnings.warn(f"near-tie: {arch}/{backend}/{setting} prompt {i} at token {m.near_tie_at}, "
                          f"gap {m.gap:.2e}", UserWarning, stacklevel=1)
    if setting in SPECULATES:
        assert llm.get_metrics()["num_draft_tokens"] > 0, f"{arch}/{setting}: nothing was proposed"


@pytest.mark.parametrize("arch", list(EITHER))
def test_architecture_matches_transformers_or_is_refused_by_name(arch, tmp_path, tokenizer_dir, hf_reference):
    overrides, feature = EITHER[arch]
    model_dir = build_arch_model(arch, tmp_path / arch, tokenizer_dir, overrides=overrides)
    try:
        llm = LLM(str(model_dir), **SETTINGS["tiny-chunks"])
    except UnsupportedModelError as err:
        assert feature in str(err) and str(model_dir) in str(err), str(err)
        return
    prompts = matrix_prompts()
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    refs = [hf_reference(model_dir).greedy(p, MAX_TOKENS) for p in prompts]
    check_all_greedy([o.outputs[0].token_ids for o in outs], refs, f"{arch}/tiny-chunks")


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_feature_is_refused_by_name(case, tmp_path, tokenizer_dir):
    arch, overrides, feature = REFUSED[case]
    model_dir = build_arch_model(arch, tmp_path / case, tokenizer_dir, overrides=overrides)
    with pytest.raises(UnsupportedModelError) as err:
        LLM(str(model_dir), max_num_batched_tokens=64)
    message = str(err.value)
    assert feature in message and str(model_dir) in message, message


def test_refused_draft_model_names_the_draft_option(zoo, tmp_path, tokenizer_dir):
    """A draft with an unsupported feature is refused under the draft's own option."""
    arch, overrides, feature = REFUSED["gemma2-softcap"]
    draft = build_arch_model(arch, tmp_path / "draft", tokenizer_dir, overrides=overrides)
    with pytest.raises(UnsupportedModelError, match="soft-capping") as err:
        LLM(str(zoo("llama")), max_num_batched_tokens=64,
            speculative=dict(proposer="draft_model", proposer_options={"model": str(draft)}))
    assert "speculative.proposer_options.model = " in str(err.value)
