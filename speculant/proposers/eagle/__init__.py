"""EAGLE-style proposer: a one-layer autoregressive head on the target's hidden states."""
