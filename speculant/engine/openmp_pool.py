"""Give back the calling thread's OpenMP worker pool before another thread steps the engine.

An OpenMP runtime keeps one team of worker threads per thread that opened a
parallel region, alive after the region ends. Load a model in one thread
(every torch operator and our C kernels open regions) and step it in another,
as the server's and the Ray actors' engine loops do, and the process holds two
pools: 2 threads each on a 2-core machine. libgomp then counts more managed
threads than CPUs and stops spinning at its barriers (``gomp_throttled_spin_count``):
every parallel region's workers go to sleep on a futex when it ends and must
be woken for the next one. Measured on the 2-core AMD EPYC (2026-12-05), a
bf16 ``[1, 576] x [576, 3072]`` linear took 40 us from the loading thread and
105 us from a second thread, and a SmolLM2 decode batch ran 25-35% slower.

``release_openmp_pool()`` pauses the calling thread's pool
(``omp_pause_resource_all``, OpenMP 5.0): its workers exit and the count drops.
The runtime builds a new pool if that thread opens a region again, so calling
it is always safe, only slower for that thread's next region. The runtime is
the one already loaded in the process (torch's own ``libgomp`` in the CPU
wheels; our C kernels link against the same), found by its mapped file.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from functools import lru_cache

logger = logging.getLogger(__name__)

OMP_PAUSE_SOFT = 1  # omp_pause_soft: threads go, the runtime stays usable
RUNTIME_PREFIXES = ("libgomp", "libiomp5", "libomp")


def loaded_openmp_runtimes(maps_path: str = "/proc/self/maps") -> list[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux), in mapping order."""
    try:
        with open(maps_path) as maps:
            paths = [line.split(maxsplit=5)[-1].strip() for line in maps if "/" in line]
    except OSError:  # not Linux: no /proc
        return []
    seen: dict[str, None] = {}
    for path in paths:
        if os.path.basename(path).startswith(RUNTIME_PREFIXES):
            seen.setdefault(path, None)
    return list(seen)


@lru_cache(maxsize=1)
def _pause_functions() -> tuple[Callable[[int], int], ...]:
    functions: list[Callable[[int], int]] = []
    for path in loaded_openmp_runtimes():
        try:
            pause = ctypes.CDLL(path).omp_pause_resource_all  # already mapped: no second copy is loaded
        except (OSError, AttributeError):  # a runtime older than OpenMP 5.0
            logger.debug("OpenMP runtime %s has no omp_pause_resource_all", path)
            continue
        pause.argtypes = [ctypes.c_int]
        pause.restype = ctypes.c_int
        functions.append(pause)
    return tuple(functions)


def release_openmp_pool() -> bool:
    """Pause this thread's OpenMP worker pool in every runtime loaded; True if
    one was paused. Call it from the thread that loaded the engine, before
    another thread starts stepping it."""
    import torch  # the runtime is mapped once torch (and so its OpenMP) is loaded

    if not torch.backends.openmp.is_available():
        return False
    paused = False
    for pause in _pause_functions():
        paused = pause(OMP_PAUSE_SOFT) == 0 or paused  # -1 inside a parallel region: nothing to give back
    logger.debug("this thread's OpenMP pool %s", "released" if paused else "was not released")
    return paused
