"""Session caps and the `<budget>` object: which caps apply to a session, and how its budget
reads in the API.

Caps come from the session, else its project (its `system` caps for the `system` session),
else the environment (docs/budgets.md, "Caps"). What state they put a session in is decided
by the budget engine (engine.py), by its one threshold rule (`limits_reached`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, Protocol, cast

from django.conf import settings
from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from costboard.budgets.engine import limits_reached
from costboard.json_types import Count, IsoTime, Money
from costboard.models import SYSTEM_SESSION_ID, Project, Session, usd


@dataclass(frozen=True, slots=True)
class Caps:
    token_cap: int
    cost_cap_usd: Decimal
    warn_at_pct: Decimal

    def warned(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return limits_reached(
            tokens_used, cost_usd, self.token_cap, self.cost_cap_usd, self.warn_at_pct
        )

    def exhausted(self, tokens_used: int, cost_usd: Decimal) -> bool:
        return limits_reached(tokens_used, cost_usd, self.token_cap, self.cost_cap_usd)

    def reaches(self, tokens_used: int, cost_usd: Decimal, share: Decimal) -> bool:
        return limits_reached(tokens_used, cost_usd, self.token_cap, self.cost_cap_usd, share)

    def describe(self) -> dict[str, object]:
        """The caps as a budget event's detail records them."""
        return {
            "token_cap": self.token_cap,
            "cost_cap_usd": str(self.cost_cap_usd),
            "warn_at_pct": str(self.warn_at_pct),
        }


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def environment_caps() -> Caps:
    """The environment's defaults (COSTBOARD_SESSION_TOKEN_CAP, …_COST_CAP_USD, …_WARN_AT_PCT)."""
    return Caps(
        token_cap=settings.COSTBOARD_SESSION_TOKEN_CAP,
        cost_cap_usd=settings.COSTBOARD_SESSION_COST_CAP_USD,
        warn_at_pct=settings.COSTBOARD_WARN_AT_PCT,
    )


def caps_for(
    *,
    project: Project,
    token_cap: int | None,
    cost_cap_usd: Decimal | None,
    system: bool = False,
    defaults: Caps | None = None,
) -> Caps:
    """The session's own caps, else (for the `system` session) the project's system caps,
    else the project's session caps, else the environment's (`defaults`: other ones)."""
    system_tokens = project.system_token_cap if system else None
    system_cost = project.system_cost_cap_usd if system else None
    env = defaults or environment_caps()
    return Caps(
        token_cap=_first(token_cap, system_tokens, project.token_cap, env.token_cap),
        cost_cap_usd=_first(cost_cap_usd, system_cost, project.cost_cap_usd, env.cost_cap_usd),
        warn_at_pct=project.warn_at_pct or env.warn_at_pct,
    )


CapsOf = Callable[[int | None, Decimal | None, bool], Caps]


class CapsMemo:
    """caps_for over one project, remembered by (token cap, cost cap, system): a batch asks
    it for each of up to a thousand sessions, most of which share the project's caps."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.defaults = environment_caps()
        self.known: dict[tuple[int | None, Decimal | None, bool], Caps] = {}

    def __call__(self, token_cap: int | None, cost_cap_usd: Decimal | None, system: bool) -> Caps:
        key = (token_cap, cost_cap_usd, system)
        caps = self.known.get(key)
        if caps is None:
            caps = self.known[key] = caps_for(
                project=self.project,
                token_cap=token_cap,
                cost_cap_usd=cost_cap_usd,
                system=system,
                defaults=self.defaults,
            )
        return caps


def session_caps(session: Session, project: Project | None = None) -> Caps:
    return caps_for(
        project=project or session.project,
        token_cap=session.token_cap,
        cost_cap_usd=session.cost_cap_usd,
        system=session.is_system,
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


BudgetState = Literal["ok", "warning", "exhausted"]


# `<budget>` (docs/api.md): the one type of what `session_budget` builds and of what the
# OpenAPI document shows (costboard/api/schemas.py names it in the answers). Unknown keys
# allowed, as in every answer: a field added reaches the client before the type names it.
@with_config(ConfigDict(extra="allow"))
class SessionBudget(TypedDict):
    """A session's budget: `costboard.budgets.caps.session_budget`, field for field."""

    session_id: str
    state: Annotated[
        BudgetState,
        Field(description="warning past warn_at_pct of a cap; exhausted at a cap: stop"),
    ]
    runaway: Annotated[
        bool, Field(description="a runaway rule fired (burn rate, retry loop, overrun)")
    ]
    tokens_used: Annotated[Count, Field(description="input + output tokens")]
    token_cap: Count
    cost_usd: Money
    cost_cap_usd: Money
    turns: Count
    steps: Count
    warned_at: IsoTime | None
    exhausted_at: IsoTime | None
    stopped_by: Annotated[
        str | None,
        Field(
            description='what stops it: "session" (its caps), "runaway", "budget:<id>" (an '
            "exhausted stop-budget above it), or null",
            json_schema_extra={"pattern": r"^(session|runaway|budget:[0-9]+)$"},
        ),
    ]


