"""One local Ray cluster per test module: 2 CPUs, no dashboard, no usage stats.

A module overrides the ``ray_env`` fixture for variables its Ray workers must
see: they are set before the cluster starts, since workers inherit the
environment of the process that started it. The checkout under test leads
``PYTHONPATH`` for the same reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_env() -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def ray_cluster(ray_env):
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'speculant[ray]' (CI installs it "
                                            "with the test extra)")
    env = {"RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
           **ray_env}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
