"""The memory benchmark behind `manage.py bench_memory`.

- detection: `memory_ui.detect.detect` over a generated mix of turns (small talk, questions,
  requests, preferences, corrections, rules, deadlines, pointers, secrets to redact, long
  replies), in this process on one core: turns per second, a turn being one user message with
  the assistant's reply, as the memory_detect task calls it. Target ≥ 5,000/s.
- MEMORY.md: `memory_file.memory_md` of a scope of N approved memories (10,000 by default),
  p50/p95 over repeated runs. Target < 50 ms.
- search: `ranking.memories_search` (k=5) over the same scope with varied queries — one to
  three words of a stored memory, web-search phrases, misspellings (the trigram path) and
  words stored nowhere — p50/p95. PostgreSQL only: its figure is what the full-text and
  trigram indexes give; on SQLite it is not measured (the portable path scans in Python).
  Target < 30 ms.
- lookup: `selectors.near_memories`, what proposing a candidate runs to find the memory it
  repeats and the ones it contradicts, for sentences like stored ones (a number changed, a
  word added, a word swapped) and new ones, p50/p95. Target < 5 ms on PostgreSQL (the
  trigram index's `%` narrows the rows; elsewhere the portable path compares in Python).
- review page: /memory/review/ with 50 pending candidates near the stored memories (many of
  them contradicting one), rendered by Django's test client as a staff user, p50/p95.
  Target < 300 ms. Each card's "Similar approved" aside is its own request, made as the card
  comes into view (the GiST trigram index's nearest rows): timed per candidate, p50/p95.

The memories belong to a project of the benchmark's own (`bench-memory-…`), written by
writes.imports.memories_import (in bulk, each with its history) and deleted afterwards.
"""

from __future__ import annotations

import random
import re
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal

from django.db import connection
from django.utils import timezone

from costboard.models import Project
from devtools.page_bench import bench_client
from memory_ui import ranking, selectors
from memory_ui.cleaners import MemoryFields, MemoryImport, Search
from memory_ui.memory_file import memory_md
from memory_ui.models import MAX_CONTENT, Memory
from memory_ui.writes import proposals
from memory_ui.writes.imports import memories_import

DETECT_TARGET_PER_S = 5_000.0
MEMORY_MD_TARGET_MS = 50.0
SEARCH_TARGET_MS = 30.0
LOOKUP_TARGET_MS = 5.0
REVIEW_TARGET_MS = 300.0
REVIEW_CANDIDATES = 50
SCOPE = "project"
PROPOSED_BY = "bench"


@dataclass(frozen=True, slots=True)
class BenchOptions:
    memories: int = 10_000
    messages: int = 20_000
    runs: int = 50
    queries: int = 200
    seed: int = 7
    keep: bool = False


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


@dataclass
class Timing:
    times_ms: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95(self) -> float:
        return percentile(self.times_ms, 95)

    @property
    def max(self) -> float:
        return max(self.times_ms)


@dataclass
class DetectResult:
    messages: int
    seconds: float
    candidates: int

    @property
    def per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


@dataclass
class BenchResult:
    options: BenchOptions
    vendor: str
    detect: DetectResult | None = None
    detect_error: str = ""
    memory_md: Timing | None = None
    md_lines: int = 0
    md_bytes: int = 0
    md_cut: int = 0
    search: Timing | None = None
    search_skipped: str = ""
    searches_with_results: int = 0
    slowest_query: str = ""
    lookup: Timing | None = None
    lookups_with_conflicts: int = 0
    review: Timing | None = None
    review_conflicts: int = 0
    aside: Timing | None = None
    missed: list[str] = field(default_factory=list)


# --- the generated data -----------------------------------------------------------------------

