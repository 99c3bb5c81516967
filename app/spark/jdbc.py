"""SQLAlchemy URL -> what Spark's JDBC source wants.

kip98 is configured with one SQLAlchemy URL; Spark needs the same database as a
``jdbc:postgresql`` URL plus connection properties, and credentials belong in the
properties (Spark logs URLs, and the driver would read them from either place).
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from sqlalchemy.engine import make_url

DRIVER = "org.postgresql.Driver"


def jdbc_url(sqlalchemy_url: str) -> tuple[str, dict[str, str]]:
    """``(jdbc_url, properties)`` for ``spark.read.jdbc(url, table, properties=...)``.

    Query parameters of the SQLAlchemy URL (``sslmode=require`` …) mean the same to the
    JDBC driver and are carried over; a ``host`` query parameter (a socket directory for
    libpq) has no JDBC meaning, so TCP on localhost is assumed then.
    """
    url = make_url(sqlalchemy_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"not a PostgreSQL URL: {url.render_as_string(hide_password=True)}")
    host = url.host or "localhost"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = url.port or 5432
    database = quote(url.database or "postgres", safe="")
    query = {k: v for k, v in url.query.items() if k != "host" and isinstance(v, str)}
    suffix = f"?{urlencode(query)}" if query else ""
    properties = {"driver": DRIVER}
    if url.username:
        properties["user"] = url.username
    if url.password is not None:
        properties["password"] = str(url.password)
    return f"jdbc:postgresql://{host}:{port}/{database}{suffix}", properties
