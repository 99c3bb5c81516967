"""The database URL, read once and given to each thing that connects in its own form.

kip98 is configured with one SQLAlchemy URL. A replicated PostgreSQL is reached by naming
every node and letting libpq pick the one that fits (``target_session_attrs``: the
writable primary, or a standby), so the same URL stays right after a failover. Users write
such a URL the way libpq and the JDBC driver do, hosts listed in the authority
(``postgresql+psycopg://u:p@h1:5432,h2:5432/kip98?target_session_attrs=read-write``),
which SQLAlchemy's parser refuses (it reads one port); SQLAlchemy's own form lists them as
``host`` query parameters (``…@/kip98?host=h1:5432&host=h2:5432``). This module is the one
place either form is read, and the one conversion into each form something connects
with:

- ``sqlalchemy_url``: the engines' (SQLAlchemy's form when there are several hosts, the
  URL unchanged otherwise);
- ``libpq_conninfo``: psycopg connections opened beside the engines (``host=h1,h2
  port=p1,p2``, with the URL's libpq parameters such as ``target_session_attrs``);
- ``jdbc_url``: Spark's (``jdbc:postgresql://h1:p1,h2:p2/db?targetServerType=primary``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, unquote, urlencode

import psycopg.conninfo
from sqlalchemy.engine import URL, make_url

DEFAULT_PORT = 5432

# libpq's target_session_attrs -> the JDBC driver's targetServerType.
_JDBC_TARGET = {
    "any": "any",
    "read-write": "primary",
    "primary": "primary",
    "read-only": "secondary",
    "standby": "secondary",
    "prefer-standby": "preferSecondary",
}

# scheme://[userinfo@]host:port,host:port[/database][?query]
_MULTI_HOST = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?:(?P<userinfo>[^@/]*)@)?"
    r"(?P<hosts>[^/?]*,[^/?]*)(?P<rest>[/?].*)?$"
)


class DatabaseUrlError(ValueError):
    """The URL cannot be read (the message says why)."""


@dataclass(frozen=True)
class DatabaseUrl:
    """A PostgreSQL URL's parts: every host with its port, in order."""

    drivername: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    database: str | None
    query: tuple[tuple[str, str], ...]  # the libpq parameters, in order, without host/port

    @property
    def target_session_attrs(self) -> str | None:
        return dict(self.query).get("target_session_attrs")

    def with_database(self, database: str) -> DatabaseUrl:
        return replace(self, database=database)

    def with_target(self, target_session_attrs: str | None) -> DatabaseUrl:
        """The same hosts, reaching the node ``target_session_attrs`` asks for (None: any)."""
        query = [(k, v) for k, v in self.query if k != "target_session_attrs"]
        if target_session_attrs is not None:
            query.append(("target_session_attrs", target_session_attrs))
        return replace(self, query=tuple(query))

    def render(self, hide_password: bool = False) -> str:
        """As libpq and the JDBC driver write it, and as users give it: several hosts in
        the authority (``…@h1:5432,h2:5432/db``); one host, as SQLAlchemy writes it."""
        if len(self.hosts) == 1:
            return self.sqlalchemy(hide_password)
        userinfo = ""
        if self.username is not None:
            userinfo = quote(self.username, safe="")
            if self.password is not None:
                userinfo += ":" + ("***" if hide_password else quote(self.password, safe=""))
            userinfo += "@"
        hosts = ",".join(f"{_bracketed(h)}:{p}" for h, p in self.hosts)
        database = f"/{quote(self.database, safe='')}" if self.database else "/"
        query = f"?{urlencode(self.query)}" if self.query else ""
        return f"{self.drivername}://{userinfo}{hosts}{database}{query}"

    def libpq(self, with_password: bool = True) -> str:
        """As libpq (psql) reads a URI: ``postgresql://``, no driver suffix, every host in
        the authority; its password left out unless ``with_password``."""
        shown = replace(self, drivername="postgresql")
        if not with_password:
            shown = replace(shown, password=None)
        if len(self.hosts) == 1:  # render() would give SQLAlchemy's form, the same for one host
            return shown.sqlalchemy()
        return shown.render()

    def sqlalchemy(self, hide_password: bool = False) -> str:
        """As SQLAlchemy reads it: one host in the authority, several as ``host`` query
        parameters."""
        single = len(self.hosts) == 1
        query: dict[str, Any] = {}
        if not single:
            query["host"] = tuple(f"{_bracketed(h)}:{p}" for h, p in self.hosts)
        for key, value in self.query:
            query[key] = value
        url = URL.create(
            self.drivername,
            username=self.username,
            password=self.password,
            host=self.hosts[0][0] if single else None,
            port=self.hosts[0][1] if single else None,
            database=self.database,
            query=query,
        )
        return url.render_as_string(hide_password=hide_password)

    def conninfo(self, dbname: str | None = None, **extra: Any) -> str:
        """A libpq connection string for the same nodes (``dbname`` instead of the URL's,
        ``postgres`` if it names none)."""
        params: dict[str, Any] = {
            "host": ",".join(h for h, _ in self.hosts),
            "port": ",".join(str(p) for _, p in self.hosts),
            "user": self.username or "",
            "password": self.password or "",
            "dbname": dbname or self.database or "postgres",
        }
        params.update(self.query)
        params.update(extra)
        return psycopg.conninfo.make_conninfo(**params)

    def jdbc(self) -> tuple[str, dict[str, str]]:
        """``(jdbc_url, properties)``: the hosts and database in the URL, the credentials in
        the properties (Spark logs URLs). libpq's parameters that mean the same to the JDBC
        driver are carried over, ``target_session_attrs`` as ``targetServerType``."""
        # A socket directory has no JDBC meaning: TCP on the same machine instead.
        hosts = ",".join(
            f"{'localhost' if h.startswith('/') else _bracketed(h)}:{p}" for h, p in self.hosts
        )
        query: dict[str, str] = {}
        for key, value in self.query:
            if key == "target_session_attrs":
                if value not in _JDBC_TARGET:
                    raise DatabaseUrlError(f"unknown target_session_attrs {value!r}")
                query["targetServerType"] = _JDBC_TARGET[value]
            else:
                query[key] = value
        suffix = f"?{urlencode(query)}" if query else ""
        database = quote(self.database or "postgres", safe="")
        properties: dict[str, str] = {}
        if self.username:
            properties["user"] = self.username
        if self.password is not None:
            properties["password"] = self.password
        return f"jdbc:postgresql://{hosts}/{database}{suffix}", properties


