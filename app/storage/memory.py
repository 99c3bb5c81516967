"""What this process last wrote to a database, kept per engine as a hint (docs/design.md
rule 32): rows a later request may decide on without reading them, its writes then
checking that each row is still the version remembered.

Everything an engine remembers is forgotten whenever one of its connections is found
lost: the server may have restarted from a backup, its transaction ids counting again from
an earlier point, so that a remembered ``xmin`` could name another transaction's row.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, event

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class EngineMemory(Generic[K, V]):
    """Per database (engine), values by key. Entries are replaced whole, never changed in
    place, so a reader on another thread sees one entry or the next."""

    def __init__(self) -> None:
        self._engines: WeakKeyDictionary[Engine, dict[K, V]] = WeakKeyDictionary()
        self._first_use = threading.Lock()

    def get(self, conn: Connection, key: K) -> V | None:
        entries = self._engines.get(conn.engine)
        return None if entries is None else entries.get(key)

    def put(self, conn: Connection, key: K, value: V) -> None:
        entries = self._engines.get(conn.engine)
        if entries is None:
            entries = self._entries_of(conn.engine)
        entries[key] = value

    def drop(self, conn: Connection, key: K) -> None:
        entries = self._engines.get(conn.engine)
        if entries is not None:
            entries.pop(key, None)

    def _entries_of(self, engine: Engine) -> dict[K, V]:
        """The engine's entries, made on first use with the listeners that clear them."""
        with self._first_use:
            entries = self._engines.get(engine)
            if entries is None:
                entries = self._engines[engine] = {}
                engine_ref = weakref.ref(engine)

                def forget_everything(*_: object) -> None:
                    alive = engine_ref()
                    if alive is not None and (lost := self._engines.get(alive)) is not None:
                        lost.clear()

                event.listen(engine, "invalidate", forget_everything)
                event.listen(engine, "soft_invalidate", forget_everything)
            return entries
