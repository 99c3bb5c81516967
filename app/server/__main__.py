"""``python -m app.server [--listen HOST:PORT] [--advertised-listener HOST:PORT]``."""

from app.server.command import serve_command

serve_command(prog_name="python -m app.server")
