"""``python -m bench``: what ``scripts/bench`` runs."""

from bench.cli import main

main()
