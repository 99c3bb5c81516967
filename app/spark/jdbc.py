"""SQLAlchemy URL -> what Spark's JDBC source wants.

kip98 is configured with one SQLAlchemy URL; Spark needs the same database as a
``jdbc:postgresql`` URL plus connection properties, and credentials belong in the
properties (Spark logs URLs, and the driver would read them from either place). The
conversion itself, several hosts and ``target_session_attrs`` included, is storage's one
reading of the URL (``app.storage.urls``).
"""

from __future__ import annotations

from app.storage import urls

DRIVER = "org.postgresql.Driver"


def jdbc_url(sqlalchemy_url: str) -> tuple[str, dict[str, str]]:
    """``(jdbc_url, properties)`` for ``spark.read.jdbc(url, table, properties=...)``.

    Query parameters of the SQLAlchemy URL (``sslmode=require`` …) mean the same to the
    JDBC driver and are carried over (``target_session_attrs`` as ``targetServerType``); a
    ``host`` that is a socket directory (libpq's) has no JDBC meaning, so TCP on localhost
    is assumed then. Several hosts stay several: the driver picks the one the target
    asks for, as libpq does.
    """
    try:
        url, properties = urls.jdbc_url(sqlalchemy_url)
    except urls.DatabaseUrlError as exc:
        raise ValueError(str(exc)) from exc
    return url, {"driver": DRIVER, **properties}