PEOPLE = ["Dana", "Priya", "Marco", "Aiko", "Sam", "Lena", "Omar", "Jules", "Ravi", "Mia"]
TOOLS = ["ruff", "mypy", "pytest", "black", "eslint", "terraform", "helm", "poetry", "uv", "tox"]
SERVICES = [
    "billing",
    "search",
    "ingest",
    "payments",
    "auth",
    "reports",
    "gateway",
    "scheduler",
    "exports",
    "notifications",
]
ENVS = ["staging", "production", "preview", "sandbox", "qa"]
TOPICS = [
    "invoices",
    "refunds",
    "migrations",
    "caching",
    "retries",
    "timeouts",
    "pagination",
    "webhooks",
    "rate limits",
    "backups",
    "feature flags",
    "dashboards",
    "alerts",
    "logging",
    "tracing",
]
STYLES = ["short", "detailed", "bulleted", "formal", "casual", "step-by-step", "concise"]
DAYS = ["Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays"]
MONTHS = ["January", "March", "April", "June", "September", "November"]
ACTIONS = ["merging", "deploying", "releasing", "tagging", "rebasing", "publishing"]

MEMORY_TEMPLATES: list[tuple[str, str]] = [
    ("user", "{person} prefers {style} answers about {topic}"),
    ("user", "{person} works in the {service} team and reviews {topic} changes"),
    ("feedback", "Always run {tool} before {action} the {service} service"),
    ("feedback", "Never change {topic} settings on {day} without telling {person}"),
    ("feedback", "Use {tool} instead of {tool2} for {topic} in the {service} repo"),
    ("project", "The {service} {env} release freeze starts {month} {n}"),
    ("project", "{person} owns the {topic} rework for {service}, due {month} {n}"),
    ("reference", "The {env} {service} database is on port {port}"),
    ("reference", "{service} {topic} runbook: https://docs.example.com/{service}/{slug}"),
    ("reference", "Dashboards for {service} {topic} are in Grafana folder {slug}"),
]


def _fill(template: str, rng: random.Random, n: int) -> str:
    topic = rng.choice(TOPICS)
    return template.format(
        person=rng.choice(PEOPLE),
        style=rng.choice(STYLES),
        topic=topic,
        service=rng.choice(SERVICES),
        tool=rng.choice(TOOLS),
        tool2=rng.choice(TOOLS),
        action=rng.choice(ACTIONS),
        day=rng.choice(DAYS),
        env=rng.choice(ENVS),
        month=rng.choice(MONTHS),
        n=1 + n % 28,
        port=5000 + n % 4000,
        slug=f"{topic.replace(' ', '-')}-{n}",
    )


def memory_rows(project: Project, count: int, rng: random.Random) -> list[MemoryImport]:
    """`count` approved memories for `project`'s bench scope, decided over the last year (for
    freshness to vary); memories_import writes them with their history."""
    now = timezone.now()
    sources = [s.value for s in Memory.Source]
    rows = []
    for n in range(count):
        type_, template = rng.choice(MEMORY_TEMPLATES)
        content = f"{_fill(template, rng, n)} (#{n})"[:MAX_CONTENT]
        decided = now - timedelta(days=rng.uniform(0, 365))
        rows.append(
            MemoryImport.of(
                type=type_,
                content=content,
                scope=SCOPE,
                importance=Decimal(rng.randint(0, 1000)) / 1000,
                source=rng.choice(sources),
                proposed_at=decided - timedelta(hours=1),
                decided_at=decided,
            )
        )
    return rows


USER_MESSAGES = [
    "Hello, are you there?",
    "thanks, that works!",
    "Can you summarise this file for me?",
    "What does the {service} retry loop do when the gateway times out?",
    "Please fix the failing test in the {service} module.",
    "I prefer {style} answers, no more than three points.",
    "From now on always use {tool} instead of {tool2}.",
    "No, that's wrong: the {env} {service} database is on port {port}.",
    "Never deploy {service} on {day}, the on-call team is thin.",
    "Remember that {person} owns {topic} and must review every change to it.",
    "The {service} release freeze starts {month} {n}, so plan the {topic} work before it.",
    "Docs for {topic} are at https://docs.example.com/{service}/{slug} if you need them.",
    "Just this once, skip the {tool} step, I'm in a hurry.",
    "My email is {person}.{n}@example.com, send the {topic} report there.",
    "Here's my key sk-proj-{secret} for the {service} sandbox, don't store it.",
    "I think maybe we should look at {topic} later, not sure.",
    "Run the {topic} migration for {service} in {env} and tell me what breaks.\n\n"
    "```python\nfor item in items:\n    process(item)\n```",
    "ok",
    "Why is {service} slow on {day}s? Is it the {topic} job?",
    "We use {tool} for linting and {tool2} for formatting in this repo; keep it that way.",
]
ASSISTANT_REPLIES = [
    "",
    "Sure. Here is a summary of the {service} module: it handles {topic}, retries twice and "
    "logs every failure. The main entry point is `run()`, which reads the queue, batches the "
    "items and writes them to the database in one transaction.",
    "Noted: you prefer {style} answers.",
    "I'll remember that {person} owns {topic}.",
    "Done. The test failed because the {topic} fixture used a fixed date; I made it relative "
    "and the suite passes now (412 passed, 3 skipped).",
    "The {env} {service} database answers on port {port}; I updated the connection string.",
    "Here are three options:\n1. Cache the {topic} lookups.\n2. Batch the writes.\n"
    "3. Move the {service} job off-peak.",
]


