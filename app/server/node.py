"""The node a request is answered as, and who sent it.

Every wire handler takes a ``Node``; giving it a module of its own, beneath the handlers
and the listener, keeps the server's imports running one way (the handler modules import
this, never each other's modules for it).

Every node of a cluster serves every partition, group and transactional id from the
shared storage; Metadata and FindCoordinator spread clients over the live nodes
(``cluster_apis``). A node's own id, which its registration holds (``Member``), matters
only when no node is registered at all: it then names itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scramp.core import ScramServer  # made by ScramMechanism.make_server, not exported

NODE_ID = 0
# A rack is named as Kafka names topics and ids: letters, digits, '.', '_', '-'.
_RACK = re.compile(r"[A-Za-z0-9._-]{1,249}")


def check_rack(rack: str) -> str:
    """``rack`` if it is a name Kafka takes (``_RACK``); ValueError otherwise."""
    if not _RACK.fullmatch(rack):
        raise ValueError(f"rack {rack!r}: use 1 to 249 letters, digits, '.', '_' or '-'")
    return rack


@dataclass(eq=False)
class Member:
    """This node's registration as it stands (``app.server.registration`` keeps it): its
    node id, which a registration lost while the node was cut off may change, and rack."""

    node_id: int = NODE_ID
    rack: str | None = None


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
    # SaslHandshake v0: the tokens follow as bare size-prefixed frames, not SaslAuthenticate.
    bare_tokens: bool = False
    # The principal a login tried (``User:NAME``, whatever the password), for its log line.
    tried: str | None = None

    @property
    def admits(self) -> bool:
        """Whether requests other than the SASL ones may be answered."""
        return not self.enabled or self.principal is not None


@dataclass(frozen=True)
class Node:
    """The address clients are told to connect to (the advertised listener) and its
    security protocol, the node's registration, and, for one request, who sent it: the
    client id of its header and the address it connects from, as Kafka's group
    coordinator records them, and its connection's SASL session."""

    host: str
    port: int
    cluster_id: str
    security_protocol: str = "PLAINTEXT"
    member: Member = field(default_factory=Member)
    client_id: str = ""
    client_host: str = ""
    session: Session | None = None
