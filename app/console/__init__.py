"""``kip98 console``: a read-mostly web console over kip98's database.

A front end beside ``kip98 serve`` and the CLI: it logs users in with kip98's own SASL
users (``auth``), shows what the ACLs let each one Describe (``views``), reads the log,
the coordinator's event log and the groups through the admin SQL views and the libraries'
own statements (``sql``), and acts only through the admin operations the CLI uses
(KIP-664's abort), behind a CSRF token (``web``).
"""