def message_mix(count: int, rng: random.Random) -> list[tuple[str, str]]:
    def fill(template: str, n: int) -> str:
        secret = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=32))
        return _fill(template.replace("{secret}", secret), rng, n)

    return [
        (fill(rng.choice(USER_MESSAGES), n), fill(rng.choice(ASSISTANT_REPLIES), n))
        for n in range(count)
    ]


def search_queries(contents: list[str], count: int, rng: random.Random) -> list[str]:
    """One to three words of a stored memory (most), a quoted phrase, a misspelled word
    (found by trigrams), and words stored nowhere."""
    queries = []
    for n in range(count):
        words = [w.strip(".,:()#") for w in rng.choice(contents).split() if len(w) > 3]
        words = [w for w in words if w and not w.isdigit() and "/" not in w] or ["billing"]
        kind = n % 10
        if kind < 6:
            queries.append(" ".join(rng.sample(words, min(len(words), rng.randint(1, 3)))))
        elif kind == 6:
            start = rng.randrange(len(words))
            queries.append('"' + " ".join(words[start : start + 2]) + '"')
        elif kind < 9:
            word = rng.choice(words)
            cut = rng.randrange(1, len(word))
            queries.append(word[:cut] + word[cut + 1 :])  # one letter dropped
        else:
            queries.append(rng.choice(["kubernetes autoscaler", "quarterly okr", "gpu quota"]))
    return queries


# --- the measurements -------------------------------------------------------------------------


def detect_bench(options: BenchOptions, rng: random.Random) -> DetectResult:
    from memory_ui.detect import detect  # another module's work: imported when measured

    turns = message_mix(options.messages, rng)
    for user, reply in turns[:200]:  # warm up: compiled patterns, caches
        detect(user, reply)
    found = 0
    start = time.perf_counter()
    for user, reply in turns:
        found += len(detect(user, reply))
    return DetectResult(messages=len(turns), seconds=time.perf_counter() - start, candidates=found)


def lookup_sentences(contents: list[str], count: int, rng: random.Random) -> list[str]:
    """Sentences a proposal might bring: a stored one with a number changed (a contradiction),
    a word added (the same meaning), a word swapped (a near miss), or a new one."""
    out = []
    for i in range(count):
        base = rng.choice(contents)
        kind = i % 4
        if kind == 0:
            out.append(re.sub(r"\d+", lambda m: str(int(m.group(0)) + 1), base, count=1))
        elif kind == 1:
            out.append(f"{base} now")
        elif kind == 2:
            words = base.split()
            words[rng.randrange(len(words))] = rng.choice(TOPICS)
            out.append(" ".join(words))
        else:
            out.append(_fill(rng.choice(MEMORY_TEMPLATES)[1], rng, rng.randrange(10**6)))
    return [s[:MAX_CONTENT] for s in out]


def lookup_bench(
    project: Project, contents: list[str], runs: int, rng: random.Random
) -> tuple[Timing, int]:
    sentences = lookup_sentences(contents, runs, rng)
    for sentence in sentences[:5]:
        selectors.near_memories(project, SCOPE, sentence)
    times = []
    conflicting = 0
    for sentence in sentences:
        start = time.perf_counter()
        near = selectors.near_memories(project, SCOPE, sentence)
        times.append((time.perf_counter() - start) * 1000)
        conflicting += bool(near.conflicts)
    return Timing(times), conflicting


