"""The period budgets' pages: each budget in its current period with its forecast, the
sessions it stops, and one budget's past periods, crossings and held sessions; and the alert
channels whose deliveries fail (here and on the overview)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Max, Min, Q

from costboard.budgets.alert_senders import alert_addresses
from costboard.budgets.holds import budget_sessions
from costboard.budgets.periods import (
    Forecast,
    LedgerSum,
    MemberStanding,
    budget_days,
    budgets_whole,
    forecast,
    ledger_sums,
    members_nearest_limit,
    per_member,
    period_bounds,
    rolling,
    state_of,
    window_bounds,
    zone,
)
from costboard.dashboards.selectors.shared import ZERO
from costboard.egress import redirect_pathless
from costboard.models import (
    AlertDelivery,
    BudgetEvent,
    PeriodBudget,
    Project,
    Session,
    WebhookEndpoint,
)
from costboard.models.alerts import shown_target


@dataclass(frozen=True)
class BudgetRow:
    """A period budget in its current period, as the overview lists it."""

    budget: PeriodBudget
    state: str
    tokens_used: int
    cost_usd: Decimal
    forecast: Forecast | None
    period_end: datetime | None
    period_start: datetime
    # its figures as `budgets_whole` read them (None: nothing counted toward it yet)
    whole: LedgerSum | None = None

    @property
    def forecast_usd(self) -> Decimal | None:
        return self.forecast.cost_usd if self.forecast is not None else None

    @property
    def per_member(self) -> bool:
        """Its limits hold each member (user, key, tag value); its spend is all of theirs."""
        return per_member(self.budget)

    @property
    def used_pct(self) -> int | None:
        """The larger share of a limit used so far (tokens or USD), as a whole percentage
        rounded down, as every percentage the pages show (99.9 % used is not yet 100 %, which
        a budget near its limit would read as); None for a per-member budget, whose limits
        are each member's (its page lists them)."""
        if self.per_member:
            return None
        shares = []
        if self.budget.token_limit:
            shares.append(Decimal(self.tokens_used) / self.budget.token_limit * 100)
        if self.budget.cost_limit_usd:
            shares.append(self.cost_usd / self.budget.cost_limit_usd * 100)
        return int(max(shares)) if shares else None

    @property
    def forecast_over(self) -> bool:
        """At its rate so far, the period ends past its USD limit."""
        limit = self.budget.cost_limit_usd
        return limit is not None and self.forecast_usd is not None and self.forecast_usd > limit


def budgets_current(*, project_ids: list[int], now: datetime) -> list[BudgetRow]:
    """The projects' period budgets in their current periods, with their forecasts (three
    queries)."""
    budgets = list(
        PeriodBudget.objects.filter(project_id__in=project_ids)
        .select_related("project")
        .order_by("project__name", "name", "pk")
    )
    return _budget_rows(budgets, now)


def _budget_rows(budgets: list[PeriodBudget], now: datetime) -> list[BudgetRow]:
    """Each budget in its current period as a whole (`budgets_whole`, the API's figures
    too: a per-member budget's members summed, its state the worst of theirs), with its
    forecast (two queries; and two for rolling budgets)."""
    wholes = budgets_whole(budgets, now)
    days = budget_days(budgets, now)
    rows = []
    for b in budgets:
        whole = wholes[b.pk]
        start: datetime
        end: datetime | None
        if rolling(b):  # its window now
            start, end = window_bounds(b.window_hours or 1, now)
        else:
            start, end = period_bounds(b.period, b.timezone, now)
        tokens = whole.tokens_used if whole is not None else 0
        cost = whole.cost_usd if whole is not None else ZERO
        state = whole.state if whole is not None else state_of(b, 0, ZERO)
        rows.append(
            BudgetRow(
                budget=b,
                state=state,
                tokens_used=tokens,
                cost_usd=cost,
                # a per-member budget's forecasts are its members' (each its own days)
                forecast=None
                if per_member(b) or rolling(b)
                else forecast(
                    b,
                    cost,
                    start=start,
                    end=end,
                    days=days[b.pk],
                    now=now,
                    exhausted_at=whole.exhausted_at if whole is not None else None,
                ),
                period_end=end,
                period_start=start,
                whole=whole,
            )
        )
    return rows


def budget_in_scope(*, project_ids: list[int], budget_id: int) -> PeriodBudget | None:
    """One period budget of these projects (None: none such, or another team's)."""
    return (
        PeriodBudget.objects.select_related("project")
        .filter(pk=budget_id, project_id__in=project_ids)
        .first()
    )


