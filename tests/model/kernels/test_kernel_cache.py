"""The compiled-kernel cache loads only libraries it built itself: a planted
library under the predictable name, a library whose SHA-256 does not match
the recorded one, or a cache directory others can write never gets loaded."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from speculant.interfaces.span_tensors import PagedSpan, SpanTensors
from speculant.model.attention.cpu_kernel import CpuKernelAttentionBackend, CpuKernelMetadata
from speculant.model.kernels import build

CC = os.environ.get("CC") or "cc"
pytestmark = pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")

PLANTED = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("planted library ran", f); fclose(f); }
}
int speculant_paged_attention(void) { return 0; }
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory; ``load_kernel`` forgets its cached result before and after."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECULANT_CACHE_DIR", str(root))
    monkeypatch.delenv("SPECULANT_CPU_KERNEL", raising=False)
    build.load_kernel.cache_clear()
    yield root
    build.load_kernel.cache_clear()


def plant(path: Path, marker: Path) -> None:
    """A shared library that writes ``marker`` when it is loaded."""
    src = path.with_suffix(".c")
    src.write_text(PLANTED % marker)
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(path)], check=True, capture_output=True)
    src.unlink()


def kernel_works(lib) -> bool:
    """One decode through the backend with this library agrees with the torch reference."""
    backend = CpuKernelAttentionBackend()
    backend._lib = lib
    spans = [PagedSpan([0], 3, [7], [0])]
    meta = backend.build_metadata(SpanTensors.build(spans, 4, torch.device("cpu")))
    assert isinstance(meta, CpuKernelMetadata) and meta.pieces.ids.tolist() == [0]  # the C path, not torch's
    gen = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(1, 4, 1, 8, generator=gen), torch.randn(1, 4, 1, 8, generator=gen)
    q, k, v = (torch.randn(1, n, 8, generator=gen) for n in (2, 1, 1))
    out = backend.forward(q, k, v, kc, vc, meta, 0.5)
    keys, values = torch.cat([kc[0, :3, 0], k[:, 0]]), torch.cat([vc[0, :3, 0], v[:, 0]])
    ref = torch.softmax(q[0] @ keys.T * 0.5, dim=-1) @ values
    return torch.allclose(out[0], ref, atol=1e-5)


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECULANT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "speculant"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert build.cache_root() == Path.home() / ".cache" / "speculant"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert build.cache_root() == Path.home() / ".cache" / "speculant"
    monkeypatch.setenv("SPECULANT_CACHE_DIR", str(tmp_path / "mine"))
    assert build.cache_root() == tmp_path / "mine"


def test_build_records_a_digest_and_reuses_it(cache):
    lib = build.load_kernel()
    assert lib is not None, build.kernel_status()
    path = cache / "kernels" / build.library_name(CC)
    sidecar = path.with_name(path.name + build.DIGEST_SUFFIX)
    assert sidecar.read_text().strip() == build.file_digest(path)
    assert build.kernel_status() == f"built with {CC} at {path}"
    assert oct((cache / "kernels").stat().st_mode & 0o777) == "0o700"
    build.load_kernel.cache_clear()
    assert build.load_kernel() is not None
    assert build.kernel_status() == f"loaded from the cache at {path}"
    assert kernel_works(build.load_kernel())


def test_planted_library_is_never_loaded(cache, tmp_path):
    folder = cache / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    path = folder / build.library_name(CC)
    marker = tmp_path / "planted-ran"
    plant(path, marker)
    lib = build.load_kernel()
    assert not marker.exists(), "the planted library was loaded"
    assert lib is not None and kernel_works(lib)
    assert build.kernel_status().startswith(f"built with {CC} at {path} (rebuilt: ")
    assert "missing" in build.kernel_status()  # no recorded digest for the planted file


def test_digest_mismatch_rebuilds(cache, tmp_path):
    assert build.load_kernel() is not None
    path = cache / "kernels" / build.library_name(CC)
    marker = tmp_path / "swapped-ran"
    plant(path, marker)  # same name, old sidecar: the digest no longer matches
    build.load_kernel.cache_clear()
    lib = build.load_kernel()
    assert not marker.exists(), "the swapped library was loaded"
    assert "does not match the one recorded at build time" in build.kernel_status()
    assert lib is not None and kernel_works(lib)
    sidecar = path.with_name(path.name + build.DIGEST_SUFFIX)
    assert sidecar.read_text().strip() == build.file_digest(path)


def test_tampered_sidecar_rebuilds(cache):
    assert build.load_kernel() is not None
    path = cache / "kernels" / build.library_name(CC)
    path.with_name(path.name + build.DIGEST_SUFFIX).write_text("0" * 64 + "\n")
    build.load_kernel.cache_clear()
    assert build.load_kernel() is not None
    assert "does not match" in build.kernel_status()


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_group_or_other_writable_cache_builds_privately(cache, tmp_path, mode):
    folder = cache / "kernels"
    folder.mkdir(parents=True)
    os.chmod(folder, mode)
    marker = tmp_path / "planted-ran"
    plant(folder / build.library_name(CC), marker)
    lib = build.load_kernel()
    status = build.kernel_status()
    assert not marker.exists()
    assert lib is not None and kernel_works(lib)
    assert status.startswith(f"built with {CC} in a private temporary directory (not cached: ")
    assert f"{folder} is writable by group or others (mode {mode:o})" in status and "chmod go-w" in status
    assert not list(folder.glob("*.sha256")), "nothing is cached in an untrusted folder"


def test_cache_root_owned_by_someone_else_builds_privately(cache):
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, -1)
    lib = build.load_kernel()
    assert lib is not None
    assert f"{cache} is owned by uid 65534, not by this user" in build.kernel_status()


def test_symlinked_kernels_folder_is_not_trusted(cache, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    cache.mkdir(mode=0o700)
    (cache / "kernels").symlink_to(elsewhere)
    assert build.load_kernel() is not None
    assert f"{cache / 'kernels'} is not a real directory" in build.kernel_status()


def test_disabled_by_environment(cache, monkeypatch):
    monkeypatch.setenv("SPECULANT_CPU_KERNEL", "0")
    assert build.load_kernel() is None
    assert build.kernel_status() == "disabled by SPECULANT_CPU_KERNEL=0"
    assert not cache.exists(), "a disabled kernel creates no cache"
