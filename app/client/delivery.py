"""Delivery reports: produced by the sender thread, served on the application's thread.

As in librdkafka, callbacks never run on the background thread: the application decides
when (and on which thread) its ``on_delivery`` code runs by calling ``poll``/``flush``.
A message counts as outstanding (``len(producer)``) until its report has been served,
which is what lets ``flush()`` mean "every callback has run".
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from app.client.batching import DeliveryCallback
from app.client.message import Message
from app.errors import KafkaError


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    callback: DeliveryCallback | None
    error: KafkaError | None
    message: Message


class DeliveryReports:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._reports: deque[DeliveryReport] = deque()
        self._outstanding = 0

    def __len__(self) -> int:
        with self._cond:
            return self._outstanding

    def ready(self) -> int:
        with self._cond:
            return len(self._reports)

    def accepted(self, count: int = 1) -> None:
        """Messages handed to the producer: outstanding until their reports are served."""
        with self._cond:
            self._outstanding += count

    def push(self, reports: list[DeliveryReport]) -> None:
        if not reports:
            return
        with self._cond:
            self._reports.extend(reports)
            self._cond.notify_all()

    def wake(self) -> None:
        """Let a waiting ``serve`` re-check (e.g. on close)."""
        with self._cond:
            self._cond.notify_all()

    def serve(self, timeout: float | None, default_callback: DeliveryCallback | None) -> int:
        """Run the callbacks of every report ready, waiting up to ``timeout`` seconds
        (None: without limit) for the first. Returns how many were served.

        A callback that raises stops the serving and the exception propagates, as from
        confluent-kafka's poll(); the remaining reports stay queued.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not self._reports:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
            batch = list(self._reports)
            self._reports.clear()
        served = 0
        try:
            for i, report in enumerate(batch):
                served = i + 1
                with self._cond:
                    self._outstanding -= 1
                callback = report.callback or default_callback
                if callback is not None:
                    callback(report.error, report.message)
        except BaseException:
            with self._cond:
                self._reports.extendleft(reversed(batch[served:]))
            raise
        return served
