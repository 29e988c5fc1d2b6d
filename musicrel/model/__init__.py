"""The Music Transformer: its config, attention variants, the model with its KV cache, checkpoints."""
