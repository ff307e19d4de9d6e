"""The schema on PostgreSQL: no index another one already covers (each is one more write for
every row ingest touches)."""

from __future__ import annotations

import pytest
from django.db import connection

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


@pytest.mark.django_db
def test_no_ingest_index_is_a_prefix_of_another() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("reads PostgreSQL's catalog; CI runs it on PostgreSQL")
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