class BudgetFields(Protocol):
    """What a budget is read from: a Session, or ingest's lighter row of the same fields."""

    @property
    def external_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def runaway(self) -> bool: ...
    @property
    def tokens_used(self) -> int: ...
    @property
    def token_cap(self) -> int | None: ...
    @property
    def cost_usd(self) -> Decimal: ...
    @property
    def cost_cap_usd(self) -> Decimal | None: ...
    @property
    def turn_count(self) -> int: ...
    @property
    def step_count(self) -> int: ...
    @property
    def warned_at(self) -> datetime | None: ...
    @property
    def exhausted_at(self) -> datetime | None: ...


def stop_verdict(
    *,
    state: str,
    runaway: bool,
    tokens_used: int,
    cost_usd: Decimal,
    caps: Caps,
    stopped_by_budget: int | None,
) -> tuple[str, str | None]:
    """A session's state as told to its agent, and what stops it (`stopped_by`): its own
    exhaustion first ("session", or "runaway" when a runaway holds it under its caps), else an
    exhausted stop-budget above it ("budget:<id>", which makes it `exhausted`). The API's
    answers and the pages both read a session's state through this. A stored state below
    what its caps now say (a project's or the environment's caps lowered, its sessions not
    yet decided again by the recheck) reads as the caps say: never `ok` past a cap shown."""
    if state != Session.State.EXHAUSTED and caps.exhausted(tokens_used, cost_usd):
        state = Session.State.EXHAUSTED
    elif state == Session.State.OK and caps.warned(tokens_used, cost_usd):
        state = Session.State.WARNING
    if state == Session.State.EXHAUSTED:
        over = caps.exhausted(tokens_used, cost_usd)
        return state, "session" if over or not runaway else "runaway"
    if stopped_by_budget is not None:
        return Session.State.EXHAUSTED, f"budget:{stopped_by_budget}"
    return state, None


def session_budget(
    session: BudgetFields,
    project: Project,
    *,
    stopped_by_budget: int | None = None,
    caps_of: CapsOf | None = None,
) -> SessionBudget:
    """`<budget>`; `stopped_by_budget`: an exhausted stop-budget above the session, which
    makes it `exhausted` (stopped_by "budget:<id>") when its own caps have not already.
    `caps_of`: a batch's CapsMemo (else caps_for)."""
    caps = (caps_of or CapsMemo(project))(
        session.token_cap, session.cost_cap_usd, session.external_id == SYSTEM_SESSION_ID
    )
    state, stopped_by = stop_verdict(
        state=session.state,
        runaway=session.runaway,
        tokens_used=session.tokens_used,
        cost_usd=session.cost_usd,
        caps=caps,
        stopped_by_budget=stopped_by_budget,
    )
    return {
        "session_id": session.external_id,
        "state": cast(BudgetState, state),
        "runaway": session.runaway,
        "tokens_used": session.tokens_used,
        "token_cap": caps.token_cap,
        "cost_usd": cast(str, usd(session.cost_usd)),  # a Decimal's text: never None
        "cost_cap_usd": cast(str, usd(caps.cost_cap_usd)),
        "turns": session.turn_count,
        "steps": session.step_count,
        "warned_at": _iso(session.warned_at),
        "exhausted_at": _iso(session.exhausted_at),
        "stopped_by": stopped_by,
    }
