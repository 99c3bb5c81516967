"""The context every request handler runs in: the database, the clock, the settings and
who is asking.

It lives beneath the libraries (log, coordinator, groups, security, cleaner), which all
take it, so none of them imports the request layer above them (``app.broker``). There is
no server process; any number of processes construct one over the same database and
PostgreSQL's row locks serialise them. Nothing held here is authoritative.

``principal`` is who the requests are made for, checked against the ACLs when
authorization is on (``app.security``); None is Kafka's ``User:ANONYMOUS``.

``replica_engine``: a standby of the database, where fetches read their records (Kafka's
fetch from follower, KIP-392; ``app.broker.follower``); everything else uses ``engine``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Self

import psycopg
from sqlalchemy import Engine

from app.clock import SYSTEM_CLOCK, Clock
from app.errors import KafkaError, fail
from app.settings import BrokerSettings
from app.storage.engine import get_engine, resolve_url
from app.storage.migrate import SchemaError, ensure_schema


@dataclass
class BrokerContext:
    engine: Engine
    clock: Clock = SYSTEM_CLOCK
    settings: BrokerSettings = field(default_factory=BrokerSettings.from_env)
    principal: str | None = None
    replica_engine: Engine | None = None

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        clock: Clock | None = None,
        settings: BrokerSettings | None = None,
        principal: str | None = None,
        replica_url: str | None = None,
    ) -> Self:
        cfg = settings or BrokerSettings.from_env()
        return cls(
            engine=get_engine(url, cfg),  # its sessions bounded by these settings
            clock=clock or SYSTEM_CLOCK,
            settings=cfg,
            principal=principal or principal_from_env(),
            replica_engine=None if replica_url is None else get_engine(replica_url, cfg),
        )

    @staticmethod
    def check_schema(url: str | None = None) -> None:
        """Refuse, before anything else, a database whose schema is not kip98's newest
        and is not migrated on demand (the embedded one is, and any with
        ``KIP98_AUTO_MIGRATE=1``): KafkaException(_NOT_CONFIGURED) in one line that names
        ``kip98 db migrate``. A database that cannot be reached is left to the first
        statement to report, as it reports it anywhere else."""
        try:
            ensure_schema(resolve_url(url), migrate=False)
        except SchemaError as exc:
            raise fail(KafkaError._NOT_CONFIGURED, str(exc), fatal=True) from exc
        except psycopg.OperationalError:
            return


def principal_from_env() -> str | None:
    """``KIP98_PRINCIPAL``: the principal of the CLI, and of clients configured without one."""
    return os.environ.get("KIP98_PRINCIPAL") or None
