"""Linear layers re-laid out once for fast CPU kernels: packing, backends, merging."""
