"""``model.dtype = "auto"``: the decision and its reason on each architecture, with the CPU's
architecture and features faked (config/dtype_choice.py reads them without torch)."""

from __future__ import annotations

import json

import pytest

from speculant.config import dtype_choice
from speculant.config.cpu_isa import ENV as ISA_ENV

# /proc/cpuinfo as an aarch64 Linux (Neoverse N1) writes it, and an AVX2-only x86 one
ARM_CPUINFO = ("processor\t: 0\nBogoMIPS\t: 243.75\n"
               "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
               "dcpop asimddp ssbs\nCPU implementer\t: 0x41\n")
X86_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2\n"


@pytest.fixture
def bf16_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    return str(tmp_path)


def fake_cpu(monkeypatch, machine: str, flags: set[str]) -> None:
    monkeypatch.setattr(dtype_choice.platform, "machine", lambda: machine)
    monkeypatch.setattr(dtype_choice, "cpu_flags", lambda: flags)
    monkeypatch.delenv(ISA_ENV, raising=False)


@pytest.mark.parametrize(("text", "wanted"), [(ARM_CPUINFO, {"asimd", "asimddp", "fp"}),
                                              (X86_CPUINFO, {"avx2", "fma", "f16c"})])
def test_cpu_flags_reads_the_features_line_of_each_architecture(tmp_path, text, wanted):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    flags = dtype_choice.cpu_flags(str(path))
    assert wanted <= flags and "BogoMIPS" not in flags and "0x41" not in flags


def test_aarch64_with_neon_picks_bfloat16_and_says_why(monkeypatch, bf16_checkpoint, tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(ARM_CPUINFO)
    fake_cpu(monkeypatch, "aarch64", dtype_choice.cpu_flags(str(path)))
    assert dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu") == (
        "bfloat16", "bfloat16: a bfloat16 checkpoint on a CPU with a vector bfloat16 path (NEON)")
    assert dtype_choice.choose_dtype(bf16_checkpoint, "model.gguf", "cpu")[0] == "bfloat16"


def test_aarch64_without_neon_stays_float32(monkeypatch, bf16_checkpoint):
    fake_cpu(monkeypatch, "aarch64", {"fp", "evtstrm"})
    assert dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu") == (
        "float32", "float32: this CPU has no NEON (asimd), which the bfloat16 kernels need")


@pytest.mark.parametrize("cap", ["scalar", "SCALAR"])
def test_aarch64_capped_to_scalar_stays_float32(monkeypatch, bf16_checkpoint, cap):
    fake_cpu(monkeypatch, "aarch64", {"fp", "asimd", "asimddp"})
    monkeypatch.setenv(ISA_ENV, cap)
    assert dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu") == (
        "float32", "float32: SPECULANT_CPU_ISA=scalar turns the vector paths off")


def test_aarch64_neon_cap_keeps_bfloat16(monkeypatch, bf16_checkpoint):
    fake_cpu(monkeypatch, "aarch64", {"fp", "asimd", "asimddp"})
    monkeypatch.setenv(ISA_ENV, "neon")
    assert dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu")[0] == "bfloat16"


@pytest.mark.parametrize("stored", ["float32", "float16"])
def test_aarch64_float_checkpoint_stays_float32(monkeypatch, tmp_path, stored):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": stored}))
    fake_cpu(monkeypatch, "aarch64", {"fp", "asimd"})
    assert dtype_choice.choose_dtype(str(tmp_path), None, "cpu") == (
        "float32", f"float32: the checkpoint does not allow bfloat16 (it is stored in {stored})")


@pytest.mark.parametrize(("flags", "dtype"), [({"avx2", "fma"}, "bfloat16"), ({"avx2"}, "float32"),
                                              ({"avx512f", "avx512bw", "avx512dq", "avx512vl"}, "bfloat16")])
def test_x86_needs_avx2_with_fma_or_avx512(monkeypatch, bf16_checkpoint, flags, dtype):
    fake_cpu(monkeypatch, "x86_64", flags)
    got, why = dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu")
    assert got == dtype
    assert why == ("bfloat16: a bfloat16 checkpoint on a CPU with a vector bfloat16 path (AVX2+FMA or AVX-512)"
                   if dtype == "bfloat16" else
                   "float32: this CPU has neither AVX2 with FMA nor AVX-512, which the bfloat16 kernels need")


def test_other_architectures_stay_float32(monkeypatch, bf16_checkpoint):
    fake_cpu(monkeypatch, "riscv64", {"rv64imafdc"})
    assert dtype_choice.choose_dtype(bf16_checkpoint, None, "cpu") == (
        "float32", "float32: the C kernels have no vector bfloat16 path for riscv64")
