"""Speculant's C kernels (``csrc/``, one source file per kernel family), their one
build module (``build``) and their ctypes interface (``abi``)."""
