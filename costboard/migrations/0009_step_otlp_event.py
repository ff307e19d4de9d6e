"""OTLP spans are stored with event_id `otlp:<trace>:<span>`; a span that arrives without its
session finds its trace's earlier steps by that prefix. On PostgreSQL a partial pattern index
over OTLP steps only keeps that lookup off a scan of the project's steps (other steps, the
hot ingest path, are not in it). SQLite: nothing to do."""

from django.db import migrations

CREATE = (
    "CREATE INDEX IF NOT EXISTS step_otlp_event ON costboard_step "
    "(project_id, event_id varchar_pattern_ops) WHERE event_id LIKE 'otlp:%%'"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS step_otlp_event")


class Migration(migrations.Migration):
    dependencies = [("costboard", "0008_runaway_stops")]

    operations = [migrations.RunPython(forwards, backwards)]
