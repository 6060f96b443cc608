"""Device policy: the BLAS behind MLX's CPU backend and how batches are executed."""
