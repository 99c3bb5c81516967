"""Helpers shared by the client-level tests (the ``clients`` fixture is in conftest)."""

from __future__ import annotations

from typing import Any

from app.admin import AdminClient, NewTopic
from app.client import Consumer


def create_topics(db_url: str, spec: dict[str, int]) -> None:
    admin = AdminClient({"database.url": db_url})
    try:
        for name, n in spec.items():
            admin.create_topics([NewTopic(name, n)])[name].result()
    finally:
        admin.close()


def group_consumer(db_url: str, clients: list[Any], group: str, **extra: Any) -> Consumer:
    """A group member that commits by hand and notices a dead peer within seconds."""
    c = Consumer(
        {
            "database.url": db_url,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 3000,
            "heartbeat.interval.ms": 200,
            **extra,
        }
    )
    clients.append(c)
    return c