def budgets_stopped_counts(
    *, rows: Sequence[BudgetRow], stops: Sequence[PeriodBudget]
) -> dict[int, int]:
    """For each of `stops` among `rows`: how many sessions it holds that were active in its
    current period (one query)."""
    starts = {row.budget.pk: row.period_start for row in rows}
    # an api_key budget stops its key's calls, never a session (costboard/budgets/holds.py)
    counting = [b for b in stops if b.pk in starts and b.scope != PeriodBudget.Scope.API_KEY]
    if not counting:
        return {}
    counts = Session.objects.filter(project_id__in={b.project_id for b in counting}).aggregate(
        **{
            f"b{b.pk}": Count("pk", filter=budget_sessions(b) & Q(last_active_at__gte=starts[b.pk]))
            for b in counting
        }
    )
    return {b.pk: counts[f"b{b.pk}"] or 0 for b in counting}


PAST_PERIODS_SHOWN = 24
BUDGET_EVENTS_SHOWN = 50
STOPPED_SESSIONS_SHOWN = 50


@dataclass(frozen=True)
class PeriodSpend:
    """One period of a budget as its ledger has it, its days in the budget's timezone; a
    rolling budget's one "period" is its window now (`_window_spend`)."""

    first_day: date
    last_day: date | None  # None: a total budget, which never ends
    current: bool
    state: str
    tokens_used: int
    cost_usd: Decimal
    warned_at: datetime | None
    exhausted_at: datetime | None


def _period_spend(budget: PeriodBudget, ledger: LedgerSum, current_start: datetime) -> PeriodSpend:
    tz = zone(budget.timezone)
    end = ledger.period_end
    return PeriodSpend(
        first_day=ledger.period_start.astimezone(tz).date(),
        last_day=(end - timedelta(microseconds=1)).astimezone(tz).date() if end else None,
        current=ledger.period_start == current_start,
        state=ledger.state,
        tokens_used=ledger.tokens_used,
        cost_usd=ledger.cost_usd,
        warned_at=ledger.warned_at,
        exhausted_at=ledger.exhausted_at,
    )


def _window_spend(row: BudgetRow) -> PeriodSpend:
    """A rolling budget's window now, as /budgets/ and the API read it (`budgets_whole`): its
    ledgers keep one row per member whatever the window (their period_start the epoch), with
    what the last batch decided, which is not the window once it has moved on."""
    whole = row.whole
    return PeriodSpend(
        first_day=row.period_start.date(),
        last_day=(row.period_end or row.period_start).date(),
        current=True,
        state=row.state,
        tokens_used=row.tokens_used,
        cost_usd=row.cost_usd,
        warned_at=whole.warned_at if whole is not None else None,
        exhausted_at=whole.exhausted_at if whole is not None else None,
    )


@dataclass(frozen=True)
class BudgetDetail:
    """One period budget's page: its current period, its periods newest first (spend from
    its ledgers), its latest crossings and the sessions it holds now."""

    row: BudgetRow
    periods: list[PeriodSpend]
    events: list[BudgetEvent]
    holding: bool  # an exhausted stop-budget: its sessions are told to stop
    stopped: list[Session]  # those active this period, the latest first
    stopped_total: int
    # a per-member budget's members nearest their limit this period (members_nearest_limit)
    members: list[MemberStanding] = field(default_factory=list)


def budget_detail(
    *, budget: PeriodBudget, stops: Sequence[PeriodBudget], now: datetime
) -> BudgetDetail:
    """`budget`'s page (five queries; a rolling budget's period is its window, read with its
    row). `stops`: its project's stop-budgets in force
    (holds.stops_in_force)."""
    row = _budget_rows([budget], now)[0]
    if rolling(budget):
        periods = [_window_spend(row)]
    else:
        periods = [
            _period_spend(budget, ledger, row.period_start)
            for ledger in ledger_sums(Q(budget=budget), newest=PAST_PERIODS_SHOWN)
        ]
    events = list(
        BudgetEvent.objects.filter(ledger__budget=budget)
        .select_related("ledger")
        .order_by("-at", "-id")[:BUDGET_EVENTS_SHOWN]
    )
    stop = next((b for b in stops if b.pk == budget.pk), None)
    holding = stop is not None
    stopped: list[Session] = []
    total = 0
    if stop is not None:
        active = Session.objects.filter(budget_sessions(stop), last_active_at__gte=row.period_start)
        total = active.count()
        stopped = list(active.order_by("-last_active_at", "-id")[:STOPPED_SESSIONS_SHOWN])
    return BudgetDetail(
        row=row,
        periods=periods,
        events=events,
        holding=holding,
        stopped=stopped,
        stopped_total=total,
        members=members_nearest_limit(budget, now) if per_member(budget) else [],
    )


# --- alert channels whose deliveries fail ----------------------------------------------------

# how far back the delivery log is read for a channel's last outcomes
ALERT_FAILURES_DAYS = 30


