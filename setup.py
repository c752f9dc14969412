"""Binary wheels: ``python -m build`` (bdist_wheel) compiles the C kernels into the package
(``speculant/model/kernels/prebuilt/<machine>.so``: one library, every instruction path of the
architecture, chosen at run time), so a machine without a C compiler has every kernel. The wheel
is then tagged for this platform. Editable and source installs build nothing here: the kernels
compile at first use (``speculant/model/kernels/build.py``). Everything else is in pyproject.toml."""

from __future__ import annotations

import importlib.util
import os
import platform
from pathlib import Path

from setuptools import Distribution, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel

ROOT = Path(__file__).resolve().parent


def _compile_module():
    """``speculant/model/kernels/compile.py`` on its own (stdlib only: the package imports torch)."""
    spec = importlib.util.spec_from_file_location("speculant_kernels_compile",
                                                  ROOT / "speculant/model/kernels/compile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WheelWithKernels(bdist_wheel):
    def run(self) -> None:
        self.run_command("build")
        build_lib = Path(self.get_finalized_command("build_py").build_lib)
        folder = build_lib / "speculant/model/kernels/prebuilt"
        _compile_module().build_prebuilt(os.environ.get("CC") or "cc", folder, platform.machine())
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel: it carries a compiled library
        return True


setup(cmdclass={"bdist_wheel": WheelWithKernels}, distclass=BinaryDistribution)
