"""The broker's write strategy counter (``broker.strategy``, docs/design.md §3.9) as the
tests read it: how many requests of a kind went each way since the helper was made."""

from __future__ import annotations

from app.broker import strategy


class Ways:
    """Requests of ``request`` ("produce", "register", "commit") since made: ``one``
    (sent in one query string), ``lock`` (sent under the locks), ``refused`` (one-query
    writes refused by a moved row, then sent under the locks) and ``declined`` (tried on
    the remembered rows, whose decision needed the locks)."""

    def __init__(self, request: strategy.Request) -> None:
        self.request = request
        self._start = strategy.counts()

    def _since(self, way: str, outcome: str) -> int:
        key = (self.request, way, outcome)
        return strategy.counts().get(key, 0) - self._start.get(key, 0)

    @property
    def one(self) -> int:
        return self._since(strategy.ONE_QUERY, strategy.SENT)

    @property
    def lock(self) -> int:
        return self._since(strategy.LOCKED, strategy.SENT)

    @property
    def refused(self) -> int:
        return self._since(strategy.ONE_QUERY, strategy.REFUSED)

    @property
    def declined(self) -> int:
        return self._since(strategy.ONE_QUERY, strategy.DECLINED)

    @property
    def sent(self) -> tuple[int, int]:
        """(one, lock): the requests sent each way."""
        return self.one, self.lock
