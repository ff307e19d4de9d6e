"""Audio tokens priced at their own rates (docs/pricing.md, "Audio tokens"): a step keeps
its audio input, cached audio and audio output tokens (each part of its text count; NULL for
none), a price row its three audio rates (blank: genai-prices' fallbacks). On PostgreSQL the
step table is partitioned by month (0022): each column is added to the parent, which every
partition takes; nullable without a default, it is metadata only, no row rewritten (as 0042
added user_id), and a step without audio stores NULLs, which take no room in its row."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costboard', '0042_step_user'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelprice',
            name='cache_audio_read_mtok',
            field=models.DecimalField(blank=True, decimal_places=10, help_text='Audio tokens read from the cache; blank: as genai-prices charges them, the audio input rate plus the cache read rate less the input rate.', max_digits=20, null=True),
        ),
        migrations.AddField(
            model_name='modelprice',
            name='input_audio_mtok',
            field=models.DecimalField(blank=True, decimal_places=10, help_text='Audio input tokens; blank: the input rate.', max_digits=20, null=True),
        ),
        migrations.AddField(
            model_name='modelprice',
            name='output_audio_mtok',
            field=models.DecimalField(blank=True, decimal_places=10, help_text='Audio output tokens; blank: the output rate.', max_digits=20, null=True),
        ),
        migrations.AddField(
            model_name='step',
            name='cache_audio_read_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='step',
            name='input_audio_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='step',
            name='output_audio_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
