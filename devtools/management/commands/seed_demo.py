from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costboard.models import Session
from costboard.outbox import outbox_dispatch_without_broker
from devtools.demo import (
    DEFAULT_DAYS,
    DEFAULT_PROJECTS,
    DEFAULT_SEED,
    DEFAULT_SESSIONS,
    DemoResult,
    demo_seed,
)


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class Command(BaseCommand):
    help = (
        "Seed realistic demo traffic through the ingest service: several projects' sessions, "
        "turns and steps over the last 30 days, near-cap, exhausted and runaway sessions, and "
        "pending memory candidates. Run it again and nothing new is stored."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-empty",
            action="store_true",
            help="do nothing if the database has any session (for `make run`)",
        )
        parser.add_argument(
            "--sessions",
            type=_positive,
            help=f"sessions in all (default {DEFAULT_SESSIONS})",
        )
        parser.add_argument(
            "--steps",
            type=_positive,
            help="instead of --sessions: as many sessions as make about this many steps "
            "(a large data set for benchmarks, e.g. 1000000)",
        )
        parser.add_argument("--days", type=_positive, default=DEFAULT_DAYS)
        parser.add_argument("--projects", type=_positive, default=DEFAULT_PROJECTS)
        parser.add_argument(
            "--seed", type=int, default=DEFAULT_SEED, help="the same seed gives the same data"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["if_empty"] and Session.objects.exists():
            self.stdout.write("seed_demo: the database has sessions already; nothing to do")
            return
        try:
            result = demo_seed(
                sessions=options["sessions"],
                steps=options["steps"],
                days=options["days"],
                seed=options["seed"],
                projects=options["projects"],
                progress=self.stdout.write,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # Memory detection of the demo's turns (queued by ingest): now, when there is no worker.
        dispatched = outbox_dispatch_without_broker()
        if dispatched is not None and dispatched.claimed:
            self.stdout.write(str(dispatched))
        self.stdout.write(summary_line(result))


def summary_line(result: DemoResult) -> str:
    projects = len(result.projects)
    return (
        f"seeded {projects} project{'s' if projects != 1 else ''} "
        f"({', '.join(result.projects)}): "
        f"{result.sessions:,} sessions, {result.turns:,} turns, {result.steps:,} steps, "
        f"${result.cost_usd:,.2f} in all; {result.accepted:,} events stored, "
        f"{result.duplicates:,} duplicates; {result.memories_created} memories, "
        f"{result.runaways_flagged} runaways flagged; {result.seconds:.1f}s "
        f"({result.steps_per_second:,.0f} steps/s)"
    )
