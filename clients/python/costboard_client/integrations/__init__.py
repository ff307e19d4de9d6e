"""Report the calls an LLM framework makes to Costboard, without wrapping each one.

    from costboard_client.integrations.litellm import CostboardLogger       # [litellm]
    from costboard_client.integrations.langchain import CostboardCallbackHandler  # [langchain]

Each module imports its framework; install it with the extra of the same name, e.g.
`pip install "costboard-client[litellm]"`. Both read the same call metadata: `session_id`,
`user_id`, `turn`, `step_type` and `tags` (a list of "key:value" strings, or an object).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from costboard_client._client import Costboard

__all__ = ["FreshCheck", "session_user_event", "tags_from", "turn_from"]

log = logging.getLogger("costboard.client")

TAG_KEY = re.compile(r"^[a-z0-9_.-]{1,64}$")  # the server's rule (docs/api.md, "Tags")
MAX_TAG_VALUE = 128
MAX_TAGS = 20
MAX_TURN = 2**31 - 1
UNREACHABLE_PAUSE = 30.0  # after a check's flush found Costboard down, checks skip it this long

# Looked up at each use, so that a test can turn time by hand
_monotonic = time.monotonic


class FreshCheck:
    """A budget check before a call, on a current budget: the steps still buffered are sent
    first, waiting at most the client's `timeout`. When nothing got through (Costboard down
    or answering garbage), the checks of the next UNREACHABLE_PAUSE seconds do not wait
    again: calls go ahead on the budgets last heard (fail open, docs/integrations.md)."""

    def __init__(self, client: Costboard) -> None:
        self.client = client
        self._flush_again_at = 0.0  # (monotonic) when a check may wait on a flush again

    def __call__(self, session_id: str | None) -> None:
        client = self.client
        if client.stats.buffered and _monotonic() >= self._flush_again_at:
            sent_before = client.stats.sent
            sent_all = client.flush(timeout=client.timeout)
            if not sent_all and client.stats.sent == sent_before:  # nothing got through
                self._flush_again_at = _monotonic() + UNREACHABLE_PAUSE
                log.warning(
                    "costboard: unreachable (%s); calls go ahead on the last known budgets, "
                    "without waiting on it for %g s",
                    client.stats.last_error,
                    UNREACHABLE_PAUSE,
                )
        client.check(session_id)


def tags_from(*sources: Any) -> dict[str, str] | None:
    """Tags from "key:value" strings (a bare "prod" is {"prod": "true"}) or objects, later
    sources winning; a key the server would refuse is left out, with a warning."""
    tags: dict[str, str] = {}
    for source in sources:
        for key, value in _pairs(source):
            key = key.strip().lower()
            if not TAG_KEY.match(key):
                log.warning("costboard: tag %r left out: keys are [a-z0-9_.-], 1-64 chars", key)
                continue
            tags[key] = value.strip()[:MAX_TAG_VALUE]
    if len(tags) > MAX_TAGS:
        log.warning("costboard: %d tags, only the first %d are sent", len(tags), MAX_TAGS)
        tags = dict(list(tags.items())[:MAX_TAGS])
    return tags or None


def _pairs(source: Any) -> Iterable[tuple[str, str]]:
    if isinstance(source, Mapping):
        for key, value in source.items():
            if value is not None and str(value).strip():
                yield str(key), str(value)
    elif isinstance(source, (list, tuple, set, frozenset)):
        for item in source:
            if not isinstance(item, str) or not item.strip():
                continue
            key, sep, value = item.partition(":")
            yield (key, value) if sep and value.strip() else (key, "true")


def turn_from(value: Any) -> int | None:
    """`metadata.turn` as a turn number (1 and up), or None."""
    if isinstance(value, bool):
        return None
    try:
        turn = int(value)
    except (TypeError, ValueError):
        return None
    return turn if 1 <= turn <= MAX_TURN else None


def text_from(*values: Any) -> str | None:
    """The first value that is a non-empty string (or a number), stripped."""
    for value in values:
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (str, int)):
            text = str(value).strip()
            if text:
                return text
    return None


def tier_from(*sources: Any) -> str | None:
    """The first `service_tier` found on these objects or dicts (a response, its usage, its
    metadata): OpenAI's "default"/"flex"/"priority", Anthropic's usage tier."""
    for source in sources:
        if source is None:
            continue
        if isinstance(source, Mapping):
            value = source.get("service_tier")
        else:
            value = getattr(source, "service_tier", None)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def session_user_event(session_id: str | None, user_id: str | None) -> dict[str, Any] | None:
    """A session event naming the session's end user; None for the `system` session (the
    project's, no one's) or without a user."""
    if not session_id or not user_id:
        return None
    return {"type": "session", "session_id": session_id, "user_id": user_id[:128]}
