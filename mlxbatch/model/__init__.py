"""The model layer: config, the Qwen2 forward, the KV cache, checkpoints, loading, conversion."""
