from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.text import slugify

from costboard.models import ApiKey, Project
from costboard.projects import project_key_create


class Command(BaseCommand):
    help = (
        "Create a project (if missing) and a new API key (role ingest unless --role says "
        "read or admin); the key is the last line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="project slug, e.g. support-bot")
        parser.add_argument("--name", default="", help="a label for the key")
        parser.add_argument(
            "--role",
            default=ApiKey.Role.INGEST,
            choices=ApiKey.Role.values,
            help="ingest (send usage; the default), read (reads only: the spend export) or "
            "admin (everything, budget edits too)",
        )

    def handle(self, *args: Any, project: str, name: str, role: str, **options: Any) -> None:
        slug = slugify(project)
        if not slug or slug != project:
            raise CommandError(
                f"{project!r} is not a slug: use lower-case letters, digits and hyphens, "
                f"e.g. {slug or 'my-project'!r}"
            )
        # PostgreSQL would refuse a longer one with a traceback, SQLite store it whole
        for label, value, field in (
            ("the project slug", slug, Project._meta.get_field("slug")),
            ("--name", name, ApiKey._meta.get_field("name")),
        ):
            if field.max_length is not None and len(value) > field.max_length:
                raise CommandError(
                    f"{label} is {len(value)} characters long: use at most {field.max_length}"
                )
        _, created, raw_key = project_key_create(slug=slug, name=name, role=role)
        if created:
            self.stderr.write(f"created project {slug}")
        self.stderr.write(f"new {role} key for {slug} (shown once; only its hash is stored):")
        self.stdout.write(raw_key)