def review_bench(
    project: Project, contents: list[str], runs: int, rng: random.Random
) -> tuple[Timing, int, Timing]:
    """The review page of REVIEW_CANDIDATES pending candidates near the stored memories."""
    proposed: set[int] = set()
    for sentence in lookup_sentences(contents, REVIEW_CANDIDATES * 3, rng):
        memory = proposals.candidate_propose(
            project=project,
            fields=MemoryFields.of(type="project", content=sentence),
            proposed_by=PROPOSED_BY,
        )
        if memory is not None and memory.status == Memory.Status.PENDING:
            proposed.add(memory.pk)
        if len(proposed) >= REVIEW_CANDIDATES:
            break
    conflicting = Memory.objects.filter(pk__in=proposed, conflicts_with__isnull=False)
    client = bench_client()
    path = f"/memory/review/?project={project.slug}"

    def page() -> None:
        response = client.get(path)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")

    asides = []
    for pk in sorted(proposed):
        start = time.perf_counter()
        response = client.get(f"/memory/{pk}/similar/", headers={"HX-Request": "true"})
        asides.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"/memory/{pk}/similar/ answered {response.status_code}")
    return _timed(page, runs), conflicting.distinct().count(), Timing(asides)


def _timed(work: Callable[[], object], runs: int, warmup: int = 2) -> Timing:
    for _ in range(warmup):
        work()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1000)
    return Timing(times)


def bench_project() -> Project:
    slug = f"bench-memory-{uuid.uuid4().hex[:8]}"
    return Project.objects.create(name=slug, slug=slug)


def bench_run(
    options: BenchOptions, *, say: Callable[[str], None] = lambda line: None
) -> BenchResult:
    rng = random.Random(options.seed)
    result = BenchResult(options=options, vendor=connection.vendor)
    say(f"detection over {options.messages:,} generated turns …")
    try:
        result.detect = detect_bench(options, rng)
    except ImportError as exc:
        result.detect_error = f"memory_ui.detect is not importable ({exc})"
    project = bench_project()
    try:
        say(f"inserting {options.memories:,} approved memories …")
        rows = memory_rows(project, options.memories, rng)
        memories_import(project=project, memories=rows, actor_name=PROPOSED_BY)
        if connection.vendor == "postgresql":
            # as autovacuum would soon: fresh statistics, and the GIN indexes' pending lists
            # (where bulk inserts wait, scanned by every query) merged into the indexes
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE memory_ui_memory")
                cursor.execute(
                    "SELECT gin_clean_pending_list(to_regclass(name)) "
                    "FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NOT NULL",
                    [["memory_content_fts", "memory_content_trgm"]],
                )
        say(f"MEMORY.md × {options.runs} …")
        md = memory_md(project, SCOPE)
        result.md_lines, result.md_bytes, result.md_cut = md.lines, md.bytes, md.cut_count
        result.memory_md = _timed(lambda: memory_md(project, SCOPE), options.runs)
        if connection.vendor != "postgresql":
            result.search_skipped = (
                f"not measured on {connection.vendor}: the figure is PostgreSQL's full-text and "
                "trigram indexes; run with DATABASE_URL=postgres://… (the portable path is for "
                "`make run`)"
            )
        else:
            say(f"search × {options.queries} …")
            queries = search_queries([r.fields.content for r in rows], options.queries, rng)
            searches = [Search.of(query=query, scope=SCOPE) for query in queries]
            hits = 0
            for search in searches[:5]:
                ranking.memories_search(project=project, search=search)
            times = []
            for search in searches:
                start = time.perf_counter()
                found = ranking.memories_search(project=project, search=search)
                times.append((time.perf_counter() - start) * 1000)
                hits += bool(found)
            result.search = Timing(times)
            result.searches_with_results = hits
            result.slowest_query = queries[times.index(max(times))]
        say(f"lookups × {options.queries} …")
        contents = [r.fields.content for r in rows]
        result.lookup, result.lookups_with_conflicts = lookup_bench(
            project, contents, options.queries, rng
        )
        say(f"review page of {REVIEW_CANDIDATES} candidates × {options.runs} …")
        result.review, result.review_conflicts, result.aside = review_bench(
            project, contents, options.runs, rng
        )
    finally:
        if not options.keep:
            project.delete()
    result.missed = _missed(result)
    return result


