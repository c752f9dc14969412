"""The docs' generated result tables: ``python -m benchmarks.docs`` rewrites them
from ``benchmarks/results/*.json``, ``python -m benchmarks.docs --check`` reports
stale ones (``generate.py``; one module of table functions per subject)."""
