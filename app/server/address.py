"""A listener's address as ``kip98 serve`` takes it: ``[PROTOCOL://]HOST:PORT``.

The security protocol is part of the address, as in Kafka's ``listeners``, so what a
connection must do before its first request travels with where it connects."""

from __future__ import annotations

from dataclasses import dataclass

# The listeners' security protocols served: as is, or SASL (PLAIN) first.
SCHEMES = ("PLAINTEXT", "SASL_PLAINTEXT")


@dataclass(frozen=True)
class Listener:
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @classmethod
    def parse(cls, text: str) -> Listener:
        """``HOST:PORT``, ``PLAINTEXT://HOST:PORT`` or ``SASL_PLAINTEXT://HOST:PORT`` (an
        IPv6 host in brackets); ValueError if it is not one."""
        scheme, sep, rest = text.partition("://")
        protocol = "PLAINTEXT"
        if sep:
            protocol = scheme.upper()
            if protocol not in SCHEMES:
                raise ValueError(f"{text!r}: only {' and '.join(SCHEMES)} listeners are served")
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
        return self.security_protocol == "SASL_PLAINTEXT"
