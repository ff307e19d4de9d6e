"""Step receipts: a step's event_id once per project, in whatever month partition the step is.

Backfilled from the steps kept: each (project, event_id) once, with its earliest step's
timestamp (where a replay in another month was stored twice before, the receipt is the
first's; the steps themselves are left as they are).
"""

import django.db.models.deletion
from django.db import migrations, models


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    step = apps.get_model("costboard", "Step")._meta.db_table
    receipt = apps.get_model("costboard", "StepReceipt")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {receipt} (project_id, event_id, timestamp)
            SELECT project_id, event_id, MIN(timestamp) FROM {step}
            WHERE event_id IS NOT NULL GROUP BY project_id, event_id
            """
        )


class Migration(migrations.Migration):
    dependencies = [
        ("costboard", "0027_session_recent_covers_user_and_id"),
    ]

    operations = [
        migrations.CreateModel(
            name="StepReceipt",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "project_id",
                        "event_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("event_id", models.CharField(max_length=128)),
                ("timestamp", models.DateTimeField()),
                (
                    "project",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="costboard.project",
                    ),
                ),
            ],
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
