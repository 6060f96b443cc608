"""Jobs built on the engine: the Python API, classify jobs, benchmarks, doctor."""
