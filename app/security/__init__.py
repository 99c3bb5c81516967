"""Authorization: Kafka's ACL model over the ``acls`` table (see docs/security.md)."""
