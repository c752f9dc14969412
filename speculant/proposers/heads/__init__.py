"""Proposers that read the target's final hidden states (Medusa, MLP speculator)."""
