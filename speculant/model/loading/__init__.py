"""Loading models: Hugging Face directories and GGUF files (converted once, cached)."""
