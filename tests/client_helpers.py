"""Helpers shared by the client-level tests (the ``clients`` fixture is in conftest)."""

from __future__ import annotations

from app.admin import AdminClient, NewTopic


def create_topics(db_url: str, spec: dict[str, int]) -> None:
    admin = AdminClient({"database.url": db_url})
    try:
        for name, n in spec.items():
            admin.create_topics([NewTopic(name, n)])[name].result()
    finally:
        admin.close()
