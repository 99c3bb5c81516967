"""A listener's address as ``kip98 serve`` takes it: ``[PROTOCOL://]HOST:PORT``.

The security protocol is part of the address, as in Kafka's ``listeners`` (whose names
default to the protocols'), so what a connection must do before its first request (TLS,
SASL, both or neither) travels with where it connects."""

from __future__ import annotations

from dataclasses import dataclass

# The listeners' security protocols served: as is or over TLS, with SASL first or not.
SCHEMES = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @classmethod
    def parse(cls, text: str) -> Listener:
        """``HOST:PORT`` (PLAINTEXT) or ``PROTOCOL://HOST:PORT`` for a protocol of
        ``SCHEMES`` (an IPv6 host in brackets); ValueError if it is not one."""
        scheme, sep, rest = text.partition("://")
        protocol = "PLAINTEXT"
        if sep:
            protocol = scheme.upper()
            if protocol not in SCHEMES:
                raise ValueError(f"{text!r}: only {', '.join(SCHEMES)} listeners are served")
            text = rest
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{text!r} is not HOST:PORT")
        return cls(host.strip("[]"), int(port), protocol)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def sasl(self) -> bool:
        """A connection must authenticate first (otherwise every connection acts as the
        server's principal)."""
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.security_protocol}://{host}:{self.port}"


def advertised_for(
    listeners: list[Listener], advertised: list[Listener], bare: bool
) -> dict[Listener, Listener]:
    """The address each listener's clients are told to connect to: the advertised one of
    the same security protocol (Kafka matches advertised.listeners by listener name), else
    its own. ``bare``: the one advertised address was given without a protocol, which
    then names the only listener's. ValueError for a protocol listened on twice, or an
    advertised address no listener has the protocol of."""
    protocols = [listener.security_protocol for listener in listeners]
    if len(set(protocols)) < len(protocols):
        raise ValueError("one listener per security protocol (as Kafka's listener names)")
    if bare and len(advertised) == 1 and len(listeners) == 1:
        advertised = [Listener(advertised[0].host, advertised[0].port, protocols[0])]
    by_protocol = {a.security_protocol: a for a in advertised}
    if len(by_protocol) < len(advertised) or not set(by_protocol) <= set(protocols):
        raise ValueError(
            "each advertised listener needs a listener of its protocol, once: "
            + ", ".join(str(a) for a in advertised)
        )
    return {
        listener: by_protocol.get(listener.security_protocol, listener) for listener in listeners
    }
