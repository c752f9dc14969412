"""fused_layers.py / csrc/decoder_bf16.c: every bfloat16 decoder layer in one C call gives the
per-operator loop's bits (logits and K/V cache) over hypothesis-drawn batches, with bfloat16
weights and with weights kept in GGUF blocks (a tiny llama file in five block formats), and
declines what it does not cover with its reason."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_marks import needs_bf16_paths

from speculant import LLM, SamplingParams
from speculant.cli import main
from speculant.interfaces.span_tensors import PagedSpan
from speculant.model.attention.cpu_kernel import MAX_KERNEL_QUERY
from speculant.model.fast_forward.fused_layers import FusedLayers

pytestmark = [pytest.mark.usefixtures("one_thread"), needs_bf16_paths]  # the fused layers need them

ARCHS = {  # arch: config overrides (the zoo's tiny sizes otherwise: 4 heads, 2 K/V heads, head_dim 16)
    "llama": {},
    "qwen2": {},  # q/k/v biases
    "mistral": {},
    "llama-gguf": {},  # a tiny GGUF file kept in its blocks (model.quantization = "gguf")
}
GGUF_TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q8_0", "ffn_gate": "Q4_1",
              "ffn_up": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q6_K", "output": "Q4_K"}


@pytest.fixture(scope="module")
def engines(zoo, tmp_path_factory, tokenizer_dir):
    """One bfloat16 LLM per architecture, block size 4, fast decoder on."""
    from tiny_gguf import write_tiny_gguf

    built = {}
    for arch in ARCHS:
        path = (write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf", tokenizer_dir, hidden=256,
                                types=GGUF_TYPES) if arch == "llama-gguf" else zoo(arch))
        llm = LLM(str(path), dtype="bfloat16", fast_forward="on", block_size=4,
                  max_num_batched_tokens=64, max_num_seqs=8, max_model_len=96)
        built[arch] = llm
    return built


class Spy:
    """Counts FusedLayers.run calls on one decoder."""

    def __init__(self, fused: FusedLayers) -> None:
        self.fused, self.calls = fused, 0
        self._run = fused.run

    def __enter__(self) -> Spy:
        def run(*args, **kwargs):
            self.calls += 1
            return self._run(*args, **kwargs)
        self.fused.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        del self.fused.run


def forward_both(llm, stages: list[list[PagedSpan]]) -> tuple[list[torch.Tensor], ...]:
    """Run the stages (each a forward over spans) per operator and fused from the same cache state;
    returns (logits per-op, logits fused, caches per-op, caches fused, fused calls)."""
    runner = llm.engine.runner
    decoder = runner.fast_forward.decoder
    fused = decoder.fused
    assert fused is not None, decoder.fused_reason
    start = [c.clone() for c in (*runner.key_caches, *runner.value_caches)]
    results = []
    calls = 0
    for use in (None, fused):
        for cache, saved in zip((*runner.key_caches, *runner.value_caches), start):
            cache.copy_(saved)
        decoder.fused = use
        try:
            with Spy(fused) as spy:
                logits = [runner._eager_forward(spans, False, decoder).logits for spans in stages]
        finally:
            decoder.fused = fused
        calls += spy.calls
        results.append((logits, [c.clone() for c in (*runner.key_caches, *runner.value_caches)]))
    (per_op, per_op_caches), (fast, fast_caches) = results
    return per_op, fast, per_op_caches, fast_caches, calls


def allocate(llm, names_lengths):
    manager = llm.engine.blocks
    return [manager.allocate(name, n) for name, n in names_lengths]


def free(llm, names):
    manager = llm.engine.blocks
    for name in names:
        if manager.has(name):
            manager.free(name)


# (cached prefix, run): runs past MAX_KERNEL_QUERY are prefill chunks the kernel takes in pieces
batches = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 3 * MAX_KERNEL_QUERY)), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arch=st.sampled_from(sorted(ARCHS)), batch=batches, seed=st.integers(0, 2**16))
def test_fused_layers_give_the_per_operator_bits(engines, arch, batch, seed):
    """Each sequence: a cached prefix (written by a first forward of prefill chunks) then a decode,
    verify run or prefill chunk of 1..48 tokens; every forward runs fused."""
    llm = engines[arch]
    gen = torch.Generator().manual_seed(seed)
    vocab = llm.engine.runner.vocab_size
    names = [f"fused-{i}" for i in range(len(batch))]
    try:
        tables = allocate(llm, [(n, p + q) for n, (p, q) in zip(names, batch)])
        tokens = [torch.randint(0, vocab, (p + q,), generator=gen).tolist() for p, q in batch]
        prefill = [PagedSpan(t, 0, s[:p], list(range(p))) for t, s, (p, _) in zip(tables, tokens, batch) if p]
        runs = [PagedSpan(t, p, s[p:], list(range(q))) for t, s, (p, q) in zip(tables, tokens, batch)]
        stages = [prefill, runs] if prefill else [runs]
        per_op, fast, per_op_caches, fast_caches, calls = forward_both(llm, stages)
    finally:
        free(llm, names)
    assert calls == len(stages), "a forward did not run fused"
    for a, b in zip(per_op, fast):
        assert torch.equal(a, b)
    for a, b in zip(per_op_caches, fast_caches):
        assert torch.equal(a, b)


def test_spans_sharing_a_block_table_see_their_siblings_keys(engines):
    """Batch expansion: spans of one sequence at the same positions (prefixes of one run)."""
    llm = engines["llama"]
    tokens = list(range(5, 30))
    try:
        table, = allocate(llm, [("shared", len(tokens))])
        stages = [[PagedSpan(table, 0, tokens[:20], list(range(20)))],
                  [PagedSpan(table, 20, tokens[20:20 + n], list(range(n))) for n in (1, 3, 5)]]
        per_op, fast, per_op_caches, fast_caches, calls = forward_both(llm, stages)
    finally:
        free(llm, ["shared"])
    assert calls == 2  # the 20-token prefill too, in two kernel pieces
    assert all(torch.equal(a, b) for a, b in zip(per_op, fast))
    assert all(torch.equal(a, b) for a, b in zip(per_op_caches, fast_caches))


@pytest.mark.parametrize("arch", ["qwen2", "llama-gguf"])
def test_generation_runs_fused_and_equals_the_per_operator_loop(engines, arch):
    llm = engines[arch]
    decoder = llm.engine.runner.fast_forward.decoder
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["def f(x):", "hello there", "1 2 3 4"]
    with Spy(decoder.fused) as spy:
        fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert spy.calls >= 11
    kept, decoder.fused = decoder.fused, None
    try:
        per_op = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        decoder.fused = kept
    assert fused == per_op


@pytest.mark.parametrize("settings_, reason", [
    (dict(dtype="float32"), "only bfloat16 models on the CPU"),
    (dict(dtype="bfloat16", linear_backend="onednn"), "projection(s) are neither on the C bfloat16 linear kernel"),
])
def test_what_it_cannot_run_is_declined_with_its_reason(zoo, settings_, reason):
    if settings_.get("linear_backend") == "onednn" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bfloat16 path here (SPECULANT_CPU_ISA=avx2 caps it, or the CPU lacks it)")
    llm = LLM(str(zoo("llama")), fast_forward="on", block_size=4, **settings_)
    decoder = llm.engine.runner.fast_forward.decoder
    assert decoder.fused is None and reason in decoder.fused_reason
    assert f"layer by layer: not fused, {decoder.fused_reason}" in llm.engine.runner.fast_forward.describe()


def test_an_intermediate_size_off_the_silu_table_s_width_is_declined(tmp_path, tokenizer_dir):
    from arch_zoo import build_arch_model

    path = build_arch_model("llama", tmp_path / "m", tokenizer_dir, overrides=dict(intermediate_size=96))
    llm = LLM(str(path), dtype="bfloat16", fast_forward="on", block_size=4)
    decoder = llm.engine.runner.fast_forward.decoder
    assert decoder.fused is None
    assert decoder.fused_reason == "intermediate_size 96 is not a multiple of 64 (the silu table's)"


def test_generate_verbose_names_the_fused_layers(zoo, capsys):
    assert main(["generate", "--model", str(zoo("llama")), "--set", "model.dtype=bfloat16", "--verbose",
                 "--max-tokens", "2", "hello"]) == 0
    assert "deviation 0; all layers in one C call)" in capsys.readouterr().out
