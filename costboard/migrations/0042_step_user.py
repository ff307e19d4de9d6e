"""A step keeps its session's end user as it arrived: the user its spend was rolled up
under, so a repricing moves that user's figures even after the session's user changed
(docs/pricing.md, "Editing prices and repricing"). Nullable with no default: on PostgreSQL
the partitioned table's new column is metadata only, no row rewritten; the steps stored
before it are NULL (their session's user now is read, as before)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costboard', '0041_period_budget_counts_from_step'),
    ]

    operations = [
        migrations.AddField(
            model_name='step',
            name='user_id',
            field=models.CharField(blank=True, max_length=128, null=True),
        ),
    ]
