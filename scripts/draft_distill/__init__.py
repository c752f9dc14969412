"""Distil a small standalone draft model from a target (``scripts/train_draft.py``)."""
