"""The ``kip98`` command: one module per command group, registered in ``app.cli.main``."""
