"""LiteLLM → Costboard: a `CustomLogger` sending each call as a step (docs/integrations.md,
"From LiteLLM").

    import litellm
    from costboard_client.integrations.litellm import CostboardLogger

    costboard = CostboardLogger("http://127.0.0.1:8000", api_key)
    litellm.callbacks = [costboard]
    litellm.completion(model="gpt-4o", messages=[...], user="alice",
                       metadata={"session_id": "s-42", "tags": ["feature:search"]})

The LiteLLM proxy (`pip install "costboard-client[litellm]" "litellm[proxy]"`) loads it from
its config, reading COSTBOARD_URL and COSTBOARD_API_KEY:

    litellm_settings:
      callbacks: costboard_client.integrations.litellm.proxy_logger

What each step carries: session from `metadata.session_id`, else `litellm_session_id`, else an
explicit `litellm_trace_id` (else the project's `system` session); end user from `user`, else
`metadata.user_id` (else the proxy's end user); turn and step type from `metadata.turn` and
`metadata.step_type`; tags from `metadata.tags` ("key:value" strings), the request's tags and
the proxy's team and key aliases (`team`, `key_alias`); the usage as LiteLLM reports it, its
cache reads and writes subtracted from the prompt once; a stream's final usage; the response
id as `event_id` (LiteLLM logging a call twice stores it once).

Refusing before a call, wherever LiteLLM lets a callback stop one:
- async SDK calls (`await litellm.acompletion(...)`, `aresponses`, `aembedding`, ...): LiteLLM
  awaits `async_pre_call_deployment_hook` before sending and passes what it raises to the
  caller unchanged, so an exhausted session or stop-budget raises `BudgetExceeded`;
- the proxy: `async_pre_call_hook` answers the request with a 400 naming the budget;
- sync SDK calls: LiteLLM ignores what its sync callbacks raise, so call through
  `costboard.completion(...)` (or call `costboard.check(...)` first).
The provider is never called for a refused call, and no step is recorded for it.

When Costboard cannot be reached or answers garbage, calls go ahead (fail open) on the budget
last heard: a session already known to be exhausted stays refused, any other is let through.
A check waits at most the client's `timeout` for steps still buffered to be sent; when they
could not be, the checks of the next UNREACHABLE_PAUSE seconds do not wait again.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from costboard_client._client import KNOWN_SESSIONS, BudgetExceeded, Costboard, Recent, _plain, log
from costboard_client.integrations import (
    FreshCheck,
    session_user_event,
    tags_from,
    text_from,
    tier_from,
    turn_from,
)

__all__ = ["BudgetExceeded", "CostboardLogger", "openai_usage"]

STEP_TYPES = {
    "completion": "chat",
    "acompletion": "chat",
    "text_completion": "completion",
    "atext_completion": "completion",
    "embedding": "embedding",
    "aembedding": "embedding",
    "responses": "responses",
    "aresponses": "responses",
    "anthropic_messages": "chat",
}
ALIAS_TAGS = (("team", "user_api_key_team_alias"), ("key_alias", "user_api_key_alias"))
REFUSAL = "costboard: "  # how the proxy's refusals begin
SETTLE_SECONDS = 5.0  # flush() waits at most this long for LiteLLM to log calls it made
MAX_PENDING = 10_000


def openai_usage(usage: Any) -> dict[str, Any] | None:
    """LiteLLM's usage (OpenAI Chat shape for every provider) as an OpenAI Chat usage object
    the server reads exactly: prompt_tokens including the cache reads (cached_tokens) and
    writes (cache_write_tokens) once, whichever of LiteLLM's fields carried them, and the
    writes' 1-hour part (Anthropic's) in cache_creation_token_details, as LiteLLM puts it."""
    plain = _plain(usage)
    if not isinstance(plain, dict):
        return None
    prompt = _int(plain.get("prompt_tokens"))
    if prompt is None:  # not a chat usage (an embedding's, a Responses one): as it is
        return plain if plain else None
    details = plain.get("prompt_tokens_details") or {}
    details = details if isinstance(details, Mapping) else {}
    read = _int(details.get("cached_tokens")) or _int(plain.get("cache_read_input_tokens")) or 0
    written = (
        _int(details.get("cache_write_tokens"))
        or _int(details.get("cache_creation_tokens"))
        or _int(plain.get("cache_creation_input_tokens"))
        or 0
    )
    if read + written > prompt:  # a provider whose prompt count leaves the cache out
        prompt += read + written
    prompt_details: dict[str, Any] = {"cached_tokens": read}
    if written:
        prompt_details["cache_write_tokens"] = written
        # Anthropic's 1-hour cache writes, priced above the 5-minute ones: kept apart
        ttl = details.get("cache_creation_token_details")
        one_hour = _int(ttl.get("ephemeral_1h_input_tokens")) if isinstance(ttl, Mapping) else None
        if one_hour:
            prompt_details["cache_creation_token_details"] = {
                "ephemeral_1h_input_tokens": min(one_hour, written)
            }
    result: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": _int(plain.get("completion_tokens")) or 0,
        "prompt_tokens_details": prompt_details,
    }
    completion_details = plain.get("completion_tokens_details")
    if isinstance(completion_details, Mapping):
        reasoning = _int(completion_details.get("reasoning_tokens"))
        if reasoning:
            result["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return result


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and value >= 0 else None


class CostboardLogger(CustomLogger):  # type: ignore[misc]
    """A LiteLLM callback: each success and failure becomes a Costboard step."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        client: Costboard | None = None,
        flush_interval: float = 1.0,
        **client_options: Any,
    ) -> None:
        super().__init__()
        if client is None:
            base_url = base_url or os.environ.get("COSTBOARD_URL")
            api_key = api_key or os.environ.get("COSTBOARD_API_KEY")
            if not base_url or not api_key:
                raise ValueError(
                    "CostboardLogger needs base_url and api_key, or COSTBOARD_URL and "
                    "COSTBOARD_API_KEY in the environment"
                )
            client = Costboard(base_url, api_key, flush_interval=flush_interval, **client_options)
        self.client = client
        # LiteLLM keeps one logger per class and public str attributes: these tell two
        # Costboard projects (or servers) apart
        self.base_url = client.base_url
        self.key_prefix = client.api_key[:11]
        # (session, user) already announced, the last KNOWN_SESSIONS (one forgotten is
        # announced again: the same session event, harmless)
        self._users: Recent[tuple[str, str], bool] = Recent(KNOWN_SESSIONS)
        # calls begun and not yet logged: LiteLLM logs a sync call from a thread of its own,
        # after the call returns, and flush() waits for those
        self._pending: set[str] = set()
        self._settled = threading.Condition()
        self._fresh_check = FreshCheck(client)

    # --- before a call ----------------------------------------------------------------------

    def check(
        self,
        metadata: Mapping[str, Any] | None = None,
        *,
        litellm_session_id: str | None = None,
        litellm_trace_id: str | None = None,
        **_: Any,
    ) -> None:
        """Raise BudgetExceeded if the call's session (as the step would name it) is known
        to be exhausted; steps still buffered are sent first (waiting at most the client's
        `timeout`), so the budget is current. Costboard down: the last known budget decides."""
        session = _session_of(metadata or {}, litellm_session_id, litellm_trace_id)
        self._fresh_check(session)

    def completion(self, **kwargs: Any) -> Any:
        """`litellm.completion(**kwargs)`, refused with BudgetExceeded before the call when
        its session or a stop-budget above it is exhausted."""
        import litellm

        self.check(**_check_args(kwargs))
        return litellm.completion(**kwargs)

    async def acompletion(self, **kwargs: Any) -> Any:
        """`await litellm.acompletion(**kwargs)`, refused like `completion` (also when this
        logger is not in `litellm.callbacks`)."""
        import litellm

        await asyncio.to_thread(self.check, **_check_args(kwargs))
        return await litellm.acompletion(**kwargs)

    async def async_pre_call_deployment_hook(
        self, kwargs: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """LiteLLM's hook just before an async call is sent (`litellm.acompletion`,
        `aresponses`, `aembedding`, ..., the proxy's calls too): BudgetExceeded for an
        exhausted session or stop-budget, which LiteLLM re-raises to the caller as it is."""
        await asyncio.to_thread(self.check, **_check_args(kwargs))
        return None  # the call as it was

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """The proxy's hook before each request: an exhausted session or stop-budget is
        refused with a 400 the caller sees, naming the budget that stopped it."""
        try:
            await asyncio.to_thread(self.check, **_check_args(data))
        except BudgetExceeded as refused:
            from fastapi import HTTPException

            raise HTTPException(status_code=400, detail=f"{REFUSAL}{refused}") from None
        return data

    # --- after a call -----------------------------------------------------------------------

    def log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._record(kwargs, response_obj, start_time, end_time, failed=False)

    def log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._record(kwargs, response_obj, start_time, end_time, failed=True)

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._record(kwargs, response_obj, start_time, end_time, failed=False)

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        self._record(kwargs, response_obj, start_time, end_time, failed=True)

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: dict[str, Any]) -> None:
        call_id = text_from((kwargs or {}).get("litellm_call_id"))
        if call_id:
            with self._settled:
                if len(self._pending) >= MAX_PENDING:  # calls never logged (an unread stream)
                    self._pending.clear()
                self._pending.add(call_id)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Send what is buffered now (see Costboard.flush), after waiting (at most
        SETTLE_SECONDS of the timeout) for the calls LiteLLM has yet to log: its first sync
        call in a process is logged seconds after it returns."""
        deadline = None if timeout is None else time.monotonic() + timeout
        settle = time.monotonic() + min(SETTLE_SECONDS, timeout or SETTLE_SECONDS)
        with self._settled:
            while self._pending and time.monotonic() < settle:
                self._settled.wait(timeout=settle - time.monotonic())
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self.client.flush(remaining)

    def _record(
        self, kwargs: dict[str, Any], response: Any, start: Any, end: Any, *, failed: bool
    ) -> None:
        try:
            if failed and _refused_here(kwargs.get("exception")):
                return  # our own refusal: no call was made, so no step
            for event in self._events(kwargs, response, start, end, failed=failed):
                self.client.event(event)
        except Exception:  # a surprising call must never break the agent
            log.warning("costboard: could not record a LiteLLM call", exc_info=True)
        finally:
            call_id = text_from(kwargs.get("litellm_call_id"))
            with self._settled:
                self._pending.discard(call_id or "")
                self._settled.notify_all()

    def _events(
        self, kwargs: dict[str, Any], response: Any, start: Any, end: Any, *, failed: bool
    ) -> list[dict[str, Any]]:
        params = kwargs.get("litellm_params") or {}
        metadata = params.get("metadata") or {}
        logged = kwargs.get("standard_logging_object") or {}
        session = _session_of(
            metadata, params.get("litellm_session_id"), params.get("litellm_trace_id")
        )
        optional = kwargs.get("optional_params") or {}
        user = text_from(
            kwargs.get("user"),
            optional.get("user"),
            metadata.get("user_id"),
            logged.get("end_user"),
            metadata.get("user_api_key_end_user_id"),
        )
        if failed:
            response = None
        elif kwargs.get("complete_streaming_response") is not None:
            response = kwargs["complete_streaming_response"]  # a stream: its final usage
        usage = openai_usage(getattr(response, "usage", None)) if response is not None else None
        # the tier the provider answered with (OpenAI's on the response, Anthropic's in its
        # usage), else the one the call asked for ("auto": the server reads it as standard)
        tier = tier_from(
            response,
            getattr(response, "usage", None) if response is not None else None,
            getattr(response, "_hidden_params", None) if response is not None else None,
            optional,
        )
        response_id = text_from(getattr(response, "id", None), logged.get("id"))
        call_id = text_from(kwargs.get("litellm_call_id"))
        step: dict[str, Any] = {
            "type": "step",
            "event_id": (response_id if not failed else None) or call_id,
            "step_type": text_from(metadata.get("step_type"))
            or STEP_TYPES.get(str(kwargs.get("call_type")), str(kwargs.get("call_type") or "llm")),
            "model": text_from(kwargs.get("model"), logged.get("model")) or "unknown",
            "provider": text_from(logged.get("custom_llm_provider"))
            or text_from(params.get("custom_llm_provider")),
            "session_id": session,
            "turn": turn_from(metadata.get("turn")),
            "success": not failed,
            "usage": usage,
            "service_tier": tier,
            "tags": tags_from(
                _request_tags(logged.get("request_tags")),
                metadata.get("tags"),
                {tag: metadata.get(key) for tag, key in ALIAS_TAGS},
            ),
            "metadata": {"litellm_call_id": call_id} if call_id else None,
        }
        if isinstance(start, datetime):
            step["timestamp"] = start.isoformat()
            if isinstance(end, datetime):
                step["duration_ms"] = max(0, round((end - start).total_seconds() * 1000))
        if failed:
            exception = kwargs.get("exception")
            text = (
                f"{type(exception).__name__}: {exception}"
                if exception is not None
                else text_from(logged.get("error_str")) or "error"
            )
            step["error"] = text[:20_000]
        step = {key: value for key, value in step.items() if value is not None}
        events = []
        announce = session_user_event(session, user)
        if announce is not None and (session or "", user or "") not in self._users:
            self._users[(session or "", user or "")] = True
            events.append(announce)
        events.append(step)
        return events


def _session_of(
    metadata: Mapping[str, Any], session_id: Any = None, trace_id: Any = None
) -> str | None:
    return text_from(metadata.get("session_id"), session_id, trace_id)


def _refused_here(exception: Any) -> bool:
    if isinstance(exception, BudgetExceeded):
        return True
    detail = getattr(exception, "detail", None) or getattr(exception, "message", None)
    return isinstance(detail, str) and detail.startswith(REFUSAL)


def _request_tags(tags: Any) -> list[str] | None:
    """The request's tags less the `User-Agent: …` one the proxy adds to every request."""
    if not isinstance(tags, (list, tuple)):
        return None
    return [t for t in tags if not (isinstance(t, str) and t.lower().startswith("user-agent:"))]


def _check_args(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    metadata = kwargs.get("metadata")
    return {
        "metadata": metadata if isinstance(metadata, Mapping) else None,
        "litellm_session_id": kwargs.get("litellm_session_id"),
        "litellm_trace_id": kwargs.get("litellm_trace_id"),
    }


_proxy_logger: CostboardLogger | None = None


def __getattr__(name: str) -> Any:
    """`proxy_logger`: the LiteLLM proxy's instance, made on first use from COSTBOARD_URL and
    COSTBOARD_API_KEY (importing this module needs neither)."""
    global _proxy_logger
    if name == "proxy_logger":
        if _proxy_logger is None:
            _proxy_logger = CostboardLogger()
        return _proxy_logger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
