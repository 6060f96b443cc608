"""Input and output: reading rows, crash-safe sinks, synthetic tickets. No MLX here."""
