"""The node a request is answered as, and who sent it.

Every wire handler takes a ``Node``; giving it a module of its own, beneath the handlers
and the listener, keeps the server's imports running one way (the handler modules import
this, never each other's modules for it).

Every answer is this one node's: the storage is shared, so node 0 leads every partition
and coordinates every group and transactional id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scramp.core import ScramServer  # made by ScramMechanism.make_server, not exported

NODE_ID = 0


@dataclass
class Session:
    """One connection's authentication: whom it authenticated as (``principal``), and
    whether it failed (then the listener closes it after the answer)."""

    enabled: bool  # False: a PLAINTEXT listener, which takes no SASL
    mechanism: str | None = None
    principal: str | None = None
    failed: bool = False
    # A SCRAM exchange between its first and final messages, with the principal it is for.
    scram: ScramServer | None = None
    scram_principal: str | None = None

    @property
    def admits(self) -> bool:
        """Whether requests other than the SASL ones may be answered."""
        return not self.enabled or self.principal is not None


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
