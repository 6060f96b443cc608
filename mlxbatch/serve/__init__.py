"""`mlxbatch serve`: a local HTTP service that batches arriving tickets on the live scheduler."""
