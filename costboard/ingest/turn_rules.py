"""The runaway rules that need only one turn's steps, run inside ingest (docs/budgets.md,
"Runaway rules"; issue 4):

- a retry loop: N failed steps in a row, or the same step (type, model and prompt size) N
  times in a row, within one turn;
- a turn with more than N steps (the 50-round correction cycle).

Each turn keeps its streaks (`fail_streak`, `repeat_sig`, `repeat_streak`) and their peaks,
so a rule sees the steps of earlier batches without reading them again. Within a batch the
steps are taken in time order; across batches, in the order the batches arrived (an agent
reports a turn's steps as they happen, so the two agree).

Thresholds are the project's (0 turns a rule off). The window rules (burn rate, projected
overrun, long sessions) are the sweep's: costboard/budgets/sweep.py.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from costboard.budgets.engine import Flag
from costboard.models import Project

RETRY_LOOP = "retry_loop"
TURN_STEPS = "turn_steps"


def step_signature(step_type: str, model: str, prompt_tokens: int) -> int:
    """What makes two steps "the same step": a stable 32-bit hash (Python's hash() differs
    between processes) of the type, the model and the prompt's size (input + cache)."""
    return zlib.crc32(f"{step_type}\0{model}\0{prompt_tokens}".encode())


class RuleStep(Protocol):
    """What the rules read of a step."""

    ts: datetime
    success: bool
    error: str
    step_type: str
    model: str
    sig: int


@dataclass(slots=True)
class TurnStreaks:
    """A turn's stored streaks, advanced step by step."""

    fail_streak: int = 0
    fail_peak: int = 0
    repeat_sig: int | None = None
    repeat_streak: int = 0
    repeat_peak: int = 0

    def advance(self, step: RuleStep) -> None:
        if step.success:
            self.fail_streak = 0
        else:
            self.fail_streak += 1
            self.fail_peak = max(self.fail_peak, self.fail_streak)
        if step.sig == self.repeat_sig:
            self.repeat_streak += 1
        else:
            self.repeat_sig, self.repeat_streak = step.sig, 1
        self.repeat_peak = max(self.repeat_peak, self.repeat_streak)


def turn_check(
    project: Project,
    turn_number: int,
    streaks: TurnStreaks,
    steps: list[Any],
    steps_before: int,
) -> tuple[TurnStreaks, Flag | None]:
    """Advance a turn's streaks over its new steps (time order) and return the first rule
    they break, if any. `steps_before` is the turn's step count before these steps."""
    flag: Flag | None = None
    failed_limit = project.runaway_failed_steps
    repeat_limit = project.runaway_repeated_steps
    steps_limit = project.runaway_turn_steps
    last_error = ""
    for index, step in enumerate(steps):
        streaks.advance(step)
        if not step.success and step.error:
            last_error = step.error
        if flag is not None:
            continue
        # at or past a threshold, not only at it: one lowered in the admin below where a
        # turn stands flags the turn's next step (a session is flagged once: engine.py)
        if failed_limit and streaks.fail_streak >= failed_limit:
            failed = streaks.fail_streak
            flag = Flag(
                rule=RETRY_LOOP,
                reason=f"retry loop: {failed} failed steps in a row in turn {turn_number}",
                at=step.ts,
                evidence={
                    "turn": turn_number,
                    "failed_in_a_row": failed,
                    "threshold": failed_limit,
                    "step_type": step.step_type,
                    "model": step.model,
                    "last_error": (step.error or last_error)[:300],
                },
            )
        elif repeat_limit and streaks.repeat_streak >= repeat_limit:
            same = streaks.repeat_streak
            flag = Flag(
                rule=RETRY_LOOP,
                reason=f"retry loop: the same {step.step_type} step ({step.model}) "
                f"{same} times in a row in turn {turn_number}",
                at=step.ts,
                evidence={
                    "turn": turn_number,
                    "same_step_in_a_row": same,
                    "threshold": repeat_limit,
                    "step_type": step.step_type,
                    "model": step.model,
                    "prompt_tokens": getattr(step, "prompt_tokens", None),
                },
            )
        elif steps_limit and steps_before + index + 1 > steps_limit:
            flag = Flag(
                rule=TURN_STEPS,
                reason=f"turn {turn_number} has more than {steps_limit} steps",
                at=step.ts,
                evidence={
                    "turn": turn_number,
                    "steps": steps_before + index + 1,
                    "threshold": steps_limit,
                },
            )
    return streaks, flag
