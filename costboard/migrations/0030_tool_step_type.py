"""One step type for tool calls: OTLP's `execute_tool` steps, stored as sent until now, become
`tool`, the type the events API and the client send (docs/integrations.md, "OpenTelemetry").

Steps keep the name as sent: in `metadata.otlp.operation` for a step that came over OTLP,
in `metadata.step_type_sent` for any other. On PostgreSQL the step table is partitioned by
month; the UPDATE goes through the parent (the partition key, `timestamp`, is untouched).

Daily and latency rollups (kept after retention deletes steps) are moved with their steps:
an `execute_tool` row whose `tool` twin exists is added into it and deleted, else renamed.
Backward is a no-op: merged rollups cannot be split again.
"""

from django.db import migrations
from django.db.models import F

OLD, NEW = "execute_tool", "tool"

POSTGRESQL = """
UPDATE {table} SET step_type = %s, metadata = CASE
    WHEN jsonb_typeof(metadata -> 'otlp') = 'object'
        THEN jsonb_set(metadata, '{{otlp,operation}}', to_jsonb(%s::text))
    ELSE COALESCE(NULLIF(metadata, 'null'::jsonb), '{{}}'::jsonb)
        || jsonb_build_object('step_type_sent', %s::text)
    END
WHERE step_type = %s
"""
SQLITE = """
UPDATE {table} SET step_type = %s, metadata = CASE
    WHEN json_type(metadata, '$.otlp') = 'object'
        THEN json_set(metadata, '$.otlp.operation', %s)
    ELSE json_set(
        CASE WHEN metadata IS NULL OR json_type(metadata) = 'null' THEN '{{}}' ELSE metadata END,
        '$.step_type_sent', %s)
    END
WHERE step_type = %s
"""
ROLLUP_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "cost_input_usd",
    "cost_output_usd",
    "cost_cache_read_usd",
    "cost_cache_write_usd",
    "cost_usd",
    "calls",
    "errors",
    "unpriced_calls",
    "duration_ms",
)


def _steps_retype(apps, schema_editor):
    Step = apps.get_model("costboard", "Step")
    connection = schema_editor.connection
    sql = POSTGRESQL if connection.vendor == "postgresql" else SQLITE
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=Step._meta.db_table), [NEW, OLD, OLD, OLD])


def _rollups_move(model, key_fields, counters):
    """Each OLD row added into its NEW twin (then deleted), or renamed when it has none."""
    for row in model.objects.filter(step_type=OLD).order_by("pk").iterator():
        key = {name: getattr(row, name) for name in key_fields}
        added = model.objects.filter(**key, step_type=NEW).update(
            **{name: F(name) + getattr(row, name) for name in counters}
        )
        if added:
            row.delete()
        else:
            model.objects.filter(pk=row.pk).update(step_type=NEW)


def forwards(apps, schema_editor):
    _steps_retype(apps, schema_editor)
    _rollups_move(
        apps.get_model("costboard", "DailyRollup"),
        ("project_id", "day", "family", "model"),
        ROLLUP_COUNTERS,
    )
    _rollups_move(
        apps.get_model("costboard", "LatencyRollup"), ("project_id", "day", "bucket"), ("calls",)
    )


class Migration(migrations.Migration):
    dependencies = [("costboard", "0029_period_ledger_member")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
