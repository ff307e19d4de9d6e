"""Memory's session and turn links without database constraints: sessions and turns are keyed
by (id, project_id) from costboard 0021, which a constraint on id alone could not reference."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("costboard", "0020_project_on_ledgers_and_model_usage"),
        ("memory_ui", "0004_conflicts_supersede"),
    ]

    operations = [
        migrations.AlterField(
            model_name="memory",
            name="session",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="costboard.session",
            ),
        ),
        migrations.AlterField(
            model_name="memory",
            name="turn",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="costboard.turn",
            ),
        ),
    ]
