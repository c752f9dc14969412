"""Attention: the HF seam, the forward context and the paged backends."""
