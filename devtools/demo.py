"""Demo traffic for `seed_demo`: several projects' agent sessions over the last 30 days, stored
through the real ingest service, so every rollup, budget state and crossing is what real
traffic would give.

- Each project has a theme (a support bot, a research agent, a code reviewer), a data file
  under devtools/demo_data/ (read by devtools.themes): what its users ask, which model each
  pipeline step runs on, what memories its agent proposes.
- Sessions are scheduled over the window first (every day gets some once there are enough;
  more on weekdays and in business hours, growing towards today), then written one at a time,
  each from its own random stream. The same seed and options give the same sessions, turns,
  steps and event_ids, so a second run stores nothing new: replays count as duplicates.
- The newest sessions of each project include one near its cap, one exhausted (by a token or
  a USD cap sent in its session event) and one stuck in a retry loop, flagged as runaway.
- Events go to `events_ingest` in batches of up to 1000 per project; only the schedule is
  held in memory, so a million steps (`--steps`) fit.
- The memories go through the memory services like any other (proposed, some approved by a
  "demo reviewer"), each with its history. Each is said first: the newest turns of its
  project's newest sessions say the theme's memory sentences, in the theme's order, and each
  memory cites its turn and is dated just after it, so a correction (listed after what it
  corrects) is dated after it too. The memory detector reads those turns as it reads any.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from typing import Any

from django.db import transaction
from django.db.models import Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from costboard.billing.reconcile import step_provider
from costboard.billing.services import billing_rows_replace
from costboard.billing.uploads import UploadRow
from costboard.budgets.caps import caps_for
from costboard.budgets.period_services import period_budget_create, period_budget_update
from costboard.budgets.periods import ledger_now
from costboard.ingest.schemas import MAX_EVENTS, Event, SessionEvent, StepEvent, TurnEvent
from costboard.ingest.service import events_ingest
from costboard.models import (
    SYSTEM_SESSION_ID,
    TOOL_MODEL,
    BilledUsage,
    BudgetEvent,
    ModelPrice,
    PeriodBudget,
    Project,
    Session,
    Step,
    Turn,
)
from costboard.pricing.rates import RateTable, rate_table
from costboard.pricing.sync import prices_sync
from devtools.themes import Llm, Shape, Theme, demo_data
from memory_ui.cleaners import MemoryFields
from memory_ui.models import Memory
from memory_ui.tasks import DETECTOR
from memory_ui.writes import decisions, proposals

DEFAULT_SESSIONS = 300
DEFAULT_DAYS = 30
DEFAULT_SEED = 42
DEFAULT_PROJECTS = 3
# Enough sessions per project for its near-cap, exhausted and runaway examples and some more.
MIN_SESSIONS_PER_PROJECT = 8

DAY = timedelta(days=1)
GROWTH = 0.6  # the newest day gets 1.6 times the traffic of the oldest
WEEKEND_SHARE = 0.45  # a weekend day gets this share of a weekday's traffic
FAILURE_RATE = 0.02  # a call fails (and is retried) this often
RETRY_LOOP_ATTEMPTS = (42, 60)
CANARY_EVERY = 11  # every 11th session of a theme with a canary model routes intents to it
SYSTEM_STEP_RATE = 0.1  # background (session-less) steps per session
# The `system` session's caps, set on its project (it has none of its own): room for a
# month of background jobs (about 1,300 tokens and $0.0002 a chat session), used ~a quarter.
SYSTEM_TOKENS_PER_SESSION = 5_000
SYSTEM_USD_PER_HUNDRED_SESSIONS = Decimal(1)
TURN_WEIGHTS = (8, 14, 16, 14, 11, 9, 7, 6, 5, 4, 3, 3)  # 1 to 12 turns, mostly 2 to 5
EXHAUSTED_AT = Decimal("0.95")  # an exhausted example's cap: the session crosses it at the end
CENTS = Decimal("0.01")
CAP_QUANTUM = Decimal("0.0001")


# --- the result -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoResult:
    projects: tuple[str, ...]
    sessions: int
    turns: int
    steps: int  # step events sent (stored, or duplicates of stored ones)
    events: int  # all events sent
    accepted: int
    duplicates: int
    cost_usd: Decimal  # what the demo projects' sessions cost in all
    memories_created: int
    runaways_flagged: int
    seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


@dataclass(slots=True)
class _Tally:
    sessions: int = 0
    turns: int = 0
    steps: int = 0
    events: int = 0
    accepted: int = 0
    duplicates: int = 0
    runaways_flagged: int = 0


Progress = Callable[[str], None]


def demo_seed(
    *,
    sessions: int | None = None,
    steps: int | None = None,
    days: int = DEFAULT_DAYS,
    seed: int = DEFAULT_SEED,
    projects: int = DEFAULT_PROJECTS,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> DemoResult:
    """Write demo traffic: `sessions` sessions in all (default 300), or as many as make about
    `steps` steps; over the `days` before `now`; in `projects` projects."""
    _options_check(sessions=sessions, steps=steps, days=days, projects=projects)
    say = progress or _silent
    _prices_ensure(say)
    clock = time.monotonic()
    themes = _themes(projects)
    total = _session_total(sessions=sessions, steps=steps, themes=themes, seed=seed)
    if sessions is not None and total > sessions:
        say(f"{total} sessions, not {sessions}: {MIN_SESSIONS_PER_PROJECT} a project at least")
    now = now or timezone.now()
    window = _Window(end=_hour_start(now), days=days)
    slots, per_project = _schedule(total=total, window=window, themes=themes, seed=seed)
    table = rate_table()
    tally = _Tally()
    feeds = []
    for position, theme in enumerate(themes):
        project = _project_for(theme, sessions=per_project[position])
        _budgets_seed(project, _user_id(theme, seed, 0, per_project[position]))
        feed = _ProjectFeed(project=project, tally=tally, now=now)
        feed.add([_system_budget_event(project.slug, seed, window.start)])
        feeds.append(feed)
    say(
        f"seeding {total} sessions in {len(themes)} projects over {days} days "
        f"(seed {seed}), in batches of up to {MAX_EVENTS} events"
    )

    sources = [
        _memory_sources(
            position, slots=slots, themes=themes, per_project=per_project, seed=seed, window=window
        )
        for position in range(len(themes))
    ]
    every = max(1, total // 10)
    for done, slot in enumerate(slots, start=1):
        _session_send(
            slot,
            themes=themes,
            feeds=feeds,
            per_project=per_project,
            seed=seed,
            window=window,
            table=table,
            sources=sources[slot.project],
        )
        if done % every == 0 and done < total:
            say(_progress_line(done, total, tally, time.monotonic() - clock))
    for feed in feeds:
        feed.close()
    say(_progress_line(total, total, tally, time.monotonic() - clock))

    for feed in feeds:
        _budgets_settle(feed.project, now=now)
    memories = sum(
        _memories_seed(feed.project, theme, seed, sources=found, unsourced_at=window.start)
        for feed, theme, found in zip(feeds, themes, sources, strict=True)
    )
    billed = _billing_seed(feeds[0].project, now=now)
    say(
        f"billed {billed} rows for {feeds[0].project.slug}: anthropic {DEMO_UNDER_LIST}% of "
        f"list, openai within a few %, one {UNINSTRUMENTED_PROVIDER} day with no step"
    )
    cost = Session.objects.filter(project__in=[f.project for f in feeds]).aggregate(
        total=Sum("cost_usd")
    )["total"]
    return DemoResult(
        projects=tuple(f.project.slug for f in feeds),
        sessions=tally.sessions,
        turns=tally.turns,
        steps=tally.steps,
        events=tally.events,
        accepted=tally.accepted,
        duplicates=tally.duplicates,
        cost_usd=cost or Decimal(0),
        memories_created=memories,
        runaways_flagged=tally.runaways_flagged,
        seconds=time.monotonic() - clock,
    )


def _silent(line: str) -> None:
    return None


# --- what the providers billed (docs/billing.md) ----------------------------------------------

DEMO_UNDER_LIST = Decimal(-10)  # anthropic bills the demo project 10 % under list: a proposal
OPENAI_WOBBLE = (Decimal("1.5"), Decimal(-2), Decimal(3), Decimal("-0.5"), Decimal("2.5"))
UNINSTRUMENTED_PROVIDER = "mistral"  # a day billed with no step: an uninstrumented job
UNINSTRUMENTED = ("mistral-large-latest", Decimal("3.40"), 5)  # model, cost, days before today
PICO = Decimal("1e-12")


def _billing_seed(project: Project, *, now: datetime) -> int:
    """The bill of the project's UTC days before today, sent by hand (source `api`) as a
    provider's invoice would be: every anthropic model at exactly 90 % of Costboard's
    estimate (steady: /reconciliation/ proposes −10 %), every openai model within a few
    percent of it, varying day to day (no proposal, no drift alert), and one mistral day with
    no step at all (uninstrumented spend). Each day is replaced, so a second run changes
    nothing. Returns the rows sent."""
    today = now.astimezone(UTC).date()
    start = datetime.combine(today - timedelta(days=366), datetime.min.time(), tzinfo=UTC)
    end = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
    estimated = (
        Step.objects.filter(project=project, timestamp__gte=start, timestamp__lt=end)
        .exclude(model=TOOL_MODEL)
        .annotate(utc_day=TruncDate("timestamp", tzinfo=UTC))
        .values("utc_day", "model", "provider", "price__provider")
        .annotate(cost=Sum("cost_usd"), tokens=Sum("input_tokens"))
        .order_by("utc_day", "model")
    )
    rows: dict[tuple[date, str, str], UploadRow] = {}
    for found in estimated:
        provider = step_provider(found["price__provider"], found["provider"], found["model"])
        if provider == "anthropic":
            factor = 1 + DEMO_UNDER_LIST / 100
        elif provider == "openai":
            wobble = OPENAI_WOBBLE[found["utc_day"].toordinal() % len(OPENAI_WOBBLE)]
            factor = 1 + wobble / 100
        else:
            continue  # the demo's other providers send no bill
        cost = found["cost"] or Decimal(0)
        key = (found["utc_day"], provider, found["model"])
        billed = (cost * factor).quantize(PICO, rounding=ROUND_HALF_EVEN)
        before = rows.get(key)
        rows[key] = UploadRow(
            day=found["utc_day"],
            provider=provider,
            model=found["model"],
            project_id=project.pk,
            cost_usd=billed + (before.cost_usd if before else 0),
            input_tokens=(found["tokens"] or 0) + ((before.input_tokens or 0) if before else 0),
            output_tokens=None,
        )
    model, cost, days_ago = UNINSTRUMENTED
    day = today - timedelta(days=days_ago)
    rows[(day, UNINSTRUMENTED_PROVIDER, model)] = UploadRow(
        day=day,
        provider=UNINSTRUMENTED_PROVIDER,
        model=model,
        project_id=project.pk,
        cost_usd=cost,
        input_tokens=1_200_000,
        output_tokens=None,
    )
    billing_rows_replace(list(rows.values()), source=BilledUsage.Source.API)
    return len(rows)


def _hour_start(moment: datetime) -> datetime:
    """The window ends at the start of the hour, so two runs within an hour send the very same
    events (timestamps included)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _session_send(
    slot: _Slot,
    *,
    themes: list[Theme],
    feeds: list[_ProjectFeed],
    per_project: list[int],
    seed: int,
    window: _Window,
    table: RateTable,
    sources: Mapping[tuple[int, int], _MemorySource] | None = None,
) -> None:
    """Write the session of one slot and hand its events to its project's feed; the turns
    `sources` names say their memory's sentence."""
    feed = feeds[slot.project]
    said = {
        turn: source.said
        for (index, turn), source in (sources or {}).items()
        if index == slot.index
    }
    writer = _writer(slot, themes=themes, per_project=per_project, seed=seed, said=said)
    draft = writer.compose()
    events = _session_events(
        draft, start=_start(slot, draft, window), table=table, project=feed.project
    )
    feed.add(events)
    feed.tally.sessions += 1
    feed.tally.turns += draft.turns
    feed.tally.steps += draft.steps


