"""Training pipeline for the bundled demo models (entry point: scripts/train_demo_models.py).

One idea per module: corpus (stdlib file selection and split), tokenizer (BPE and
token arrays), sizes (model presets), data (packed windows with a resumable
position), objectives (LM and distillation losses), trainer (the resumable loop),
checkpoint (atomic save/load), export (16-bit HF dirs and load-back check),
evaluate (loss, greedy agreement, degeneracy), measure (throughput), cli.
"""
