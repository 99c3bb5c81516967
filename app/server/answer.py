"""What a wire handler answers with, and the node it answers as.

Every answer is this one node's: kip98 has no replicas, so node 0 leads every partition
and coordinates every group and transactional id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.broker import Broker

if TYPE_CHECKING:
    from app.server.sasl import Session

NODE_ID = 0


@dataclass(frozen=True)
class Node:
    """The address clients are told to connect to (the advertised listener) and, for one
    request, who sent it: the client id of its header and the address it connects from,
    as Kafka's group coordinator records them, and its connection's SASL session."""

    host: str
    port: int
    cluster_id: str
    client_id: str = ""
    client_host: str = ""
    session: Session | None = None


@dataclass(frozen=True)
class Pending:
    """An answer not ready yet (a long poll): ask ``again`` after ``wait_s`` seconds."""

    wait_s: float
    again: Callable[[], dict[str, Any] | Pending]


# A handler's answer: the response's values, None for no response (acks=0), or Pending.
Answer = dict[str, Any] | None | Pending
Handler = Callable[[Broker, Node, Any], Answer]
