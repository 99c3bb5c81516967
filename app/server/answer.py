"""What a wire handler answers with: values, nothing, or an answer not ready yet."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.broker import Broker
from app.server.node import Node


@dataclass(frozen=True)
class Pending:
    """An answer not ready yet (a long poll): ask ``again`` after ``wait_s`` seconds."""

    wait_s: float
    again: Callable[[], dict[str, Any] | Pending]


# Kafka's "authorized operations not asked for or not worked out" bitfield (groups', the
# cluster's).
NO_OPERATIONS = -(2**31)

# A handler's answer: the response's values, None for no response (acks=0), or Pending.
Answer = dict[str, Any] | None | Pending
Handler = Callable[[Broker, Node, Any], Answer]
