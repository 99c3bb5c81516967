"""``kip98`` through its installed entry point: exit codes, output formats, error lines."""

from __future__ import annotations

import json
import os

import pytest
from sqlalchemy.engine import make_url

from tests.helpers.cli_runner import run_kip98

UNREACHABLE = "postgresql+psycopg://nobody@127.0.0.1:1/x"


def _assert_one_line_error(stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr


@pytest.fixture
def embedded_env(server_url: str) -> dict[str, str]:
    """Environment for commands about the session's embedded server."""
    if os.environ.get("KIP98_DATABASE_URL"):
        pytest.skip("the suite runs against an external server")
    return {}


def test_help_lists_groups() -> None:
    result = run_kip98("--help")
    assert result.returncode == 0
    assert "db" in result.stdout
    assert "demo" in result.stdout


def test_status_json_describes_the_running_server(
    server_url: str, embedded_env: dict[str, str]
) -> None:
    result = run_kip98("db", "status", "--output", "json", env=embedded_env)
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["running"] is True
    assert isinstance(status["pid"], int)
    assert status["port"] == make_url(server_url).port
    assert status["url"] == server_url


def test_status_table(embedded_env: dict[str, str]) -> None:
    result = run_kip98("db", "status", env=embedded_env)
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.strip().splitlines()
    assert header.split()[:3] == ["RUNNING", "PID", "PORT"]
    assert row.split()[0] == "True"


def test_bad_output_format_is_a_usage_error() -> None:
    result = run_kip98("db", "status", "--output", "xml")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_start_when_running_is_a_no_op(server_url: str, embedded_env: dict[str, str]) -> None:
    before = json.loads(run_kip98("db", "status", "-o", "json").stdout)
    result = run_kip98("db", "start", env=embedded_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(server_url)
    after = json.loads(run_kip98("db", "status", "-o", "json").stdout)
    assert before["pid"] == after["pid"]


def test_url_prints_the_configured_database(db_url: str) -> None:
    result = run_kip98("db", "url")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == db_url
    assert result.stdout.startswith("postgresql")


def test_url_of_the_embedded_server(server_url: str, embedded_env: dict[str, str]) -> None:
    result = run_kip98("db", "url", env=embedded_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == server_url


def test_migrate_is_idempotent(db_url: str) -> None:
    for _ in range(2):
        result = run_kip98("db", "migrate")
        assert result.returncode == 0, result.stderr
        assert "schema at revision" in result.stdout
        assert "Traceback" not in result.stderr


def test_migrate_unreachable_database_fails_in_one_line() -> None:
    result = run_kip98("db", "migrate", env={"KIP98_DATABASE_URL": UNREACHABLE})
    assert result.returncode != 0
    _assert_one_line_error(result.stderr)
    assert "database" in result.stderr


def test_url_with_bad_driver_fails_in_one_line() -> None:
    result = run_kip98("demo", env={"KIP98_DATABASE_URL": "nosuchdb://x/y"})
    assert result.returncode != 0
    _assert_one_line_error(result.stderr)


def test_rebuild_succeeds_or_fails_in_one_line(db_url: str) -> None:
    result = run_kip98("db", "rebuild")
    if result.returncode != 0:
        _assert_one_line_error(result.stderr)
    else:
        assert "rebuilt" in result.stdout


def test_demo_names_the_database(db_url: str) -> None:
    result = run_kip98("demo", "--records", "200", "--no-spark")
    assert result.returncode == 0, result.stderr
    assert "summary: OK" in result.stdout
    assert make_url(db_url).render_as_string(hide_password=True) in result.stdout
    # Again: the topics are made anew, and the group's offsets of the old ones went with
    # them, so the copy starts from the new input's beginning.
    again = run_kip98("demo", "--records", "200", "--no-spark")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "summary: OK" in again.stdout


def test_url_libpq_names_every_host_without_the_driver() -> None:
    given = (
        "postgresql+psycopg://app:s3cret@db1:5432,db2:5433/kip98?target_session_attrs=read-write"
    )
    result = run_kip98("db", "url", "--libpq", env={"KIP98_DATABASE_URL": given})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "postgresql://app:s3cret@db1:5432,db2:5433/kip98?target_session_attrs=read-write"
    )
    one = run_kip98("db", "url", "--libpq", env={"KIP98_DATABASE_URL": UNREACHABLE})
    assert one.stdout.strip() == "postgresql://nobody@127.0.0.1:1/x"


def test_psql_runs_on_the_database_with_its_arguments(db_url: str) -> None:
    """kip98 db psql execs psql on kip98 db url --libpq, arguments passed through."""
    libpq = run_kip98("db", "url", "--libpq")
    assert libpq.returncode == 0 and "+psycopg" not in libpq.stdout
    result = run_kip98(
        "db", "psql", "-At", "-c", "select current_database(), count(*) from partitions"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{make_url(db_url).database}|0"
    failed = run_kip98("db", "psql", "-v", "ON_ERROR_STOP=1", "-c", "select * from no_such_table")
    assert failed.returncode != 0 and "no_such_table" in failed.stderr


def test_psql_not_installed_is_one_line(db_url: str) -> None:
    result = run_kip98("db", "psql", "-c", "select 1", env={"PATH": "/nonexistent"})
    assert result.returncode == 1
    _assert_one_line_error(result.stderr)
    assert "psql is not installed" in result.stderr
