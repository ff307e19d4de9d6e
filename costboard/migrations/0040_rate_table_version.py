"""The rate table's version: one row, counted up by triggers on every change to the prices and
the price adjustments, so each request checks its cached rate table with a key lookup instead
of counting both tables (costboard/pricing/rates.py, `rate_table`).

A table of its own, no model: Django's test flush empties the tables of models, and a version
that went back to an earlier number could match a table cached before. The change and the
count are one transaction: a reader sees the new number once the change is committed.
"""

from typing import Any

from django.db import migrations

TABLE = "costboard_rate_version"
WATCHED = ("costboard_modelprice", "costboard_priceadjustment")


def _forward(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, version bigint NOT NULL)")
        cursor.execute(f"INSERT INTO {TABLE} (id, version) VALUES (1, 1)")
        if postgres:
            # statement-level: one count per statement, whatever the rows (COPY and
            # TRUNCATE included)
            cursor.execute(
                f"""
                CREATE FUNCTION costboard_rate_version_bump() RETURNS trigger
                LANGUAGE plpgsql AS $$
                BEGIN
                    UPDATE {TABLE} SET version = version + 1 WHERE id = 1;
                    RETURN NULL;
                END $$
                """
            )
            for table in WATCHED:
                cursor.execute(
                    f"CREATE TRIGGER {table}_version AFTER INSERT OR UPDATE OR DELETE "
                    f"OR TRUNCATE ON {table} FOR EACH STATEMENT "
                    "EXECUTE FUNCTION costboard_rate_version_bump()"
                )
            return
        # SQLite has row-level triggers only (a flush there is a DELETE, so it counts too)
        for table in WATCHED:
            for event in ("INSERT", "UPDATE", "DELETE"):
                cursor.execute(
                    f"CREATE TRIGGER {table}_version_{event.lower()} AFTER {event} ON {table} "
                    f"BEGIN UPDATE {TABLE} SET version = version + 1 WHERE id = 1; END"
                )


def _backward(apps: Any, schema_editor: Any) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    with schema_editor.connection.cursor() as cursor:
        for table in WATCHED:
            if postgres:
                cursor.execute(f"DROP TRIGGER IF EXISTS {table}_version ON {table}")
            else:
                for event in ("insert", "update", "delete"):
                    cursor.execute(f"DROP TRIGGER IF EXISTS {table}_version_{event}")
        if postgres:
            cursor.execute("DROP FUNCTION IF EXISTS costboard_rate_version_bump()")
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")


class Migration(migrations.Migration):
    dependencies = [("costboard", "0039_warn_fractions_and_rolling_windows")]

    operations = [migrations.RunPython(_forward, _backward)]
