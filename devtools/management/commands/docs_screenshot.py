from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costboard.models import Session
from devtools.screenshot import CHROMIUM, page_shoot


class Command(BaseCommand):
    help = (
        "A PNG of a page of this database as a staff user sees it (the README's overview): "
        "the pages served in this process, drawn by Debian's Chromium (/usr/bin/chromium)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            default="docs/overview.png",
            help="the PNG to write",
        )
        parser.add_argument("--path", default="/", help="the page, e.g. / or /steps/")
        parser.add_argument("--width", type=int, default=1400, help="viewport width, px")
        parser.add_argument("--height", type=int, default=900, help="viewport height, px")
        parser.add_argument("--chromium", default=CHROMIUM, help="the browser binary")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["path"].startswith("/"):
            raise CommandError(f"--path {options['path']!r} must start with /, e.g. /steps/")
        if options["width"] < 100 or options["height"] < 100:
            raise CommandError("--width and --height must be at least 100")
        sessions = Session.objects.count()
        if sessions == 0:
            raise CommandError(
                "the database has no sessions to show: run `python manage.py sync_prices` "
                "and `python manage.py seed_demo` first"
            )
        output = Path(options["output"])
        try:
            shot = page_shoot(
                output=output,
                path=options["path"],
                width=options["width"],
                height=options["height"],
                chromium=options["chromium"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{output.name}: {options['width']}×{options['height']} of {shot.url} "
            f"({shot.title!r}, {shot.charts} charts drawn, {sessions:,} sessions in the database)"
        )
