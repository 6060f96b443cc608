"""The model layer: config, the families and their shared decoder, the KV cache, checkpoints, loading."""
