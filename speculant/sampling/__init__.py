"""Sampling, logits processing and the acceptance arithmetic the engine and the
built-in acceptance plugins share: below the engine, with no engine state."""
