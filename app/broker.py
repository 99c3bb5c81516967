"""The broker: the context every request handler runs in.

There is no server process; any number of processes construct a Broker over the same
database and PostgreSQL's row locks serialise them. Nothing held here is authoritative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine

from app.clock import SYSTEM_CLOCK, Clock
from app.settings import BrokerSettings
from app.storage.engine import get_engine


@dataclass
class Broker:
    engine: Engine
    clock: Clock = SYSTEM_CLOCK
    settings: BrokerSettings = field(default_factory=BrokerSettings.from_env)

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        clock: Clock | None = None,
        settings: BrokerSettings | None = None,
    ) -> Broker:
        return cls(
            engine=get_engine(url),
            clock=clock or SYSTEM_CLOCK,
            settings=settings or BrokerSettings.from_env(),
        )
