"""The schema on PostgreSQL: no index another one already covers (each is one more write for
every row ingest touches), and every table ingest writes keyed by project, so it can be
distributed by project (Citus) as it is."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from costboard.models import PeriodBudget
from tests.conftest import Agent

# Both read PostgreSQL's catalog; CI runs them on PostgreSQL (SQLite is never distributed).
on_postgres = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="reads PostgreSQL's catalog"
)

INGEST_TABLES = {
    "costboard_session",
    "costboard_turn",
    "costboard_step",
    "costboard_sessionmodelusage",
    "costboard_dailyrollup",
    "costboard_userdailyrollup",
    "costboard_tagdailyrollup",
    "costboard_latencyrollup",
    "costboard_ingesttally",
    "costboard_periodledger",
}


def btree_indexes() -> dict[str, list[tuple[str, list[str], bool, bool]]]:
    """Per table: (name, key columns in order, unique, partial) of each plain btree index."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT t.relname, i.relname, ix.indisunique, ix.indpred IS NOT NULL,
                   array(SELECT a.attname FROM unnest(ix.indkey[0:ix.indnkeyatts - 1])
                         WITH ORDINALITY AS k(attnum, n)
                         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
                         ORDER BY k.n)
            FROM pg_index ix
            JOIN pg_class i ON i.oid = ix.indexrelid
            JOIN pg_class t ON t.oid = ix.indrelid
            JOIN pg_am am ON am.oid = i.relam
            WHERE am.amname = 'btree' AND t.relname = ANY(%s) AND ix.indexprs IS NULL
            """,
            [sorted(INGEST_TABLES)],
        )
        found: dict[str, list[tuple[str, list[str], bool, bool]]] = {}
        for table, name, unique, partial, columns in cursor.fetchall():
            found.setdefault(table, []).append((name, list(columns), unique, partial))
    return found


@on_postgres
@pytest.mark.django_db
def test_no_ingest_index_is_a_prefix_of_another() -> None:
    found = btree_indexes()
    assert {"costboard_session", "costboard_turn", "costboard_step"} <= set(found)
    covered = []
    for table, indexes in found.items():
        for name, columns, unique, partial in indexes:
            if unique or partial:
                continue  # a unique key or a partial index does work a wider one cannot
            for other, other_columns, _, other_partial in indexes:
                if (
                    other != name
                    and not other_partial
                    and len(other_columns) > len(columns)
                    and other_columns[: len(columns)] == columns
                ):
                    covered.append(f"{table}.{name} {columns} is covered by {other}")
    assert not covered, "\n".join(covered)


# --- Citus-ready: every table ingest writes is distributable by project ---------------------

# Not distributed (docs/operations.md, "Scaling out"): the outbox is a queue the coordinator keeps
# (an item's project may be null); API keys are found by their hash before the project is known, so
# they are a reference table (ingest writes a key's last use at most once a minute).
NOT_DISTRIBUTED = {"costboard_outboxitem", "costboard_apikey"}
WRITE = re.compile(r"^\s*(?:WITH .*?\)\s*)?(?:INSERT INTO|UPDATE)\s+\"?(\w+)\"?", re.S | re.I)


def tables_a_batch_writes(agent: Agent) -> set[str]:
    """Post a batch that writes everything ingest can: a session with a user and tags, a turn
    with text, priced steps past a stop-budget and the session's cap (budget events), under an
    Idempotency-Key; the tables its INSERTs and UPDATEs named."""
    PeriodBudget.objects.create(
        project=agent.project, name="month", token_limit=50, action="stop", period="month"
    )
    written: set[str] = set()

    def record(execute, sql, params, many, context):
        for statement in sql.split(";"):
            if match := WRITE.match(statement):
                written.add(match.group(1))
        return execute(sql, params, many, context)

    events = [
        {"type": "session", "session_id": "s", "user_id": "u", "tags": {"team": "a"}},
        {"type": "session", "session_id": "s", "token_cap": 100, "event_id": "cap"},
        {"type": "turn", "session_id": "s", "turn": 1, "user_message": "remember I like tea"},
        *[
            {
                "event_id": f"e{n}",
                "session_id": "s",
                "turn": 1,
                "step_type": "response",
                "model": "test-sonnet",
                "input_tokens": 40,
                "duration_ms": 900,
            }
            for n in range(3)
        ],
    ]
    with connection.execute_wrapper(record):
        # the header's hyphen keeps it from being a keyword, so it cannot be post()'s `raw`
        response = agent.post({"events": events}, **{"Idempotency-Key": "k1"})  # type: ignore[arg-type]
    assert response.status_code == 200, response.content
    assert response.json()["sessions"]["s"]["state"] == "exhausted"
    return written


def keys_of(tables: set[str]) -> dict[str, dict[str, Any]]:
    """Per table: its primary key's columns, each unique index's columns, and each foreign
    key constraint's columns and referenced table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT t.relname, c.contype, c.confrelid::regclass::text,
                   array(SELECT a.attname FROM unnest(c.conkey) AS k(n)
                         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.n)
            FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
            WHERE t.relname = ANY(%s) AND c.contype IN ('p', 'f')
            """,
            [sorted(tables)],
        )
        keys: dict[str, dict[str, Any]] = {
            t: {"primary": None, "unique": {}, "fk": []} for t in tables
        }
        for table, kind, referenced, columns in cursor.fetchall():
            if kind == "p":
                keys[table]["primary"] = set(columns)
            else:
                keys[table]["fk"].append((set(columns), referenced))
    for table, indexes in btree_indexes().items():
        for name, columns, unique, _ in indexes:
            if unique and table in keys:
                keys[table]["unique"][name] = set(columns)
    return keys


@on_postgres
@pytest.mark.django_db
def test_every_table_a_batch_writes_carries_the_project_in_its_keys(
    agent: Agent, priced: object
) -> None:
    written = tables_a_batch_writes(agent) - NOT_DISTRIBUTED
    assert {
        "costboard_eventreceipt",
        "costboard_latencyrollup",
        "costboard_sessionmodelusage",
        "costboard_session",
        "costboard_step",
        "costboard_periodledger",
        "costboard_budgetevent",
        "costboard_idempotentrequest",
    } <= written
    problems = []
    for table, keys in keys_of(written).items():
        if keys["primary"] is None or "project_id" not in keys["primary"]:
            problems.append(f"{table}: primary key {keys['primary']} lacks project_id")
        for name, columns in keys["unique"].items():
            if "project_id" not in columns:
                problems.append(f"{table}: unique {name} {sorted(columns)} lacks project_id")
        for columns, referenced in keys["fk"]:
            # a reference table (the projects) may be pointed at; another distributed table
            # only with the project in the key, which no constraint here does
            if referenced != "costboard_project":
                problems.append(f"{table}: foreign key {sorted(columns)} → {referenced}")
    assert not problems, "\n".join(problems)
