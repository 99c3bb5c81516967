"""Verification under faults: a randomized workload, a nemesis, and a history checker.

``python -m app.torture`` (``scripts/torture``) runs worker, copier and coordinator
processes against one database while the nemesis kills, pauses and disconnects them and
restarts PostgreSQL; every client operation lands in a JSON-lines history. After the run
quiesces, ``checker`` judges the histories against a dump of the final log. The checker
is pure, so a kept run directory can be judged again (``python -m app.torture check``).
"""