def _writer(
    slot: _Slot,
    *,
    themes: list[Theme],
    per_project: list[int],
    seed: int,
    said: Mapping[int, str] | None = None,
) -> _SessionWriter:
    return _SessionWriter(
        theme=themes[slot.project],
        seed=seed,
        index=slot.index,
        count=per_project[slot.project],
        exhaust_by_cost=slot.project % 2 == 1,
        said=said,
    )


def _start(slot: _Slot, draft: _Draft, window: _Window) -> datetime:
    """When the session starts: its slot, or early enough to end a minute before the window."""
    return min(slot.at, window.end - timedelta(milliseconds=draft.duration_ms + 60_000))


def _options_check(*, sessions: int | None, steps: int | None, days: int, projects: int) -> None:
    if sessions is not None and steps is not None:
        raise ValueError("give the number of sessions or of steps, not both")
    for name, value in (("sessions", sessions), ("steps", steps), ("days", days)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if projects < 1:
        raise ValueError(f"projects must be at least 1, got {projects}")


def _progress_line(done: int, total: int, tally: _Tally, seconds: float) -> str:
    # events are stored a batch at a time: until the first is, there is no rate to tell
    rate = (
        f"{tally.events / seconds:,.0f} events/s"
        if tally.events and seconds
        else f"the first batch of {MAX_EVENTS:,} events still filling"
    )
    return (
        f"  {round(done * 100 / total):3d}%  {done:,}/{total:,} sessions, {tally.steps:,} steps, "
        f"{tally.accepted:,} events stored, {tally.duplicates:,} duplicates, "
        f"{rate}"
    )


def _prices_ensure(say: Progress) -> None:
    """Steps are priced at ingest, so the rate table must not be empty."""
    if not ModelPrice.objects.exists():
        result = prices_sync()
        say(f"the rate table was empty: loaded {result.created} prices from genai-prices")


# --- projects -------------------------------------------------------------------------------


def _themes(count: int) -> list[Theme]:
    """`count` themes: the ones in devtools/demo_data/ (demo.toml's order), then again as
    support-bot-2, research-agent-2, …"""
    builtin = demo_data().themes
    themes = []
    for n in range(count):
        base = builtin[n % len(builtin)]
        round_ = n // len(builtin) + 1
        if round_ == 1:
            themes.append(base)
        else:
            themes.append(_theme_copy(base, round_))
    return themes


def _theme_copy(base: Theme, round_: int) -> Theme:
    return replace(base, slug=f"{base.slug}-{round_}", name=f"{base.name} {round_}")


def _project_for(theme: Theme, *, sessions: int) -> Project:
    hundreds = Decimal(max(1, math.ceil(sessions / 100)))
    project, _ = Project.objects.get_or_create(
        slug=theme.slug,
        defaults={
            "name": theme.name,
            "token_cap": theme.token_cap,
            "cost_cap_usd": theme.cost_cap_usd,
            "system_token_cap": max(100_000, SYSTEM_TOKENS_PER_SESSION * sessions),
            "system_cost_cap_usd": SYSTEM_USD_PER_HUNDRED_SESSIONS * hundreds,
            # the showback report (/reports/) groups by the customer tag every session has
            "report_tag_key": "customer",
        },
    )
    return project


# --- period budgets ----------------------------------------------------------------------------

# what every demo project is budgeted by; made before its traffic (so they count it) with
# limits out of reach, which _budgets_settle then sets from what was spent
DEMO_BUDGETS = (
    ("Monthly spend", "project", "month", "warn"),
    ("Enterprise customers", "tag", "month", "warn"),
    ("Daily per user", "user", "day", "stop"),
)
UNREACHED = Decimal(10**9)
PLANS = ("free", "pro", "enterprise")
CUSTOMERS = ("northwind", "globex", "initech", "umbrella", "hooli", "acme-corp")


def _budgets_seed(project: Project, busy_user: str) -> None:
    """The demo's period budgets over `project`, once (a second run finds them)."""
    values = {"project": "", "tag": "plan=enterprise", "user": busy_user}
    for name, scope, period, action in DEMO_BUDGETS:
        if not PeriodBudget.objects.filter(project=project, name=name).exists():
            period_budget_create(
                project=project,
                fields={
                    "name": name,
                    "scope": scope,
                    "scope_value": values[scope] or None,
                    "period": period,
                    "cost_limit_usd": UNREACHED,
                    "action": action,
                },
            )


def _budgets_settle(project: Project, *, now: datetime) -> None:
    """Limits from what the demo spent this period: the month's spend near its limit (at
    about 90 %), the enterprise tag's at half of it, the busy user's day well within."""
    share = {"Monthly spend": Decimal("1.1"), "Enterprise customers": Decimal(2)}
    for budget in PeriodBudget.objects.filter(
        project=project, name__in=[b[0] for b in DEMO_BUDGETS]
    ):
        ledger = ledger_now(budget, now)
        spent = ledger.cost_usd if ledger is not None else Decimal(0)
        limit = (spent * share.get(budget.name, Decimal(3))).quantize(CENTS, rounding=ROUND_CEILING)
        period_budget_update(
            budget, changes={"cost_limit_usd": max(limit, Decimal("1.00"))}, now=now
        )


def _system_budget_event(slug: str, seed: int, at: datetime) -> Event:
    """Background jobs report without a session (docs/api.md, "Events": the `system` session); its
    caps are its project's system caps (_project_for), as an admin would set them."""
    return SessionEvent.model_validate(
        {
            "type": "session",
            "event_id": f"demo-{seed}-{slug}-system-budget",
            "session_id": SYSTEM_SESSION_ID,
            "timestamp": at,
            "metadata": {"purpose": "background jobs: re-indexing, nightly digests"},
        }
    )


# --- when sessions happen -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Window:
    end: datetime  # the start of the current hour: nothing is later
    days: int

    @property
    def start(self) -> datetime:
        """Midnight of the first day (the last day is today)."""
        midnight = self.end.replace(hour=0)
        return midnight - (self.days - 1) * DAY

    def day_start(self, day: int) -> datetime:
        return self.start + day * DAY


@dataclass(frozen=True, slots=True)
class _Slot:
    at: datetime
    project: int
    index: int  # the session's number within its project, oldest first


def _schedule(
    *, total: int, window: _Window, themes: list[Theme], seed: int
) -> tuple[list[_Slot], list[int]]:
    """When each session starts and in which project: all days covered once there are as many
    sessions as days, weekdays and business hours busier, more traffic towards today."""
    rng = random.Random(f"schedule:{seed}")
    times: list[datetime] = []
    for day, count in enumerate(_sessions_per_day(total, window)):
        day_start = window.day_start(day)
        span = min(DAY, window.end - day_start)
        times.extend(day_start + span * _time_of_day(rng) for _ in range(count))
    times.sort()
    per_project = [0] * len(themes)
    slots = []
    for at, project in zip(times, _projects_in_turn(themes, total), strict=True):
        slots.append(_Slot(at=at, project=project, index=per_project[project]))
        per_project[project] += 1
    return slots, per_project


def _sessions_per_day(total: int, window: _Window) -> list[int]:
    weights = []
    for day in range(window.days):
        growth = 1 + GROWTH * day / max(1, window.days - 1)
        weekend = window.day_start(day).weekday() >= 5
        weights.append(growth * (WEEKEND_SHARE if weekend else 1.0))
    floor = 1 if total >= window.days else 0
    counts = [floor] * window.days
    rest = total - floor * window.days
    quotas = [rest * w / sum(weights) for w in weights]
    for day, quota in enumerate(quotas):
        counts[day] += int(quota)
    # largest remainders first, the newest day winning a tie
    leftover = total - sum(counts)
    by_remainder = sorted(
        range(window.days), key=lambda d: (quotas[d] - int(quotas[d]), d), reverse=True
    )
    for day in by_remainder[:leftover]:
        counts[day] += 1
    return counts


def _time_of_day(rng: random.Random) -> float:
    """A fraction of the day: mostly business hours (UTC), some at any time."""
    if rng.random() < 0.8:
        hour = min(max(rng.gauss(14.5, 3.2), 0.0), 23.99)
    else:
        hour = rng.uniform(0.0, 24.0)
    return hour / 24


def _projects_in_turn(themes: list[Theme], total: int) -> list[int]:
    """Smooth weighted round robin: each project gets its share, spread evenly over time."""
    weights = [theme.weight for theme in themes]
    credit = [0.0] * len(themes)
    order = []
    for _ in range(total):
        for n, weight in enumerate(weights):
            credit[n] += weight
        chosen = max(range(len(themes)), key=lambda n: (credit[n], -n))
        credit[chosen] -= sum(weights)
        order.append(chosen)
    return order


def _session_total(
    *, sessions: int | None, steps: int | None, themes: list[Theme], seed: int
) -> int:
    minimum = MIN_SESSIONS_PER_PROJECT * len(themes)
    if steps is not None:
        return max(minimum, round(steps / _steps_per_session(themes, seed)))
    return max(minimum, sessions if sessions is not None else DEFAULT_SESSIONS)


def _steps_per_session(themes: list[Theme], seed: int, sample: int = 200) -> float:
    """The mean number of steps a session has, from a sample written but not stored."""
    steps = 0
    for theme in themes:
        for index in range(sample):
            writer = _SessionWriter(
                theme=theme, seed=seed, index=index, count=10**9, exhaust_by_cost=False
            )
            steps += writer.compose().steps
    return steps / (sample * len(themes))


# --- one session ----------------------------------------------------------------------------


class Kind(StrEnum):
    NORMAL = "normal"
    NEAR_CAP = "near-cap"
    EXHAUSTED = "exhausted"
    RUNAWAY = "runaway"


# The newest sessions of a project, counted from its last: the examples people look for.
KIND_FROM_END = {1: Kind.NEAR_CAP, 2: Kind.EXHAUSTED, 3: Kind.RUNAWAY}


@dataclass(slots=True)
class _Draft:
    """One session's events before it is placed in time: (ms after its start, raw event)."""

    external_id: str
    kind: Kind
    exhaust_by_cost: bool
    ended: bool
    events: list[tuple[int, dict[str, Any]]]
    opening: dict[str, Any]  # the session event; caps are added once its usage is known
    duration_ms: int
    turns: int
    steps: int


class _Slots(dict[str, str]):
    """Template values for one session, each drawn once: a conversation keeps talking about
    the same order, paper or pull request."""

    def __init__(self, vocab: Mapping[str, tuple[str, ...]], rng: random.Random) -> None:
        super().__init__()
        self._vocab = vocab
        self._rng = rng

    def __missing__(self, key: str) -> str:
        value = self._rng.choice(self._vocab[key])
        self[key] = value
        return value


def _digest(*parts: object) -> str:
    return hashlib.blake2s(":".join(map(str, parts)).encode(), digest_size=5).hexdigest()


def session_external_id(theme: Theme, seed: int, index: int) -> str:
    return f"{theme.session_prefix}-{_digest(seed, theme.slug, index)}"


def _user_id(theme: Theme, seed: int, index: int, count: int) -> str:
    pool = max(12, min(count, 10**6) // 5)
    return f"{theme.user_prefix}{1000 + int(_digest(seed, theme.slug, 'user', index), 16) % pool}"


def _weighted(rng: random.Random, choices: tuple[tuple[Llm, int], ...]) -> Llm:
    return rng.choices([llm for llm, _ in choices], weights=[w for _, w in choices])[0]


class _SessionWriter:
    """Writes one session: its turns, and per turn a pipeline of LLM calls (intent, filter,
    search, response; compress when the history grows long), with realistic token counts,
    prompt caching, durations and the occasional failed call."""

    def __init__(
        self,
        *,
        theme: Theme,
        seed: int,
        index: int,
        count: int,
        exhaust_by_cost: bool,
        said: Mapping[int, str] | None = None,
    ) -> None:
        self.theme = theme
        self.said = said or {}  # turn number → what the user says there (a memory's source)
        self.seed = seed
        self.index = index
        self.count = count
        self.exhaust_by_cost = exhaust_by_cost
        self.rng = random.Random(f"session:{seed}:{theme.slug}:{index}")
        self.external_id = session_external_id(theme, seed, index)
        self.kind = KIND_FROM_END.get(count - 1 - index, Kind.NORMAL)
        self.slots = _Slots(theme.vocab, self.rng)
        self.router = _weighted(self.rng, theme.routers)
        self.responder = _weighted(self.rng, theme.responders)
        canary = theme.canary if index % CANARY_EVERY == 3 else None
        self.intent_llm = canary or self.router
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.clock = 0  # ms since the session started
        self.step_no = 0
        self.steps = 0
        self.history = 0  # tokens of the conversation so far (besides the system prompt)
        self.cached = 0  # tokens of the prompt prefix the responder's provider has cached
        self.last_query = ""

    # the session

    def compose(self) -> _Draft:
        turns = self._turn_count()
        for number in range(1, turns + 1):
            if number > 1:
                self.clock += int(min(max(self.rng.lognormvariate(3.6, 0.9), 5), 900) * 1000)
            stuck = self.kind is Kind.RUNAWAY and number == turns
            self._turn(number, stuck=stuck)
        ended = self._ends()
        self._system_step()
        return _Draft(
            external_id=self.external_id,
            kind=self.kind,
            exhaust_by_cost=self.exhaust_by_cost,
            ended=ended,
            events=self.events,
            opening=self._opening(),
            duration_ms=self.clock,
            turns=turns,
            steps=self.steps,
        )

    def _turn_count(self) -> int:
        if self.kind in (Kind.NEAR_CAP, Kind.EXHAUSTED):
            return self.rng.randint(9, 12)
        if self.kind is Kind.RUNAWAY:
            return self.rng.randint(2, 5)
        return self.rng.choices(range(1, 13), weights=TURN_WEIGHTS)[0]

    def _ends(self) -> bool:
        """The examples and the newest sessions are still open; a few clients never say."""
        abandoned = self.rng.random() < 0.04
        newest = self.count - 1 - self.index < max(1, self.count * 3 // 100)
        return self.kind is Kind.NORMAL and not newest and not abandoned

    def _opening(self) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "session",
            "event_id": self._event_id("open"),
            "session_id": self.external_id,
            "user_id": _user_id(self.theme, self.seed, self.index, self.count),
            # attribution: which customer and plan (drawn apart from the session's stream)
            "tags": {
                "customer": CUSTOMERS[int(_digest(self.seed, self.index, "customer"), 16) % 6],
                "plan": PLANS[int(_digest(self.seed, self.index, "plan"), 16) % 3],
            },
        }
        rng = self.rng
        if rng.random() < 0.5:
            event["metadata"] = {
                "channel": rng.choice(self.theme.channels),
                "app_version": f"2.{rng.randint(3, 9)}.{rng.randint(0, 4)}",
                "locale": rng.choice(("en-GB", "en-US", "de-DE", "fr-FR")),
            }
        if self.kind is not Kind.NORMAL:
            event["metadata"] = {**event.get("metadata", {}), "scenario": self.kind.value}
        elif rng.random() < 0.08:
            event["token_cap"] = rng.choice((150_000, 200_000, 400_000))
        elif rng.random() < 0.05:
            event["cost_cap_usd"] = rng.choice(("2.50", "10.00"))
        if self.kind is Kind.NORMAL and self.index > 0 and rng.random() < 0.04:
            parent = self.index - rng.randint(1, min(self.index, 6))
            event["parent_session_id"] = session_external_id(self.theme, self.seed, parent)
            event["user_id"] = _user_id(self.theme, self.seed, parent, self.count)
        return event

    # a turn

    def _turn(self, number: int, *, stuck: bool) -> None:
        rng, theme = self.rng, self.theme
        searches = rng.random() < theme.search_rate
        filters = rng.random() < theme.filter_rate
        if searches:
            self.last_query = rng.choice(theme.queries).format_map(self.slots)
        asked = rng.choice(theme.openers if number == 1 else theme.follow_ups)
        asked = self.said.get(number, asked)  # drawn all the same: the stream stays as it was
        answer = theme.retry_loop.apology if stuck else rng.choice(theme.answers)
        subject = self.slots[theme.selection_key]  # what this conversation is about
        others = [v for v in theme.vocab[theme.selection_key] if v != subject]
        selections = [subject, *rng.sample(others, k=rng.randint(0, 2))]
        self.events.append(
            (
                self.clock,
                {
                    "type": "turn",
                    "event_id": self._event_id(f"t{number}"),
                    "session_id": self.external_id,
                    "turn": number,
                    "user_message": asked.format_map(self.slots),
                    "assistant_response": answer.format_map(self.slots),
                    "context": {
                        "focus": rng.choice(theme.focuses),
                        "selections": selections,
                        "last_query": self.last_query or None,
                    },
                },
            )
        )
        user_tokens = rng.randint(15, 160)
        self._intent(number, user_tokens)
        if stuck:
            self._retry_loop(number)
            return
        if filters:
            self._filter(number)
        retrieved = 0
        if searches:
            self._search(number)
            retrieved = rng.randint(*theme.retrieved_tokens)
        if number >= 6 and self.history > theme.compress_over:
            self._compress(number)
        output = self._respond(number, fresh=user_tokens + retrieved)
        self.history += user_tokens + retrieved + output

    def _intent(self, turn: int, user_tokens: int) -> None:
        rng = self.rng
        fresh = rng.randint(180, 600) + user_tokens
        output = rng.randint(4, 28)
        llm = self.intent_llm
        metadata = {"canary": True} if llm is not self.router else None
        self._call(
            "intent",
            llm,
            turn,
            fresh=fresh,
            output=output,
            duration_ms=rng.randint(180, 650) + output * llm.ms_per_output_token,
            metadata=metadata,
        )

    def _filter(self, turn: int) -> None:
        rng = self.rng
        output = rng.randint(30, 200)
        self._call(
            "filter",
            self.router,
            turn,
            fresh=rng.randint(600, 2400),
            output=output,
            duration_ms=rng.randint(250, 700) + output * self.router.ms_per_output_token,
        )

    def _search(self, turn: int) -> None:
        rng = self.rng
        self._call(
            "search",
            demo_data().embedding,
            turn,
            fresh=rng.randint(8, 90),
            output=0,
            duration_ms=rng.randint(40, 260),
            metadata={"index": f"{self.theme.slug}-docs", "results": rng.randint(3, 20)},
        )

    def _compress(self, turn: int) -> None:
        rng = self.rng
        output = rng.randint(400, 1100)
        self._call(
            "compress",
            self.router,
            turn,
            fresh=self.history + rng.randint(300, 600),
            output=output,
            duration_ms=rng.randint(500, 1200) + output * self.router.ms_per_output_token,
        )
        self.history = output  # the summary replaces the conversation
        self.cached = 0

    def _respond(self, turn: int, *, fresh: int) -> int:
        """The answer: the prompt is the system prompt, the history and what is new this turn;
        what the provider has cached of it is read from the cache. Returns the output."""
        rng, llm = self.rng, self.responder
        prefix = self.theme.system_prompt_tokens + self.history
        reasoning = rng.randint(300, 6000) if llm.reasoning else 0
        output = rng.randint(*self.theme.output_tokens) + reasoning
        cached, written = self._cache_use(prefix)
        duration = rng.randint(300, 900) + output * llm.ms_per_output_token + fresh // 40
        self._call(
            "response",
            llm,
            turn,
            fresh=fresh + prefix - cached - written,
            output=output,
            cached=cached,
            written=written,
            reasoning=reasoning,
            duration_ms=duration,
        )
        return output - reasoning

    def _cache_use(self, prefix: int) -> tuple[int, int]:
        """(read from cache, written to cache) of a prompt prefix; updates what is cached.

        Anthropic caches explicitly up to a breakpoint after the history: what was cached is
        read, the rest of the prefix written. OpenAI and Gemini cache implicitly, in blocks,
        what an earlier call sent; they charge no writes."""
        rng, llm = self.rng, self.responder
        system = self.theme.system_prompt_tokens
        if llm.shape is Shape.FIELDS:
            if not self.cached and rng.random() < 0.6:
                self.cached = system  # warm: another session used the same system prompt
            read = min(self.cached, prefix)
            self.cached = prefix
            return read, prefix - read
        block = 128 if llm.shape is Shape.OPENAI else 256
        seen = self.cached
        self.cached = prefix
        read = (min(seen, prefix) // block) * block if seen >= 1024 else 0
        return read, 0

    def _retry_loop(self, turn: int) -> None:
        """The same step failing again and again with the same arguments: a runaway."""
        rng, loop = self.rng, self.theme.retry_loop
        attempts = rng.randint(*RETRY_LOOP_ATTEMPTS)
        for attempt in range(1, attempts + 1):
            output = rng.randint(40, 120)
            self._step(
                loop.step_type,
                loop.llm,
                turn,
                fresh=rng.randint(900, 1400),
                output=output,
                duration_ms=rng.randint(300, 900),
                success=False,
                error=loop.error,
                metadata={"attempt": attempt},
            )
            self.clock += rng.randint(200, 1500)  # a fixed, short back-off

    def _system_step(self) -> None:
        """Now and then a background job reports usage without a session."""
        rng = self.rng
        if rng.random() >= SYSTEM_STEP_RATE:
            return
        at = rng.randint(0, max(self.clock, 1))
        if rng.random() < 0.6:
            step_type, llm = "search", demo_data().embedding
            fresh, output = rng.randint(2000, 30000), 0
            job = "reindex"
        else:
            step_type, llm = "compress", self.router
            fresh, output, job = rng.randint(3000, 12000), rng.randint(300, 900), "nightly_digest"
        event = {
            "type": "step",
            "event_id": f"demo-{self.seed}-{self.theme.slug}-system-{self.index}",
            "step_type": step_type,
            "model": llm.model,
            "provider": llm.provider,
            "duration_ms": rng.randint(200, 4000),
            "metadata": {"job": job},
            **_usage_fields(llm, fresh=fresh, output=output),
        }
        self.events.append((at, event))
        self.steps += 1

    # calls

    def _call(
        self,
        step_type: str,
        llm: Llm,
        turn: int,
        *,
        fresh: int,
        output: int,
        duration_ms: int,
        cached: int = 0,
        written: int = 0,
        reasoning: int = 0,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """One LLM call; about one in fifty fails first (nothing billed) and is retried."""
        rng = self.rng
        if rng.random() < FAILURE_RATE:
            error = rng.choice(demo_data().transient_errors[llm.provider])
            timed_out = "timed out" in error
            self._step(
                step_type,
                llm,
                turn,
                fresh=0,
                output=0,
                duration_ms=rng.randint(30_000, 60_000) if timed_out else rng.randint(80, 900),
                success=False,
                error=error,
                metadata={**(metadata or {}), "attempt": 1},
            )
            self.clock += rng.randint(500, 4000)
            metadata = {**(metadata or {}), "attempt": 2}
        self._step(
            step_type,
            llm,
            turn,
            fresh=fresh,
            output=output,
            cached=cached,
            written=written,
            reasoning=reasoning,
            duration_ms=duration_ms,
            metadata=metadata,
        )

    def _step(
        self,
        step_type: str,
        llm: Llm,
        turn: int,
        *,
        fresh: int,
        output: int,
        duration_ms: int,
        cached: int = 0,
        written: int = 0,
        reasoning: int = 0,
        success: bool = True,
        error: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.step_no += 1
        event: dict[str, Any] = {
            "type": "step",
            "event_id": self._event_id(f"t{turn}-s{self.step_no}"),
            "session_id": self.external_id,
            "turn": turn,
            "step_type": step_type,
            # every other call under the answer's dated name; a retry loop's failures keep
            # one name (the same step again and again)
            "model": llm.answered_as
            if llm.answered_as and success and self.step_no % 2
            else llm.model,
            "provider": llm.provider,
            "duration_ms": duration_ms,
            **_usage_fields(
                llm,
                fresh=fresh,
                output=output,
                cached=cached,
                written=written,
                reasoning=reasoning,
            ),
        }
        if not success:
            event["success"] = False
            event["error"] = error
        if metadata:
            event["metadata"] = metadata
        self.events.append((self.clock, event))
        self.clock += duration_ms + self.rng.randint(5, 80)
        self.steps += 1

    def _event_id(self, suffix: str) -> str:
        return f"demo-{self.seed}-{self.external_id}-{suffix}"


def _usage_fields(
    llm: Llm,
    *,
    fresh: int,
    output: int,
    cached: int = 0,
    written: int = 0,
    reasoning: int = 0,
) -> dict[str, Any]:
    """A call's tokens as its provider reports them. `fresh` is the uncached input, `output`
    includes `reasoning`."""
    if llm.shape is Shape.OPENAI:
        usage: dict[str, Any] = {
            "prompt_tokens": fresh + cached,
            "completion_tokens": output,
            "total_tokens": fresh + cached + output,
        }
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        if reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return {"usage": usage}
    if llm.shape is Shape.GEMINI:
        usage = {
            "promptTokenCount": fresh + cached,
            "candidatesTokenCount": output - reasoning,
            "totalTokenCount": fresh + cached + output,
        }
        if cached:
            usage["cachedContentTokenCount"] = cached
        if reasoning:
            usage["thoughtsTokenCount"] = reasoning
        return {"usage": usage}
    fields = {"input_tokens": fresh, "output_tokens": output}
    if cached:
        fields["cache_read_input_tokens"] = cached
    if written:
        fields["cache_creation_input_tokens"] = written
    if reasoning:
        fields["reasoning_tokens"] = reasoning
    return fields


# --- placing a session in time and sending it -----------------------------------------------

_EVENT_MODELS: dict[str, type[SessionEvent] | type[TurnEvent] | type[StepEvent]] = {
    "session": SessionEvent,
    "turn": TurnEvent,
    "step": StepEvent,
}


def _session_events(
    draft: _Draft, *, start: datetime, table: RateTable, project: Project
) -> list[Event]:
    """The session's validated events, timed from `start`; caps for the budget examples. (A
    retry loop is flagged as runaway by ingest's own rules as it is stored.)"""
    body: list[Event] = []
    for offset, raw in draft.events:
        raw["timestamp"] = start + timedelta(milliseconds=offset)
        body.append(_EVENT_MODELS[raw["type"]].model_validate(raw))
    opening = {**draft.opening, "timestamp": start}
    if draft.kind in (Kind.NEAR_CAP, Kind.EXHAUSTED):
        steps = [e for e in body if isinstance(e, StepEvent) and e.session_id is not None]
        opening.update(_example_caps(draft, steps, table, project))
    events: list[Event] = [SessionEvent.model_validate(opening), *body]
    end = start + timedelta(milliseconds=draft.duration_ms + 1000)
    if draft.ended:
        events.append(
            SessionEvent.model_validate(
                {
                    "type": "session",
                    "event_id": f"{opening['event_id'].removesuffix('-open')}-end",
                    "session_id": draft.external_id,
                    "ended": True,
                    "timestamp": end,
                }
            )
        )
    return events


def _example_caps(
    draft: _Draft, steps: list[StepEvent], table: RateTable, project: Project
) -> dict[str, Any]:
    """Caps that put a budget example where it belongs once its steps are in: near-cap midway
    between the soft warning and the cap, exhausted at its last turn (by tokens, or in every
    other project by USD). Priced exactly as ingest will price them."""
    tokens, cost = _usage_of(steps, table)
    roomy_cost_cap = max(Decimal("1.00"), (cost * 3).quantize(CENTS, rounding=ROUND_CEILING))
    if draft.kind is Kind.NEAR_CAP:
        warn = caps_for(project=project, token_cap=None, cost_cap_usd=None).warn_at_pct
        midway = (1 + warn) / 2
        token_cap = int((Decimal(tokens) / midway).to_integral_value(rounding=ROUND_CEILING))
        return {"token_cap": max(token_cap, tokens + 1), "cost_cap_usd": roomy_cost_cap}
    cost_cap = (cost * EXHAUSTED_AT).quantize(CAP_QUANTUM, rounding=ROUND_DOWN)
    if draft.exhaust_by_cost and cost_cap > 0:
        return {"token_cap": tokens * 3 + 1000, "cost_cap_usd": cost_cap}
    token_cap = max(1, int(tokens * EXHAUSTED_AT))
    return {"token_cap": token_cap, "cost_cap_usd": roomy_cost_cap}


def _usage_of(steps: list[StepEvent], table: RateTable) -> tuple[int, Decimal]:
    """tokens_used and USD of these steps."""
    tokens, cost = 0, Decimal(0)
    for step in steps:
        t = step.tokens()
        tokens += t.input_tokens + t.output_tokens
        cost += table.price(
            model=step.model,
            provider=step.provider or "",
            when=step.timestamp or timezone.now(),
            input_tokens=t.input_tokens,
            output_tokens=t.output_tokens,
            cache_read_input_tokens=t.cache_read_input_tokens,
            cache_creation_input_tokens=t.cache_creation_input_tokens,
            cache_creation_1h_input_tokens=t.cache_creation_1h_input_tokens,
        ).total
    return tokens, cost


@dataclass
class _ProjectFeed:
    """A project's events on their way to ingest, in batches of up to MAX_EVENTS."""

    project: Project
    tally: _Tally
    now: datetime
    pending: list[Event] = field(default_factory=list)
    added: int = 0
    stored: int = 0

    def add(self, events: list[Event]) -> None:
        self.pending.extend(events)
        self.added += len(events)
        while len(self.pending) >= MAX_EVENTS:
            self._ingest(self.pending[:MAX_EVENTS])
            del self.pending[:MAX_EVENTS]

    def close(self) -> None:
        if self.pending:
            self._ingest(self.pending)
            self.pending = []

    def _ingest(self, batch: list[Event]) -> None:
        result = events_ingest(project=self.project, events=batch, now=self.now)
        self.stored += len(batch)
        self.tally.events += len(batch)
        self.tally.accepted += result.accepted
        self.tally.duplicates += result.duplicates
        self.tally.runaways_flagged += sum(
            event.kind == BudgetEvent.Kind.RUNAWAY for event in result.budget_events
        )


# --- memories -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MemorySource:
    """The turn that says a memory idea: the idea's place in its theme, its sentence, and when
    the turn starts."""

    position: int
    said: str
    at: datetime


def _memory_sources(
    project: int,
    *,
    slots: list[_Slot],
    themes: list[Theme],
    per_project: list[int],
    seed: int,
    window: _Window,
) -> dict[tuple[int, int], _MemorySource]:
    """(session index, turn number) → the memory idea said there: the newest turns of the
    project's newest sessions, one idea a turn, given in the theme's order from the oldest of
    those turns to the newest, so a correction (listed after what it corrects) is said, and
    dated, after it. The sessions are composed here only for their turns' times (composing
    again with the sentences gives the very same session). Too few turns in all (a tiny demo):
    the first ideas go without a source."""
    ideas = themes[project].memories
    turns: list[tuple[datetime, int, int]] = []
    for slot in sorted((s for s in slots if s.project == project), key=lambda s: -s.index):
        if len(turns) >= len(ideas):
            break
        draft = _writer(slot, themes=themes, per_project=per_project, seed=seed).compose()
        start = _start(slot, draft, window)
        turns.extend(
            (start + timedelta(milliseconds=offset), slot.index, raw["turn"])
            for offset, raw in draft.events
            if raw["type"] == "turn"
        )
    hosts = sorted(turns)[-len(ideas) :] if ideas else []
    first = len(ideas) - len(hosts)
    return {
        (index, number): _MemorySource(position=first + n, said=ideas[first + n].said, at=at)
        for n, (at, index, number) in enumerate(hosts)
    }


DEMO_REVIEWER = "demo reviewer"  # who approves the approved ideas (no login)
MEMORY_SOURCES = {
    Memory.Type.USER: Memory.Source.USER_STATED,
    Memory.Type.FEEDBACK: Memory.Source.USER_STATED,
    Memory.Type.PROJECT: Memory.Source.AGENT_INFERRED,
    Memory.Type.REFERENCE: Memory.Source.TOOL_OUTPUT,
}


# one commit for a project's memories (each service a savepoint in it): on SQLite a commit
# each would take ten times as long
@transaction.atomic
def _memories_seed(
    project: Project,
    theme: Theme,
    seed: int,
    *,
    sources: Mapping[tuple[int, int], _MemorySource],
    unsourced_at: datetime,
) -> int:
    """The memories the project's agent proposed from the turns that said them (`sources`),
    each dated just after its turn: most pending review, a few approved by a demo reviewer,
    each through the services with its history. One already there (same content) is not
    proposed again; one without a source turn is dated `unsourced_at`, before every turn."""
    existing = set(Memory.objects.filter(project=project).values_list("content", flat=True))
    where = {
        source.position: (session_external_id(theme, seed, index), number)
        for (index, number), source in sources.items()
    }
    turns = {
        (turn.session.external_id, turn.number): turn
        for turn in Turn.objects.filter(
            project=project, session__external_id__in={external for external, _ in where.values()}
        ).select_related("session")
    }
    rng = random.Random(f"memories:{seed}:{project.slug}")
    now = timezone.now()
    created = 0
    for position, idea in enumerate(theme.memories):
        importance = Decimal(rng.randint(300, 950)) / 1000  # drawn for every idea: same stream
        if idea.content in existing:
            continue
        turn = turns.get(where[position]) if position in where else None
        proposed_at = turn.started_at + timedelta(seconds=5) if turn else unsourced_at
        user_id = turn.session.user_id if turn else ""
        memory = proposals.candidate_propose(
            project=project,
            fields=MemoryFields.of(
                type=idea.type,
                content=idea.content,
                scope=f"user:{user_id}" if idea.type == "user" and user_id else "project",
                importance=importance,
                tags=["demo", idea.type],
                ttl_days=90 if idea.type == "reference" else None,
            ),
            source=MEMORY_SOURCES[Memory.Type(idea.type)],
            session=turn.session if turn else None,
            turn=turn,
            evidence=idea.said,
            proposed_by=DETECTOR,
            now=proposed_at,
        )
        if memory is None or memory.times_proposed > 1:
            continue  # rejected before, or a repeat of a memory there already: nothing new
        created += 1
        if idea.approved:
            decisions.memory_approve(
                memory,
                by=None,
                actor_name=DEMO_REVIEWER,
                now=min(proposed_at + timedelta(hours=3), now),
            )
    return created
