"""Benchmarks, peers, parity, the demo, machine diagnosis and synthetic workloads."""
