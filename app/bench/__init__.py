"""Benchmarks that drive the broker the way a client does; ``scripts/bench`` runs them."""
