"""LangChain → Costboard: a callback handler sending each model and tool run as a step.

    from costboard_client.integrations.langchain import CostboardCallbackHandler

    costboard = CostboardCallbackHandler("http://127.0.0.1:8000", api_key)
    chain.invoke(question, config={
        "callbacks": [costboard],
        "metadata": {"session_id": "s-42", "user_id": "alice", "tags": ["feature:search"]},
    })

Each chat model or LLM run is a step: its `usage_metadata` (cache reads and writes counted
once), the run id as `event_id`, its model and provider from the response (else LangChain's
`ls_model_name` / `ls_provider`); session, user, turn, step type and tags from the run's
metadata, which a chain passes to every run inside it. A failed run is a failed step; a tool
run is a tool step (model "none", $0). A model run of a session known to be exhausted is
refused with `BudgetExceeded` before the model is called (the handler sets `raise_error`, so
LangChain lets that one exception through; its own other errors are only logged). Steps still
buffered are sent before that check, so it reads a current budget; when Costboard could not be
reached, the runs of the next UNREACHABLE_PAUSE seconds go ahead without waiting on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from costboard_client._client import BudgetExceeded, Costboard, log
from costboard_client.integrations import (
    FreshCheck,
    session_user_event,
    tags_from,
    text_from,
    tier_from,
    turn_from,
)

__all__ = ["BudgetExceeded", "CostboardCallbackHandler", "usage_from_langchain"]

TOOL_MODEL = "none"


@dataclass
class _Run:
    kind: str  # "llm" or "tool"
    session_id: str | None
    user_id: str | None
    turn: int | None
    step_type: str
    tags: dict[str, str] | None
    model: str | None
    provider: str | None
    name: str | None
    started: float
    timestamp: str
    service_tier: str | None = None


def usage_from_langchain(usage: Mapping[str, Any]) -> dict[str, Any]:
    """LangChain's `usage_metadata` (input_tokens including cache reads and writes) as an
    OpenAI Chat usage object, which the server reads with the cache taken out once (the
    writes' 1-hour part in cache_creation_token_details, as LiteLLM writes it)."""
    details = usage.get("input_token_details") or {}
    out_details = usage.get("output_token_details") or {}
    read = int(details.get("cache_read") or 0)
    # langchain-anthropic adds the writes' split by cache lifetime: the 1-hour ones are
    # priced above the 5-minute ones
    one_hour = int(details.get("ephemeral_1h_input_tokens") or 0)
    five_min = int(details.get("ephemeral_5m_input_tokens") or 0)
    written = int(details.get("cache_creation") or 0) or one_hour + five_min
    prompt = int(usage.get("input_tokens") or 0)
    if read + written > prompt:  # a model counting the cache apart
        prompt += read + written
    prompt_details: dict[str, Any] = {"cached_tokens": read}
    if written:
        prompt_details["cache_write_tokens"] = written
        if one_hour:
            prompt_details["cache_creation_token_details"] = {
                "ephemeral_1h_input_tokens": min(one_hour, written)
            }
    result: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": int(usage.get("output_tokens") or 0),
        "prompt_tokens_details": prompt_details,
    }
    reasoning = int(out_details.get("reasoning") or 0)
    if reasoning:
        result["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return result


class CostboardCallbackHandler(BaseCallbackHandler):  # type: ignore[misc]
    """Report LangChain model and tool runs to Costboard (thread-safe; share one)."""

    raise_error = True  # lets BudgetExceeded stop the run; every other error is caught here

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        client: Costboard | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__()
        if client is None:
            if not base_url or not api_key:
                raise ValueError("CostboardCallbackHandler needs base_url and api_key, or client")
            client = Costboard(base_url, api_key, **client_options)
        self.client = client
        self._fresh_check = FreshCheck(client)
        self._runs: dict[UUID, _Run] = {}
        self._users: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def flush(self, timeout: float | None = 10.0) -> bool:
        return self.client.flush(timeout)

    # --- model runs -------------------------------------------------------------------------

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._start_llm(run_id, serialized, kwargs)

    def on_llm_start(
        self, serialized: dict[str, Any], prompts: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._start_llm(run_id, serialized, kwargs)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            self._end_llm(run_id, response)
        except Exception:
            log.warning("costboard: could not record a LangChain run", exc_info=True)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._fail(run_id, error)

    # --- tool runs --------------------------------------------------------------------------

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        try:
            name = text_from(kwargs.get("name"), (serialized or {}).get("name"))
            self._begin(run_id, "tool", kwargs.get("metadata") or {}, name=name, default="tool")
        except Exception:
            log.warning("costboard: could not start a LangChain tool run", exc_info=True)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            run = self._pop(run_id)
            if run is not None:
                self._send(run, str(run_id), usage=None, error=None)
        except Exception:
            log.warning("costboard: could not record a LangChain tool run", exc_info=True)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._fail(run_id, error)

    # --- the parts --------------------------------------------------------------------------

    def _start_llm(self, run_id: UUID, serialized: dict[str, Any], kwargs: dict[str, Any]) -> None:
        try:
            metadata = kwargs.get("metadata") or {}
            params = kwargs.get("invocation_params") or {}
            run = self._begin(
                run_id,
                "llm",
                metadata,
                model=text_from(
                    metadata.get("ls_model_name"), params.get("model"), params.get("model_name")
                ),
                provider=text_from(metadata.get("ls_provider")),
                default="chat",
            )
        except Exception:
            log.warning("costboard: could not start a LangChain run", exc_info=True)
            return
        try:
            self._fresh_check(run.session_id)  # the steps before this one first
        except BudgetExceeded:
            self._pop(run_id)
            raise  # the model is not called: LangChain re-raises it (raise_error)

    def _begin(
        self,
        run_id: UUID,
        kind: str,
        metadata: Mapping[str, Any],
        *,
        model: str | None = None,
        provider: str | None = None,
        name: str | None = None,
        default: str,
    ) -> _Run:
        run = _Run(
            kind=kind,
            session_id=text_from(metadata.get("session_id")),
            user_id=text_from(metadata.get("user_id")),
            turn=turn_from(metadata.get("turn")),
            step_type=text_from(metadata.get("step_type")) or default,
            tags=tags_from(metadata.get("tags")),
            model=model,
            provider=provider,
            name=name,
            started=time.perf_counter(),
            timestamp=datetime.now(timezone.utc).isoformat(),
        )
        with self._lock:
            self._runs[run_id] = run
        return run

    def _pop(self, run_id: UUID) -> _Run | None:
        with self._lock:
            return self._runs.pop(run_id, None)

    def _end_llm(self, run_id: UUID, response: Any) -> None:
        run = self._pop(run_id)
        if run is None:
            return
        usage: dict[str, Any] | None = None
        for generations in getattr(response, "generations", None) or []:
            for generation in generations:
                message = getattr(generation, "message", None)
                found = getattr(message, "usage_metadata", None)
                meta = getattr(message, "response_metadata", None) or {}
                run.model = text_from(meta.get("model_name"), meta.get("model")) or run.model
                run.provider = text_from(meta.get("model_provider")) or run.provider
                # OpenAI's tier in the response metadata, Anthropic's in its usage there
                run.service_tier = tier_from(meta, meta.get("usage")) or run.service_tier
                if isinstance(found, Mapping):
                    converted = usage_from_langchain(found)
                    usage = converted if usage is None else _sum(usage, converted)
        output = getattr(response, "llm_output", None) or {}
        if usage is None and isinstance(output.get("token_usage"), Mapping):
            usage = dict(output["token_usage"])  # an older model's OpenAI-shaped usage
        if isinstance(output, Mapping):
            run.model = run.model or text_from(output.get("model_name"))
        self._send(run, str(run_id), usage=usage, error=None)

    def _fail(self, run_id: UUID, error: BaseException) -> None:
        try:
            run = self._pop(run_id)
            if run is not None:
                text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                self._send(run, str(run_id), usage=None, error=text[:20_000])
        except Exception:
            log.warning("costboard: could not record a failed LangChain run", exc_info=True)

    def _send(
        self, run: _Run, event_id: str, *, usage: dict[str, Any] | None, error: str | None
    ) -> None:
        step: dict[str, Any] = {
            "type": "step",
            "event_id": event_id,
            "timestamp": run.timestamp,
            "step_type": run.step_type,
            "model": (run.model or "unknown") if run.kind == "llm" else TOOL_MODEL,
            "provider": run.provider if run.kind == "llm" else None,
            "session_id": run.session_id,
            "turn": run.turn,
            "duration_ms": round((time.perf_counter() - run.started) * 1000),
            "success": error is None,
            "error": error,
            "usage": usage,
            "service_tier": run.service_tier if run.kind == "llm" else None,
            "tags": run.tags,
            "metadata": {"tool": run.name} if run.kind == "tool" and run.name else None,
        }
        announce = session_user_event(run.session_id, run.user_id)
        if announce is not None:
            key = (run.session_id or "", run.user_id or "")
            with self._lock:
                fresh = key not in self._users
                self._users.add(key)
            if fresh:
                self.client.event(announce)
        self.client.event({k: v for k, v in step.items() if v is not None})


def _sum(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for key, value in b.items():
        if isinstance(value, dict):
            out[key] = _sum(dict(out.get(key) or {}), value)
        else:
            out[key] = int(out.get(key) or 0) + int(value)
    return out