@dataclass(frozen=True)
class ChannelFailing:
    """A project's alert channel (one target of it) whose latest attempt failed: its alerts
    are not arriving. Gone once an alert to it is delivered."""

    project: Project
    channel: str  # "webhook", "email", "slack", "pagerduty"
    target: str  # as shown: no Slack or webhook path, a routing key by its last 4 characters
    since: datetime  # the first alert that failed after the last one delivered
    error: str  # the latest failed attempt's short reason (ours, never the receiver's reply)
    retrying: bool  # the latest failed delivery is still pending: retried on its schedule


def _shown(channel: str, target: str) -> str:
    if channel == AlertDelivery.Channel.WEBHOOK:  # a path may hold a token (Teams, Discord)
        return shown_target(AlertDelivery.Channel.SLACK, target)
    return shown_target(channel, target)


def _targets_now(projects: Sequence[Project]) -> set[tuple[int, str, str]]:
    """Each (project, channel, target) the projects send their alerts to now: a target
    changed or removed since is no longer the project's to fix."""
    webhooks = WebhookEndpoint.objects.filter(project__in=projects, active=True)
    targets = {(pid, "webhook", url) for pid, url in webhooks.values_list("project_id", "url")}
    for project in projects:
        targets.update((project.pk, "email", a) for a in alert_addresses(project.alert_emails))
        if project.slack_webhook_url:
            targets.add((project.pk, "slack", project.slack_webhook_url))
        if project.pagerduty_routing_key:
            targets.add((project.pk, "pagerduty", project.pagerduty_routing_key))
    return targets


def alert_channels_failing(*, project_ids: list[int], now: datetime) -> list[ChannelFailing]:
    """The alert channels of these projects whose latest attempt (in the last
    ALERT_FAILURES_DAYS) failed — a failure retried counts from its first attempt — each with
    since when and the last error; a channel with an alert delivered since is not one, nor a
    target the project no longer sends to. One query when none fails, five at most, whatever the
    size of the log."""
    failed = Q(status=AlertDelivery.Status.FAILED) | (
        Q(status=AlertDelivery.Status.PENDING) & ~Q(error="")
    )
    log = AlertDelivery.objects.filter(
        project_id__in=project_ids,
        created_at__gte=now - timedelta(days=ALERT_FAILURES_DAYS),
        last_attempt_at__isnull=False,
    )
    outcomes = (
        log.values_list("project_id", "channel", "target")
        .annotate(
            delivered=Max("delivered_at", filter=Q(status=AlertDelivery.Status.DELIVERED)),
            failed=Max("last_attempt_at", filter=failed),
        )
        .order_by()
    )
    failing = {
        (project_id, channel, target): delivered
        for project_id, channel, target, delivered, last_failed in outcomes
        if last_failed is not None and (delivered is None or last_failed > delivered)
    }
    if not failing:  # the page's one query when every channel works
        return []
    projects = {p.pk: p for p in Project.objects.filter(pk__in={k[0] for k in failing})}
    current = _targets_now(list(projects.values()))
    failing = {key: delivered for key, delivered in failing.items() if key in current}
    if not failing:
        return []
    since_last_delivered = Q()
    for (project_id, channel, target), delivered in failing.items():
        group = Q(project_id=project_id, channel=channel, target=target)
        since_last_delivered |= group & Q(last_attempt_at__gt=delivered) if delivered else group
    failures = log.filter(failed, since_last_delivered)
    bounds = {
        (project_id, channel, target): (first, last)
        for project_id, channel, target, first, last in failures.values_list(
            "project_id", "channel", "target"
        )
        .annotate(first=Min("created_at"), last=Max("last_attempt_at"))
        .order_by()
    }
    at_last = Q()
    for (project_id, channel, target), (_, last) in bounds.items():
        at_last |= Q(project_id=project_id, channel=channel, target=target, last_attempt_at=last)
    latest = {
        (project_id, channel, target): (error, status == AlertDelivery.Status.PENDING)
        for project_id, channel, target, error, status in failures.filter(at_last)
        .order_by("pk")
        .values_list("project_id", "channel", "target", "error", "status")
    }
    found = []
    for key, delivered in failing.items():
        if key not in latest:  # delivered between the queries
            continue
        project_id, channel, target = key
        first = bounds[key][0]
        error, retrying = latest[key]
        found.append(
            ChannelFailing(
                project=projects[project_id],
                channel=channel,
                target=_shown(channel, target),
                since=max(first, delivered) if delivered else first,
                error=redirect_pathless(error),  # where a URL redirects: as the target
                retrying=retrying,
            )
        )
    return sorted(found, key=lambda f: (f.project.name, f.channel, f.target))
