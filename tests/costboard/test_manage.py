"""`manage.py` when what a command needs is not there
(docs/operations.md, "Commands when the database is down"): a database that does not answer,
or a setting start-up refuses, is one line on stderr naming what to fix, and exit status 1 —
not a Python traceback, which buries that line under forty others. `--traceback` still shows
the traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [
    ["costboard_status"],
    ["sync_prices"],
    ["create_api_key", "acme"],
    ["ensure_admin"],
    ["guard_sweep"],
    ["spend_report", "--period", "week"],
    ["migrate"],
]


def closed_port() -> int:
    """A port nothing listens on: bound, then let go."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def manage(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    given = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**given, "DJANGO_SETTINGS_MODULE": "costboard.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("args", COMMANDS, ids=[args[0] for args in COMMANDS])
def test_a_database_that_refuses_is_one_line_naming_database_url(args: list[str]) -> None:
    port = closed_port()
    url = f"postgres://costboard:s3cret-pw@127.0.0.1:{port}/costboard"
    result = manage(args, DATABASE_URL=url)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        f"manage.py {args[0]}: the database does not answer (connection failed: connection "
        f'to server at "127.0.0.1", port {port} failed: Connection refused'
    )
    assert result.stderr.endswith(
        ": start PostgreSQL, or set DATABASE_URL to one that answers (now "
        f"'postgres://costboard:***@127.0.0.1:{port}/costboard').\n"
    )
    assert "s3cret-pw" not in result.stderr


@pytest.mark.slow
def test_a_sqlite_file_that_cannot_be_opened_is_one_line_naming_database_url(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/no-such-directory/costboard.sqlite3"
    result = manage(["costboard_status"], DATABASE_URL=url)
    assert result.returncode == 1
    assert result.stderr == (
        "manage.py costboard_status: the database does not answer (unable to open database "
        "file): make the SQLite file's directory exist and be writable, or set DATABASE_URL "
        f"to a database that answers (now '{url}').\n"
    )


@pytest.mark.slow
def test_traceback_still_shows_the_traceback() -> None:
    url = f"postgres://costboard@127.0.0.1:{closed_port()}/costboard"
    result = manage(["costboard_status", "--traceback"], DATABASE_URL=url)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "OperationalError" in result.stderr


@pytest.mark.slow
def test_a_setting_start_up_refuses_is_one_line() -> None:
    result = manage(["costboard_status"], COSTBOARD_REPLICA_TIMEOUT_S="soon")
    assert result.returncode == 1
    assert result.stderr == (
        "manage.py costboard_status: ImproperlyConfigured: COSTBOARD_REPLICA_TIMEOUT_S='soon' "
        "is not a decimal number; use e.g. 5.\n"
    )


@pytest.mark.slow
def test_a_database_not_yet_migrated_is_one_line_saying_to_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/empty.sqlite3"
    result = manage(["costboard_status"], DATABASE_URL=url)
    assert result.returncode == 1
    assert result.stderr == (
        "manage.py costboard_status: the database has no table costboard_session: run "
        f"`python manage.py migrate` first (DATABASE_URL now '{url}').\n"
    )


@pytest.mark.slow
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the PostgreSQL run's server; CI runs it there"
)
def test_a_postgres_database_not_yet_migrated_is_one_line_saying_to_migrate() -> None:
    """On the PostgreSQL run, the server's own `postgres` database: it has none of our tables
    (the command only reads)."""
    url = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
    result = manage(["costboard_status"], DATABASE_URL=url)
    assert result.returncode == 1
    assert result.stderr == (
        "manage.py costboard_status: the database has no table costboard_session: run "
        f"`python manage.py migrate` first (DATABASE_URL now '{url}').\n"
    )
