"""One reading of the database URL, one conversion into each form something connects with:
several hosts in either spelling, for the engines, libpq and the JDBC driver alike."""

from __future__ import annotations

import psycopg.conninfo
import pytest
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.engine import make_url

from app.spark.jdbc import DRIVER, jdbc_url
from app.storage import urls
from app.storage.replication import required_standbys

AUTHORITY = "postgresql+psycopg://u:p%40ss@h1:5432,h2:5433/kip98?target_session_attrs=read-write"
QUERY = (
    "postgresql+psycopg://u:p%40ss@/kip98?host=h1:5432&host=h2:5433&target_session_attrs=read-write"
)


@pytest.mark.parametrize("url", [AUTHORITY, QUERY])
def test_both_spellings_read_the_same(url: str) -> None:
    parsed = urls.parse(url)
    assert parsed.hosts == (("h1", 5432), ("h2", 5433))
    assert (parsed.username, parsed.password, parsed.database) == ("u", "p@ss", "kip98")
    assert parsed.target_session_attrs == "read-write"


@pytest.mark.parametrize("url", [AUTHORITY, QUERY])
def test_the_engine_gets_every_host(url: str) -> None:
    """What SQLAlchemy's psycopg dialect hands libpq: both hosts, both ports, the target."""
    dialect = psycopg_dialect.dialect()
    _, params = dialect.create_connect_args(make_url(urls.sqlalchemy_url(url)))
    assert params["host"] == "h1,h2"
    assert params["port"] == "5432,5433"
    assert params["target_session_attrs"] == "read-write"


def test_libpq_gets_every_host() -> None:
    info = psycopg.conninfo.conninfo_to_dict(urls.libpq_conninfo(AUTHORITY, dbname="postgres"))
    assert info == {
        "host": "h1,h2",
        "port": "5432,5433",
        "user": "u",
        "password": "p@ss",
        "dbname": "postgres",
        "target_session_attrs": "read-write",
    }


def test_jdbc_gets_every_host_and_the_primary_as_its_target() -> None:
    url, props = jdbc_url(AUTHORITY)
    assert url == "jdbc:postgresql://h1:5432,h2:5433/kip98?targetServerType=primary"
    assert props == {"driver": DRIVER, "user": "u", "password": "p@ss"}
    standby, _ = jdbc_url(urls.with_target(AUTHORITY, "standby"))
    assert standby.endswith("?targetServerType=secondary")


def test_one_host_stays_as_it_was() -> None:
    url = "postgresql+psycopg://kip98@127.0.0.1:6000/kip98"
    assert urls.sqlalchemy_url(url) == url
    assert urls.parse(url).render() == url


def test_rendered_for_people_in_the_authority_and_read_back() -> None:
    parsed = urls.parse(QUERY)
    assert parsed.render() == AUTHORITY
    assert urls.parse(parsed.render()) == parsed
    assert urls.safe(AUTHORITY) == AUTHORITY.replace("p%40ss", "***")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("postgresql+psycopg://u@h1:5432,:5433/db", "an empty host"),
        ("postgresql+psycopg://u@h1:5432,h2:x/db", "not a port"),
    ],
)
def test_a_bad_host_list_is_refused(url: str, why: str) -> None:
    with pytest.raises(urls.DatabaseUrlError, match=why):
        urls.parse(url)


@pytest.mark.parametrize(
    ("names", "commit", "required"),
    [
        ("", "on", 0),
        ("ANY 2 (a, b, c)", "on", 2),
        ("any 1 (a, b)", "remote_apply", 1),
        ("FIRST 2 (a, b)", "on", 2),
        ("3 (a, b, c)", "on", 3),
        ("a, b", "on", 1),
        ("*", "remote_write", 1),
        ("ANY 1 (a, b)", "local", 0),
        ("ANY 1 (a, b)", "off", 0),
    ],
)
def test_the_standbys_a_commit_waits_for(names: str, commit: str, required: int) -> None:
    assert required_standbys(names, commit) == required
