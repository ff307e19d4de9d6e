"""Behind PgBouncer in transaction mode (docs/operations.md, "Connection pooler"): what the
settings turn off, and that Costboard's own SQL keeps nothing on a connection past its
transaction. The ingest, budget and page tests themselves run through a real PgBouncer in
.ci/run's PgBouncer leg (COSTBOARD_TEST_PGBOUNCER=1, tests/conftest.py)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.servers import PgBouncer

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "costboard", ROOT / "memory_ui"]


def settings_of(**env: str) -> dict[str, Any]:
    """DATABASES["default"] as a fresh process reads it from this environment."""
    code = (
        "import json; from django.conf import settings; "
        "print(json.dumps(settings.DATABASES['default'], default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "costboard.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    database: dict[str, Any] = json.loads(result.stdout)
    return database


def startup_error(**env: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "costboard.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    return result.stderr


@pytest.mark.slow
def test_behind_pgbouncer_nothing_is_kept_on_a_server_connection() -> None:
    url = "postgres://costboard@10.0.0.5:6432/costboard"  # never connected to: settings only
    direct = settings_of(DATABASE_URL=url, COSTBOARD_DB_POOLER="")
    # connected directly, psycopg prepares a statement once it has run five times
    assert direct["OPTIONS"] == {"options": "-c random_page_cost=1.1", "prepare_threshold": 5}
    assert "DISABLE_SERVER_SIDE_CURSORS" not in direct or not direct["DISABLE_SERVER_SIDE_CURSORS"]

    pooled = settings_of(DATABASE_URL=url, COSTBOARD_DB_POOLER="pgbouncer")
    # no prepared statements, no `options` startup parameter (PgBouncer refuses it), no
    # server-side cursors; persistent, checked connections to PgBouncer as before
    assert pooled["OPTIONS"] == {"prepare_threshold": None}
    assert pooled["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert (pooled["CONN_MAX_AGE"], pooled["CONN_HEALTH_CHECKS"]) == (None, True)
    assert (pooled["HOST"], pooled["PORT"]) == ("10.0.0.5", 6432)


@pytest.mark.slow
def test_a_url_s_own_options_are_kept_behind_a_pooler_that_accepts_them() -> None:
    url = "postgres://costboard@10.0.0.5:6432/costboard?options=-c%20search_path%3Dcb"
    pooled = settings_of(DATABASE_URL=url, COSTBOARD_DB_POOLER="PgBouncer")
    assert pooled["OPTIONS"] == {"options": "-c search_path=cb", "prepare_threshold": None}


@pytest.mark.slow
def test_an_unknown_pooler_stops_startup_naming_the_variable_and_the_fix() -> None:
    error = startup_error(COSTBOARD_DB_POOLER="pgpool")
    assert "COSTBOARD_DB_POOLER='pgpool'" in error
    assert "use pgbouncer" in error


@pytest.mark.slow
def test_pgbouncer_without_postgresql_stops_startup() -> None:
    error = startup_error(COSTBOARD_DB_POOLER="pgbouncer", DATABASE_URL="")
    assert "COSTBOARD_DB_POOLER=pgbouncer needs PostgreSQL" in error


# --- nothing kept past a transaction: a scan of our SQL ---------------------------------------

# What would outlive its transaction on a server connection that PgBouncer then hands to
# another client: a session SET (SET LOCAL and set_config(…, true) end with the transaction),
# a session advisory lock, LISTEN, a prepared statement, a held cursor, a temporary table.
SESSION_STATE = [
    (re.compile(r"""execute\(\s*[rf]?["']\s*SET\s+(?!LOCAL\b)""", re.I), "SET"),
    (re.compile(r"set_config\([^)]*,\s*(false|%s)\s*\)", re.I), "set_config(…, false)"),
    (re.compile(r"pg_(try_)?advisory_lock(_shared)?\s*\(", re.I), "pg_advisory_lock"),
    (re.compile(r"""["']\s*(LISTEN|PREPARE|DECLARE)\s""", re.I), "LISTEN/PREPARE/DECLARE"),
    (re.compile(r"WITH\s+HOLD", re.I), "WITH HOLD"),
    (re.compile(r"CREATE\s+(TEMP|TEMPORARY)\s+TABLE(?![^\"']*ON\s+COMMIT\s+DROP)", re.I), "TEMP"),
    (re.compile(r"prepare\s*=\s*True"), "prepare=True"),
]


