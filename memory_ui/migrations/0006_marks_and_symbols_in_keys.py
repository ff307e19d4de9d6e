"""Fingerprints and frame keys read again with today's rule: a word's combining marks are part
of it ("दिन" is not "दान"), and a sentence with no letter or digit ("🚀", "!!!") is its own
characters, not the empty text every such sentence shared. Only the rows whose keys change
are written (those with such text); an eviction proposal keeps its empty keys."""

from django.db import migrations

BATCH = 2000


def keys_refresh(apps, schema_editor):
    # the rule of today's code: a data migration that must agree with what services store
    from memory_ui.conflicts import frame_key
    from memory_ui.text import fingerprint

    Memory = apps.get_model("memory_ui", "Memory")
    last = 0
    while True:
        rows = list(
            Memory.objects.filter(pk__gt=last)
            .exclude(proposal="evict")
            .order_by("pk")
            .only("pk", "content", "fingerprint", "frame_key")[:BATCH]
        )
        if not rows:
            return
        changed = []
        for row in rows:
            keys = (fingerprint(row.content), frame_key(row.content))
            if keys != (row.fingerprint, row.frame_key):
                row.fingerprint, row.frame_key = keys
                changed.append(row)
        Memory.objects.bulk_update(changed, ["fingerprint", "frame_key"])
        last = rows[-1].pk


class Migration(migrations.Migration):
    dependencies = [
        ("memory_ui", "0005_session_turn_without_constraints"),
    ]

    operations = [
        migrations.RunPython(keys_refresh, migrations.RunPython.noop),
    ]
