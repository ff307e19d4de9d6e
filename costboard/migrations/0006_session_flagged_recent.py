# The overview's flagged panel and the sessions list's state=flagged read only flagged sessions
# instead of scanning every session.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costboard', '0005_turn_project'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='session',
            index=models.Index(condition=models.Q(('state__in', ['warning', 'exhausted']), ('runaway_at__isnull', False), _connector='OR'), fields=['project', '-last_active_at'], include=('ended_at',), name='session_flagged_recent'),
        ),
    ]
