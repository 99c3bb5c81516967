"""``python -m app.server``: ``kip98 serve`` with the same options."""

from app.server.command import serve_command

serve_command(prog_name="python -m app.server")
