"""Service tiers and negotiated rates (docs/pricing.md).

A step keeps its `service_tier` (standard unless sent); a price row prices one tier (today's
rows: standard), so the series' unique constraints add the tier. On PostgreSQL the step table
is partitioned by month (0022): the column is added to the parent with a database default,
which every partition takes, and no row is rewritten. PriceAdjustment: a percentage off or on
list, per provider, optionally per model family and project, from a day.
"""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costboard', '0031_project_api_max_in_flight'),
    ]

    operations = [
        migrations.CreateModel(
            name='PriceAdjustment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('provider', models.CharField(help_text="The rate table's provider id: openai, anthropic, google, …", max_length=64)),
                ('family', models.CharField(blank=True, help_text='Optional: one model family as pages show it (gpt-4o, claude-sonnet-4-5); blank: every model of the provider.', max_length=200)),
                ('percent', models.DecimalField(decimal_places=4, help_text='Percent on list: -12 for 12 % off, 5 for 5 % on; 0 ends an earlier one.', max_digits=9, validators=[django.core.validators.MinValueValidator(Decimal('-100')), django.core.validators.MaxValueValidator(Decimal('1000'))])),
                ('effective_from', models.DateField(help_text='From this day on (UTC), for steps of then on.')),
                ('note', models.CharField(blank=True, help_text="e.g. the contract's name.", max_length=200)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True, db_index=True)),
            ],
            options={
                'ordering': ['provider', 'family', 'project', 'effective_from'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='modelprice',
            name='modelprice_series_from',
        ),
        migrations.RemoveConstraint(
            model_name='modelprice',
            name='modelprice_series_window',
        ),
        migrations.AddField(
            model_name='modelprice',
            name='service_tier',
            field=models.CharField(db_default='standard', default='standard', help_text="The service tier this row prices (standard, batch, flex, priority, or the provider's word, lower case); a step of a tier its model has no row for is priced at standard.", max_length=32),
        ),
        migrations.AddField(
            model_name='step',
            name='service_tier',
            field=models.CharField(db_default='standard', default='standard', max_length=32),
        ),
        migrations.AddConstraint(
            model_name='modelprice',
            constraint=models.UniqueConstraint(condition=models.Q(('window_start__isnull', True)), fields=('provider', 'model', 'service_tier', 'effective_from'), name='modelprice_series_from'),
        ),
        migrations.AddConstraint(
            model_name='modelprice',
            constraint=models.UniqueConstraint(condition=models.Q(('window_start__isnull', False)), fields=('provider', 'model', 'service_tier', 'effective_from', 'window_start'), name='modelprice_series_window'),
        ),
        migrations.AddField(
            model_name='priceadjustment',
            name='project',
            field=models.ForeignKey(blank=True, help_text="Optional: one project's steps; blank: every project.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='costboard.project'),
        ),
        migrations.AddConstraint(
            model_name='priceadjustment',
            constraint=models.UniqueConstraint(condition=models.Q(('project__isnull', False)), fields=('provider', 'family', 'project', 'effective_from'), name='priceadjustment_project_from'),
        ),
        migrations.AddConstraint(
            model_name='priceadjustment',
            constraint=models.UniqueConstraint(condition=models.Q(('project__isnull', True)), fields=('provider', 'family', 'effective_from'), name='priceadjustment_from'),
        ),
    ]
