"""Modules a test runs as a process of its own (``python -m tests.children.<name>``), so it
can kill, pause or outlive it: producers that crash or stop at a chosen point, a copier, a
Spark driver, writers through a failover. Run from the repository's root."""