def parse(url: str | URL) -> DatabaseUrl:
    """Read a PostgreSQL URL in either multi-host form (or the usual one-host form)."""
    sa_url = url if isinstance(url, URL) else make_url(_authority_hosts_as_query(url))
    hosts: list[tuple[str, int]] = []
    query: list[tuple[str, str]] = []
    ports: list[str] = []
    for key, value in sa_url.query.items():
        values = value if isinstance(value, tuple) else (value,)
        if key == "host":
            hosts.extend(_host_port(v) for v in values)
        elif key == "port":
            ports.extend(p for v in values for p in v.split(","))
        else:
            query.extend((key, v) for v in values)
    if sa_url.host:
        hosts.insert(0, (sa_url.host, sa_url.port or DEFAULT_PORT))
    if ports:  # ?host=h1,h2&port=p1,p2 (libpq's own form)
        hosts = _with_ports(hosts, ports)
    if not hosts:
        hosts = [("127.0.0.1", sa_url.port or DEFAULT_PORT)]
    return DatabaseUrl(
        drivername=sa_url.drivername,
        hosts=tuple(hosts),
        username=sa_url.username,
        password=None if sa_url.password is None else str(sa_url.password),
        database=sa_url.database,
        query=tuple(query),
    )


def sqlalchemy_url(url: str | URL) -> str:
    """``url`` as SQLAlchemy reads it: unchanged with one host; with several named in the
    authority, as ``host`` query parameters. An SQLAlchemy ``URL`` is rendered as it is."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=False)
    if _MULTI_HOST.match(url) is None:
        return url
    return parse(url).sqlalchemy()


def libpq_conninfo(
    url: str, *, dbname: str | None = None, application_name: str | None = None
) -> str:
    """A URL as a libpq connection string, for what connects with psycopg directly beside
    the engines (admin sessions, fault injection, the bench's floors): the URL's hosts and
    ports, user, password and libpq parameters; its database unless ``dbname`` is given
    (``postgres`` if it names none)."""
    extra = {} if application_name is None else {"application_name": application_name}
    return parse(url).conninfo(dbname=dbname, **extra)


def jdbc_url(url: str) -> tuple[str, dict[str, str]]:
    """``(jdbc_url, properties)`` for Spark's JDBC reads and writes of ``url``'s database."""
    sa_url = make_url(_authority_hosts_as_query(url))
    if sa_url.get_backend_name() != "postgresql":
        raise DatabaseUrlError(
            f"not a PostgreSQL URL: {sa_url.render_as_string(hide_password=True)}"
        )
    return parse(sa_url).jdbc()


def safe(url: str) -> str:
    """``url`` with its password masked, for printing."""
    return parse(url).render(hide_password=True)


def with_target(url: str, target_session_attrs: str | None) -> str:
    """``url`` reaching the node ``target_session_attrs`` names (``read-write``: the
    primary; ``standby``; None: whichever answers first)."""
    return parse(url).with_target(target_session_attrs).render()


def _authority_hosts_as_query(url: str) -> str:
    found = _MULTI_HOST.match(url)
    if found is None:
        return url
    hosts = found["hosts"].split(",")
    if not all(hosts):
        raise DatabaseUrlError(f"an empty host in {found['hosts']!r}")
    rest = found["rest"] or ""
    path, _, query = rest.partition("?")
    listed = "&".join(f"host={quote(h, safe=':[]')}" for h in hosts)
    userinfo = f"{found['userinfo']}@" if found["userinfo"] is not None else ""
    return f"{found['scheme']}://{userinfo}{path or '/'}?{listed}{'&' + query if query else ''}"


def _host_port(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a socket directory."""
    text = unquote(text)
    if text.startswith("/"):
        return text, DEFAULT_PORT
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not host:
        raise DatabaseUrlError(f"an empty host in {text!r}")
    if port and not port.isdigit():
        raise DatabaseUrlError(f"not a port: {port!r} (in {text!r})")
    return host, int(port) if port else DEFAULT_PORT


def _with_ports(hosts: list[tuple[str, int]], ports: list[str]) -> list[tuple[str, int]]:
    if len(ports) == 1:
        return [(h, int(ports[0])) for h, _ in hosts]
    if len(ports) != len(hosts):
        raise DatabaseUrlError(f"{len(hosts)} hosts but {len(ports)} ports")
    return [(h, int(p)) for (h, _), p in zip(hosts, ports, strict=True)]


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
