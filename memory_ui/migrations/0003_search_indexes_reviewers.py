"""PostgreSQL's search indexes for memories (trigram similarity for near-duplicates, a
full-text index for ranked search), and the Reviewers group (who may approve, edit and
reject). SQLite skips the indexes: its paths are portable fallbacks."""

from django.db import migrations

POSTGRES_FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX IF NOT EXISTS memory_content_trgm ON memory_ui_memory "
    "USING gin (lower(content) gin_trgm_ops)",
    "CREATE INDEX IF NOT EXISTS memory_content_fts ON memory_ui_memory "
    "USING gin (to_tsvector('english', content))",
]
POSTGRES_BACKWARD = [
    "DROP INDEX IF EXISTS memory_content_fts",
    "DROP INDEX IF EXISTS memory_content_trgm",
]


def indexes_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_FORWARD:
            schema_editor.execute(statement)


def indexes_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in POSTGRES_BACKWARD:
            schema_editor.execute(statement)


def reviewers_create(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # the permission rows are normally made after all migrations; make them now (the app
    # registry of a migration has no models_module, which create_permissions checks for)
    config = apps.get_app_config("memory_ui")
    config.models_module = True
    create_permissions(config, verbosity=0, apps=apps)
    config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="Reviewers")
    group.permissions.add(
        Permission.objects.get(content_type__app_label="memory_ui", codename="review_memory")
    )


def reviewers_drop(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="Reviewers").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("memory_ui", "0002_review"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(indexes_create, indexes_drop),
        migrations.RunPython(reviewers_create, reviewers_drop),
    ]
