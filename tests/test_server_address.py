"""``kip98 serve``'s listener addresses: the security protocol travels with the address."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.server import Listener
from app.server.command import serve_command


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9092", Listener("127.0.0.1", 9092, "PLAINTEXT")),
        ("PLAINTEXT://kafka.local:0", Listener("kafka.local", 0, "PLAINTEXT")),
        ("sasl_plaintext://[::1]:9093", Listener("::1", 9093, "SASL_PLAINTEXT")),
    ],
)
def test_listener_addresses(text: str, expected: Listener) -> None:
    listener = Listener.parse(text)
    assert listener == expected
    assert listener.address == (expected.host, expected.port)
    assert listener.sasl == (expected.security_protocol == "SASL_PLAINTEXT")


@pytest.mark.parametrize(
    "text", ["9092", "host:", ":9092", "host:port", "host:70000", "SSL://host:9093"]
)
def test_bad_listener_addresses(text: str) -> None:
    with pytest.raises(ValueError):
        Listener.parse(text)


def test_serve_refuses_a_bad_listener_in_one_line() -> None:
    result = CliRunner().invoke(serve_command, ["--listen", "SSL://127.0.0.1:9093"])
    assert result.exit_code == 2
    assert "only PLAINTEXT and SASL_PLAINTEXT listeners are served" in result.output
