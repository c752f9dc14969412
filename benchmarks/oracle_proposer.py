"""The benchmark oracle proposer lives in ``speculant.bench.oracle`` (``speculant
bench --random-llama`` uses it); this name stays for the benchmark scripts."""

from speculant.bench.oracle import (  # noqa: F401 - re-exported for the scripts
    OracleOptions,
    OracleProposer,
    load_continuations,
    register,
    save_continuations,
    unregister,
)
