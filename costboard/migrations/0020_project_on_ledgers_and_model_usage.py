"""The project copied onto the three ingest tables that lacked it (a session's model mix, a
period budget's ledgers and days), filled from their session or budget: the distribution
column every ingest table carries (0021 makes it part of their keys)."""

import django.db.models.deletion
from django.db import migrations, models

FILL = [
    (
        "UPDATE costboard_sessionmodelusage SET project_id = (SELECT s.project_id FROM "
        "costboard_session s WHERE s.id = costboard_sessionmodelusage.session_id)"
    ),
    (
        "UPDATE costboard_periodledger SET project_id = (SELECT b.project_id FROM "
        "costboard_periodbudget b WHERE b.id = costboard_periodledger.budget_id)"
    ),
    (
        "UPDATE costboard_budgetday SET project_id = (SELECT b.project_id FROM "
        "costboard_periodbudget b WHERE b.id = costboard_budgetday.budget_id)"
    ),
]


def project_field() -> models.ForeignKey:
    # no constraint yet: 0021 adds it (an update and an ALTER of one table with a deferred
    # constraint in one transaction is refused by PostgreSQL)
    return models.ForeignKey(
        null=True,
        db_index=False,
        db_constraint=False,
        on_delete=django.db.models.deletion.CASCADE,
        related_name="+",
        to="costboard.project",
    )


class Migration(migrations.Migration):
    dependencies = [("costboard", "0019_drop_covered_fk_indexes")]

    operations = [
        migrations.AddField("sessionmodelusage", "project", project_field()),
        migrations.AddField("periodledger", "project", project_field()),
        migrations.AddField("budgetday", "project", project_field()),
        *[migrations.RunSQL(sql, reverse_sql=migrations.RunSQL.noop) for sql in FILL],
    ]
