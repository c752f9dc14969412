"""The model layer: what executes a forward. Loading (HF directories, GGUF),
the paged KV memory, the attention seam into transformers and the attention
backends, linear packing and fused norms, resource checks and the runner that
drives one forward over a flattened batch."""
