"""``kip98 console``: the web console (``app.console``) served by uvicorn.

Named ``web`` because ``app.cli.console`` is the console producer and consumer
(``kip98 produce``/``consume``).
"""

from __future__ import annotations

import click

from app.cli.errors import CliError

DEFAULT_LISTEN = "127.0.0.1:8080"


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"--listen takes HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


@click.command()
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT to serve on.")
@click.option(
    "--tls-cert", type=click.Path(exists=True, dir_okay=False), help="PEM certificate (HTTPS)."
)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@click.option("--read-only", is_flag=True, help="Show everything, act on nothing.")
def console(listen: str, tls_cert: str | None, tls_key: str | None, read_only: bool) -> None:
    """Serve the web console: topics, records, transactions' timelines, producers and
    groups, for kip98's users, as their ACLs allow.

    Sessions are signed with KIP98_CONSOLE_SECRET (32 characters or more) when set, else
    with the key in KIP98_HOME/console-secret (made once, mode 0600): they outlive a
    restart and are shared by the consoles given the same key."""
    if (tls_cert is None) != (tls_key is None):
        raise CliError("--tls-cert and --tls-key go together")
    host, port = parse_listen(listen)
    import logging

    import uvicorn

    from app.console.secret import SecretError, session_key
    from app.console.web import create_app
    from app.storage.context import BrokerContext
    from app.storage.embedded import kip98_home

    try:
        key = session_key(kip98_home())
    except (SecretError, OSError) as exc:
        raise CliError(f"the console's session key: {exc}") from exc
    BrokerContext.check_schema()
    # Failed log-ins are logged (app.console.lockout), as kip98 serve logs its own.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    app = create_app(read_only=read_only, https_only=tls_cert is not None, session_key=key)
    scheme = "https" if tls_cert else "http"
    click.echo(f"kip98 console on {scheme}://{listen}/", err=True)
    uvicorn.run(
        app, host=host, port=port, ssl_certfile=tls_cert, ssl_keyfile=tls_key,
        log_level="warning", access_log=False, server_header=False,
    )  # fmt: skip
