from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import speculant  # noqa: F401  (before torch: SPECULANT_CPU_ISA caps torch's instruction set as it loads)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # tiny models: one thread is as fast and stable under load
# The adaptive draft-length policy (the default) prices steps with figures measured at load and
# from propose timings; tests fix them so that no output depends on timing (tests/engine/test_cost_model.py
# measures on purpose, with these unset). At cost 0 every proposal pays, so the default policy gives
# every decode its k, as a test that names no policy expects; tests of the policy set their own costs.
os.environ.setdefault("SPECULANT_TOKEN_COST", "0")
os.environ.setdefault("SPECULANT_DRAFT_TOKEN_COST", "0")

from tiny_models import build_model, build_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(d)
    return d


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct's tokenizer and chat template (tests/data/smollm2-tokenizer; the
    tokenizer.json is stored xz-compressed to keep the tree small)."""
    import lzma
    import shutil

    src = Path(__file__).resolve().parent / "data" / "smollm2-tokenizer"
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    (out / "tokenizer.json").write_bytes(lzma.decompress((src / "tokenizer.json.xz").read_bytes()))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, out / name)
    return out


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    """One tiny random model per architecture (llama, qwen2, mistral-GQA)."""
    out = {}
    for arch in ("llama", "qwen2", "mistral"):
        out[arch] = build_model(arch, tmp_path_factory.mktemp(arch), tokenizer_dir)
    return out


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]


# --- engine test-suite fixtures (appended) -----------------------------------

@pytest.fixture(scope="session")
def hf_reference(model_dirs):
    """``hf_reference(arch_or_dir)`` -> a cached ``greedy_compare.HFReference``."""
    from greedy_compare import HFReference

    cache: dict[str, HFReference] = {}

    def get(arch_or_dir) -> HFReference:
        path = str(model_dirs.get(arch_or_dir, arch_or_dir))
        if path not in cache:
            cache[path] = HFReference(path)
        return cache[path]

    return get


@pytest.fixture(scope="session")
def eos_case(tmp_path_factory, llama_dir, hf_reference):
    """A copy of the llama model whose EOS is a token that greedy decoding of
    ``prompt`` emits (for the first time) at output index ``eos_index`` >= 3,
    so EOS really stops generation there. Fields: model_dir, prompt,
    eos_token_id, eos_index, tokens (HF greedy tokens without stopping)."""
    from types import SimpleNamespace

    from tiny_models import copy_model, random_prompts, set_eos_token

    prompt = random_prompts([12], seed=7)[0]
    tokens = hf_reference("llama").greedy(prompt, 24).tokens
    index = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    model_dir = set_eos_token(copy_model(llama_dir, tmp_path_factory.mktemp("llama_eos")), tokens[index])
    return SimpleNamespace(model_dir=model_dir, prompt=prompt, eos_token_id=tokens[index], eos_index=index,
                           tokens=tokens)


# --- speculative-decoding fixtures (tests/spec, appended) --------------------

@pytest.fixture(scope="session")
def spec_noisy_draft_dir(tmp_path_factory, llama_dir) -> Path:
    """A draft that agrees with the llama target only partly: the target's own
    weights plus Gaussian noise of 3% of each tensor's std (greedy acceptance
    about 0.4 at k=3), same tokenizer and vocabulary."""
    import shutil

    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("llama_noisy_draft")
    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.03 * param.std())
    model.save_pretrained(out)
    for f in Path(llama_dir).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out)
    return out


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tiny-model tests on one torch thread: hidden-64 models gain
    nothing from a second thread, and on a shared 2-core machine thread
    contention made steps ~5x slower. Restores the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def random_heads_dirs(tmp_path_factory, llama_dir) -> dict[str, Path]:
    """Random Medusa and MLP-speculator heads (4 each) and a random EAGLE head
    (a draft vocabulary of 256 of the 384 ids) fitting the tiny llama (hidden
    64): they propose poorly, so only exactness is tested."""
    from speculant.proposers.heads.common import save_heads
    from speculant.proposers.heads.medusa import MedusaHeads, medusa_config
    from speculant.proposers.heads.mlp_speculator import MLPSpeculator, mlp_speculator_config
    from tiny_eagle import save_random_eagle

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("heads")
    medusa = medusa_config(64, 384, 4)
    save_heads(MedusaHeads.from_config(medusa), medusa, root / "medusa")
    mlp = mlp_speculator_config(64, 384, 4, 32)
    save_heads(MLPSpeculator.from_config(mlp), mlp, root / "mlp_speculator")
    save_random_eagle(llama_dir, root / "eagle", draft_vocab_size=256)
    return {"medusa": root / "medusa", "mlp_speculator": root / "mlp_speculator", "eagle": root / "eagle"}


# --- slow variants (the architecture matrix's full cross product, more hypothesis examples) ---

def pytest_collection_modifyitems(config, items):
    """``slow``-marked tests run only when selected (``-m slow``) or with
    SPECULANT_SLOW=1; CI (.ci/run) runs the default selection and then ``-m slow``.
    Otherwise they are deselected (not skipped), so that ``-rs`` lists only real skips."""
    import os

    expr = config.getoption("markexpr") or ""
    if os.environ.get("SPECULANT_SLOW") or ("slow" in expr and "not slow" not in expr):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]


# --- the C kernels: skip where absent, fail under SPECULANT_REQUIRE_KERNELS=1 (tests/kernel_marks.py) ---

def pytest_configure(config):
    config.addinivalue_line("markers", "needs_kernel: needs the C kernel library (tests/kernel_marks.py)")
    config.addinivalue_line("markers", "needs_bf16_paths: needs the AVX-512 bfloat16 kernel paths")


def pytest_sessionstart(session):
    from kernel_marks import REQUIRE, kernel_problem

    if REQUIRE and (problem := kernel_problem()) is not None:
        pytest.exit(f"SPECULANT_REQUIRE_KERNELS=1 but the C kernels did not build: {problem}", returncode=1)


def pytest_runtest_setup(item):
    from kernel_marks import check_marks

    check_marks(item)


# --- the architecture zoo (tests/arch_zoo.py) ---

@pytest.fixture(scope="session")
def zoo(tmp_path_factory, tokenizer_dir):
    """``zoo(arch)`` -> the arch's tiny model dir; ``zoo(arch, draft=True)`` ->
    a noisy copy of it (a draft that agrees only partly). Built on first use."""
    from arch_zoo import build_arch_model, noisy_copy

    root = tmp_path_factory.mktemp("zoo")
    built: dict[tuple[str, bool], Path] = {}

    def get(arch: str, draft: bool = False) -> Path:
        if (arch, draft) not in built:
            target = built.get((arch, False)) or build_arch_model(arch, root / arch, tokenizer_dir)
            built[(arch, False)] = target
            if draft:
                built[(arch, True)] = noisy_copy(target, root / f"{arch}-draft")
        return built[(arch, draft)]

    return get