def _missed(result: BenchResult) -> list[str]:
    missed = []
    if result.detect and result.detect.per_second < DETECT_TARGET_PER_S:
        missed.append("detection")
    if result.memory_md and result.memory_md.p95 >= MEMORY_MD_TARGET_MS:
        missed.append("MEMORY.md")
    if result.search and result.search.p95 >= SEARCH_TARGET_MS:
        missed.append("search")
    if result.lookup and result.vendor == "postgresql" and result.lookup.p95 >= LOOKUP_TARGET_MS:
        missed.append("lookup")
    if result.review and result.review.p95 >= REVIEW_TARGET_MS:
        missed.append("review page")
    return missed


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report_lines(result: BenchResult) -> list[str]:
    o = result.options
    lines = [
        f"data:       {o.memories:,} approved memories in one scope on {result.vendor} (a "
        "project of the benchmark's own, deleted afterwards)"
        + (" — kept (--keep)" if o.keep else "")
    ]
    if result.detect is not None:
        d = result.detect
        lines.append(
            f"detection:  {d.per_second:,.0f} messages/s on one core ({d.messages:,} turns — a "
            f"user message with its reply — in {d.seconds:.2f} s; {d.candidates:,} candidates); "
            f"target ≥ {DETECT_TARGET_PER_S:,.0f}/s: "
            f"{_verdict(d.per_second >= DETECT_TARGET_PER_S)}"
        )
    else:
        lines.append(f"detection:  not measured: {result.detect_error}")
    if result.memory_md is not None:
        t = result.memory_md
        lines.append(
            f"MEMORY.md:  p50 {t.p50:.2f} ms, p95 {t.p95:.2f} ms, max {t.max:.2f} ms over "
            f"{len(t.times_ms)} runs ({result.md_lines} lines, {result.md_bytes:,} bytes, "
            f"{result.md_cut:,} entries cut); target < {MEMORY_MD_TARGET_MS:.0f} ms: "
            f"{_verdict(t.p95 < MEMORY_MD_TARGET_MS)}"
        )
    if result.search is not None:
        t = result.search
        lines.append(
            f"search:     p50 {t.p50:.2f} ms, p95 {t.p95:.2f} ms, max {t.max:.2f} ms over "
            f"{len(t.times_ms)} varied queries (k=5; {result.searches_with_results} with "
            f"results; slowest: {result.slowest_query!r}); target < {SEARCH_TARGET_MS:.0f} ms: "
            f"{_verdict(t.p95 < SEARCH_TARGET_MS)}"
        )
    else:
        lines.append(f"search:     {result.search_skipped}")
    if result.lookup is not None:
        t = result.lookup
        target = (
            f"target < {LOOKUP_TARGET_MS:.0f} ms: {_verdict(t.p95 < LOOKUP_TARGET_MS)}"
            if result.vendor == "postgresql"
            else "no target off PostgreSQL (the portable path)"
        )
        lines.append(
            f"lookup:     p50 {t.p50:.2f} ms, p95 {t.p95:.2f} ms, max {t.max:.2f} ms over "
            f"{len(t.times_ms)} proposals' duplicate and conflict lookups "
            f"({result.lookups_with_conflicts} found a contradiction); {target}"
        )
    if result.review is not None:
        t = result.review
        lines.append(
            f"review:     p50 {t.p50:.2f} ms, p95 {t.p95:.2f} ms, max {t.max:.2f} ms over "
            f"{len(t.times_ms)} renderings of /memory/review/ with {REVIEW_CANDIDATES} "
            f"candidates ({result.review_conflicts} contradicting a memory); "
            f"target < {REVIEW_TARGET_MS:.0f} ms: {_verdict(t.p95 < REVIEW_TARGET_MS)}"
        )
    if result.aside is not None:
        t = result.aside
        lines.append(
            f"aside:      p50 {t.p50:.2f} ms, p95 {t.p95:.2f} ms, max {t.max:.2f} ms over "
            f'{len(t.times_ms)} candidates\' "Similar approved" (each its own request, as the '
            "card comes into view)"
        )
    return lines
