# A turn's project, copied from its session, so a period's turns of some projects are read
# from one covering index (the steps page's cost-per-turn distribution).

import django.db.models.deletion
from django.db import migrations, models

BACKFILL = """
UPDATE costboard_turn SET project_id = (
    SELECT s.project_id FROM costboard_session s WHERE s.id = costboard_turn.session_id
)
"""


class Migration(migrations.Migration):

    dependencies = [
        ('costboard', '0004_step_unconstrained_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='turn',
            name='project',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='costboard.project'),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='turn',
            name='project',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='costboard.project'),
        ),
        migrations.AddIndex(
            model_name='turn',
            index=models.Index(fields=['project', 'started_at'], include=('cost_usd',), name='turn_project_time'),
        ),
    ]
