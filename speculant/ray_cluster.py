"""Joining a Ray cluster, for both Ray front ends (``speculant batch --ray``, ``speculant serve --ray``)."""

from __future__ import annotations

import os


def connect() -> bool:
    """Join the cluster at ``$RAY_ADDRESS``, or start one on this machine (no dashboard); nothing if this
    process is connected already. True if it connected now."""
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(include_dashboard=False, log_to_driver=False)
    return True