def session_state_in(text: str) -> list[str]:
    return [name for pattern, name in SESSION_STATE if pattern.search(text)]


def without_comments(source: str) -> list[str]:
    """The lines of `source`, comments blanked (they may say what the code avoids)."""
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column]
    return lines


def test_the_scan_finds_each_kind_of_session_state() -> None:
    """The scan below can fail: each pattern catches what it is for, and passes its
    transaction-scoped spelling."""
    assert session_state_in('cursor.execute("SET statement_timeout = 100")') == ["SET"]
    assert session_state_in("cursor.execute(f'SET SESSION work_mem TO {mem}')") == ["SET"]
    assert session_state_in("\"SELECT set_config('enable_sort', 'off', false)\"") == [
        "set_config(…, false)"
    ]
    assert session_state_in('"SELECT pg_advisory_lock(%s)"') == ["pg_advisory_lock"]
    assert session_state_in('"LISTEN costboard"') == ["LISTEN/PREPARE/DECLARE"]
    assert session_state_in('"CREATE TEMP TABLE t (id int)"') == ["TEMP"]
    assert session_state_in("cur.execute(sql, prepare=True)") == ["prepare=True"]
    fine = [
        "cursor.execute(\"SET LOCAL work_mem = '1GB'\")",
        "\"SELECT set_config('enable_sort', 'off', true)\"",
        '"SELECT pg_advisory_xact_lock(%s)"',
        '"UPDATE t SET tokens = tokens + 1"',
        'f"ON CONFLICT (id) DO UPDATE SET {sums}"',
        '"CREATE TEMP TABLE t (id int) ON COMMIT DROP"',
    ]
    assert [session_state_in(text) for text in fine] == [[]] * len(fine)
    assert without_comments("x = 1  # no WITH HOLD cursor\n") == ["x = 1  "]


def test_no_sql_of_ours_keeps_state_on_its_connection_past_the_transaction() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {kind}: {line.strip()}"
        for source in SOURCES
        for path in sorted(source.rglob("*.py"))
        if "migrations" not in path.parts
        for number, line in enumerate(without_comments(path.read_text()), start=1)
        for kind in session_state_in(line)
    ]
    assert found == []


# --- a real PgBouncer ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="PgBouncer stands in front of PostgreSQL (the PostgreSQL run has it)",
)
def test_pgbouncer_in_transaction_mode_hands_each_transaction_any_server_connection() -> None:
    """Why the settings above: through the PgBouncer the tests use, a session SET made by one
    client reaches another client's transactions, and SET LOCAL does not."""
    db = connection.settings_dict
    bouncer = PgBouncer(host=db["HOST"], port=int(db["PORT"] or 5432), user=db["USER"]).start()
    conninfo = {
        "host": "127.0.0.1",
        "port": bouncer.port,
        "user": db["USER"],
        "dbname": db["NAME"],
        "prepare_threshold": None,
        "autocommit": True,
    }
    try:
        with psycopg.connect(**conninfo) as first, psycopg.connect(**conninfo) as second:
            default = second.execute("SHOW work_mem").fetchone()
            first.execute("SET work_mem = '7MB'")  # a session SET: left on the server
            assert second.execute("SHOW work_mem").fetchone() == ("7MB",)  # one server conn
            first.execute("RESET work_mem")
            with first.transaction():
                first.execute("SET LOCAL work_mem = '9MB'")
                assert first.execute("SHOW work_mem").fetchone() == ("9MB",)
            assert second.execute("SHOW work_mem").fetchone() == default
    finally:
        bouncer.stop()
