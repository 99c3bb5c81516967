"""``kip98 serve``'s listener addresses: the security protocol travels with the address,
one listener per protocol, each advertising the address of its own protocol."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.server import Listener, endpoints_of
from app.server.command import serve_command


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9092", Listener("127.0.0.1", 9092, "PLAINTEXT")),
        ("PLAINTEXT://kafka.local:0", Listener("kafka.local", 0, "PLAINTEXT")),
        ("sasl_plaintext://[::1]:9093", Listener("::1", 9093, "SASL_PLAINTEXT")),
        ("SSL://0.0.0.0:9094", Listener("0.0.0.0", 9094, "SSL")),
        ("SASL_SSL://h:9095", Listener("h", 9095, "SASL_SSL")),
    ],
)
def test_listener_addresses(text: str, expected: Listener) -> None:
    listener = Listener.parse(text)
    assert listener == expected
    assert listener.address == (expected.host, expected.port)
    assert listener.sasl == expected.security_protocol.startswith("SASL_")
    assert listener.tls == expected.security_protocol.endswith("SSL")
    assert Listener.parse(str(listener)) == listener


@pytest.mark.parametrize(
    "text", ["9092", "host:", ":9092", "host:port", "host:70000", "SASL_GSSAPI://host:9093"]
)
def test_bad_listener_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        Listener.parse(text)


def test_each_listener_advertises_the_address_of_its_protocol() -> None:
    plain, sasl = "PLAINTEXT://0.0.0.0:9092", "SASL_SSL://0.0.0.0:9093"
    shown = endpoints_of([plain, sasl], ["SASL_SSL://kafka.example:19093"])
    assert [(e.listener.security_protocol, e.node.host, e.node.port) for e in shown] == [
        ("PLAINTEXT", "0.0.0.0", 9092),
        ("SASL_SSL", "kafka.example", 19093),
    ]
    # Bare is PLAINTEXT, as for --listen; but with one listener, it is that listener's.
    bare = endpoints_of([plain, sasl], ["kafka.example:19092"])
    assert [(e.node.host, e.node.port) for e in bare] == [
        ("kafka.example", 19092),
        ("0.0.0.0", 9093),
    ]
    [one] = endpoints_of([sasl], ["kafka.example:19093"])
    assert (one.node.host, one.node.port) == ("kafka.example", 19093)
    for listens, advertised in (
        ([plain, "PLAINTEXT://0.0.0.0:9094"], []),  # a protocol twice
        ([plain], ["SSL://kafka.example:9093"]),  # no SSL listener to advertise
    ):
        with pytest.raises(ValueError):
            endpoints_of(listens, advertised)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "GSSAPI://127.0.0.1:9093"], "only PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        (["--listen", "SSL://127.0.0.1:9093"], "needs a TLS certificate and key (--tls-cert, --tls-key)"),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--listen", "SSL://127.0.0.1:9093", "--tls-cert", "no.pem", "--tls-key", "no.key"],
         "no such file"),
        (["--listen", "127.0.0.1:1", "--listen", "PLAINTEXT://127.0.0.1:2"],
         "one listener per security protocol"),
        (["--super-user", "alice"], "'alice' is not User:NAME"),
    ],
)  # fmt: skip
def test_serve_refuses_bad_listeners_in_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(serve_command, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
