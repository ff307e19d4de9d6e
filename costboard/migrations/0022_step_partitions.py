"""On PostgreSQL the step table becomes partitioned by month of its timestamp (UTC), with a
DEFAULT partition as a safety net; today's rows are carried across. SQLite keeps the plain
table, and Django's model state is unchanged (only RunPython here), so the models need no new
migration.

- `id` keeps counting from where it was: a sequence OWNED BY the new column (PostgreSQL 15
  has no identity columns on partitioned tables), so pg_get_serial_sequence, Django's
  sequence reset and flush keep working. The primary key is (id, project_id, timestamp): a
  partitioned table's unique keys must hold its partition key (and, from 0021, the project).
- The model's unique constraint `step_event_id` (project, event_id) cannot live on the
  parent for the same reason; each partition has its own partial unique index
  `<partition>_event_id`, so a replayed event_id is a duplicate within its month.
- One partition `costboard_step_pYYYYMM` per month present in the data; the rest are made
  by costboard/partitions.py (the sweep makes them ahead, ingest makes a missing one).

Backward: a plain table again, the rows carried back. An event_id stored twice in two months
(possible only while partitioned) keeps its oldest step's key; the others lose their
event_id rather than their row, so every total stays.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import migrations

TABLE = "costboard_step"
OLD = "costboard_step_unpartitioned"
DEFAULT = "costboard_step_default"
TURN_INDEX = "costboard_step_turn_id_22432aa7"  # Django's name for the turn FK's index

# the parent's indexes: the same names and columns as before (run without parameters, so
# the % is literal)
INDEXES = [
    f'CREATE INDEX step_session_time ON {TABLE} (session_id, "timestamp")',
    f'CREATE INDEX step_model_time ON {TABLE} (project_id, model, "timestamp")',
    f"CREATE INDEX {TURN_INDEX} ON {TABLE} (turn_id)",
    f"CREATE INDEX step_otlp_event ON {TABLE} "
    "(project_id, event_id varchar_pattern_ops) WHERE event_id LIKE 'otlp:%'",
]
PLAIN_INDEX_NAMES = ["step_session_time", "step_model_time", TURN_INDEX, "step_otlp_event"]


def _event_id_index(partition: str) -> str:
    return (
        f"CREATE UNIQUE INDEX {partition}_event_id ON {partition} (project_id, event_id) "
        "WHERE event_id IS NOT NULL"
    )


def _next_month(month: datetime) -> datetime:
    return month.replace(year=month.year + month.month // 12, month=month.month % 12 + 1)


def _literal(month: datetime) -> str:
    """A partition bound as SQL text (DDL takes no parameters): midnight UTC."""
    return f"'{month:%Y-%m-%d} 00:00:00+00'"


def _sequence_state(cursor: Any, table: str) -> tuple[int, bool]:
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    [sequence] = cursor.fetchone()
    cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
    last_value, is_called = cursor.fetchone()
    return int(last_value), bool(is_called)


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        last_value, is_called = _sequence_state(cursor, TABLE)
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
        cursor.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT {TABLE}_pkey TO {OLD}_pkey")
        cursor.execute(f"ALTER TABLE {OLD} ALTER COLUMN id DROP IDENTITY")  # frees the name
        for name in [*PLAIN_INDEX_NAMES, "step_event_id"]:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")

        # the same columns in the same order, with their defaults and NOT NULLs
        cursor.execute(
            f'CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS) PARTITION BY RANGE ("timestamp")'
        )
        cursor.execute(f"CREATE SEQUENCE {TABLE}_id_seq OWNED BY {TABLE}.id")
        cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT nextval('{TABLE}_id_seq')")
        cursor.execute(
            f'ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, project_id, "timestamp")'
        )
        for index in INDEXES:
            cursor.execute(index)
        cursor.execute(f"CREATE TABLE {DEFAULT} PARTITION OF {TABLE} DEFAULT")
        cursor.execute(_event_id_index(DEFAULT))

        cursor.execute(
            f"SELECT DISTINCT date_trunc('month', \"timestamp\" AT TIME ZONE 'UTC') FROM {OLD}"
        )
        for (naive,) in sorted(cursor.fetchall()):
            month = naive.replace(tzinfo=UTC)
            partition = f"{TABLE}_p{month:%Y%m}"
            cursor.execute(
                f"CREATE TABLE {partition} PARTITION OF {TABLE} "
                f"FOR VALUES FROM ({_literal(month)}) TO ({_literal(_next_month(month))})"
            )
            cursor.execute(_event_id_index(partition))

        cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {OLD}")
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)",
            [TABLE, last_value, is_called],
        )
        cursor.execute(f"DROP TABLE {OLD}")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
        last_value, is_called = _sequence_state(cursor, TABLE)
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {OLD}")
        cursor.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT {TABLE}_pkey TO {OLD}_pkey")
        cursor.execute(f"ALTER TABLE {OLD} ALTER COLUMN id DROP DEFAULT")
        cursor.execute(f"DROP SEQUENCE {TABLE}_id_seq")
        for name in PLAIN_INDEX_NAMES:  # partitioned indexes: their partitions' go with them
            cursor.execute(f"DROP INDEX {name}")

        cursor.execute(f"CREATE TABLE {TABLE} (LIKE {OLD} INCLUDING DEFAULTS)")
        cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY")
        cursor.execute(f"INSERT INTO {TABLE} SELECT * FROM {OLD}")
        # an event_id stored in two months: the oldest step keeps it, the others' is cleared
        cursor.execute(
            f"""
            UPDATE {TABLE} s SET event_id = NULL
            FROM (
                SELECT id, row_number() OVER (PARTITION BY project_id, event_id ORDER BY id) AS n
                FROM {TABLE} WHERE event_id IS NOT NULL
            ) d
            WHERE s.id = d.id AND d.n > 1
            """
        )
        cursor.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (id, project_id)")
        for index in INDEXES:
            cursor.execute(index)
        cursor.execute(
            f"CREATE UNIQUE INDEX step_event_id ON {TABLE} (project_id, event_id) "
            "WHERE event_id IS NOT NULL"
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, %s)",
            [TABLE, last_value, is_called],
        )
        cursor.execute(f"DROP TABLE {OLD}")


class Migration(migrations.Migration):
    dependencies = [("costboard", "0021_project_in_ingest_keys")]

    operations = [migrations.RunPython(forwards, backwards)]
