"""speculant's own decoder loop for the llama family (``model.fast_forward``):
plan.py (which models, and why not), weights.py (merged projections),
decoder.py (the loop), setup.py (selection and the load-time probe)."""
