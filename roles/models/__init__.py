"""The model seam: every LLM role gets its model here, from a spec string.

`openai:<model>` is any OpenAI-compatible endpoint through `ChatOpenAI`
(OPENAI_API_KEY, OPENAI_BASE_URL), with native tool calls. `local` is the
embedded llama.cpp model of `roles.models.local`, which writes its tool calls as
text, so its conversations go through the adapter of `roles.models.tool_calls`.
`scripted:<name>` replays a script registered in `roles.models.scripted` (tests).

Every call has a timeout, and replies are streamed so that a silent endpoint
is noticed within the idle timeout (HERA_IDLE_TIMEOUT_S, 45 s: before the
first token and between tokens) rather than the call's. Endpoint trouble (HTTP 429 and 5xx, connection
errors, timeouts, malformed bodies, replies cut off with nothing usable) is
retried with exponential backoff and jitter, then raised as
`InfrastructureError`, which callers record and re-run instead of scoring it
as an agent failure (DESIGN.md §7). An endpoint that `TRIP_AFTER` calls in a
row could not reach (refused, or silent past their timeouts) is down: later
calls fail at once and an evaluation stops (`endpoint_down`); `endpoint_problem`
asks an endpoint once before a run. Each call's usage is recorded for the
caller's role, priced from the table in HERA_MODEL_PRICES.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Coroutine, TypeVar

import httpx
from langchain_core.messages import AIMessage, BaseMessage, message_to_dict
from pydantic import BaseModel

from roles.models.base import KINDS, ActionMode, ChatModel, Completion, ContextLimitError, InfrastructureError, check_messages, cost_usd
from roles.models.local import QWEN_CODER_1_5B
from roles.models.openai import IDLE_TIMEOUT_S, OpenAICompatibleModel, local_base_url, local_slot
from roles.models.scripted import ScriptedModel
from state.journal import Items, journaled
from state.records import ToolInfo, UsageRecord, unicode_text

__all__ = ["KINDS", "ChatModel", "Completion", "ContextLimitError", "InfrastructureError", "chat_model", "check_messages", "cost_usd",
           "endpoint_down", "endpoint_problem", "reset_endpoints"]

PROBE_TIMEOUT_S = 10.0
TRIP_AFTER = 3  # calls in a row, each after its own retries, that found no endpoint answering
UNREACHABLE = ("connection", "timeout")
# The embedded model reads a prompt at about 30 tokens/s on two cores (README), so a full 16k-token slot
# without a cached prefix takes some 550 s before its first token; a server that is alive is given that time.
LOCAL_FIRST_TOKEN_S = 900.0
LOCAL_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "extra_body": {"top_k": 20, "repeat_penalty": 1.05}}
# The embedded model's text replies stop here: in run std9 one agent turn went round one sentence until H0's 8,192-token
# limit (595 s; 8,192 of the run's 37,938 agent output tokens over 380 calls, and a 10k-token prompt for every later
# turn of that episode), while no other agent reply passed 1,000 tokens. Structured replies have their own limit
# (STRUCTURED_MAX_TOKENS).
LOCAL_REPLY_TOKENS = 2048
# Graders sample nothing: the same reply gets the same verdict (benchmarks/eval_judge.py measured the judge both ways).
GREEDY_ROLES = frozenset({"abstention_judge"})
T = TypeVar("T")


def chat_model(
    spec: str, *, role: str, timeout_s: float = 180.0, max_retries: int = 4, retry_base_s: float | None = None,
    idle_timeout_s: float | None = None,
) -> ChatModel:
    """The model named by `spec`, recording usage under `role`.

    `retry_base_s` is the first backoff delay (doubling per retry, with
    jitter); it defaults to HERA_RETRY_BASE_S or 1 s. `idle_timeout_s` is the
    longest silence of an endpoint before a reply's first token or between
    two tokens; it defaults to HERA_IDLE_TIMEOUT_S or 45 s.
    """
    if retry_base_s is None:
        retry_base_s = _seconds("HERA_RETRY_BASE_S", 1.0)
    if idle_timeout_s is None:
        idle_timeout_s = _seconds("HERA_IDLE_TIMEOUT_S", IDLE_TIMEOUT_S, positive=True)
    return JournaledModel(_provider_model(spec, role, {"timeout_s": timeout_s, "max_retries": max_retries, "retry_base_s": retry_base_s,
                                                       "idle_timeout_s": idle_timeout_s}))


def _seconds(variable: str, default: float, positive: bool = False) -> float:
    raw = os.environ.get(variable)
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if value < 0 or positive and value == 0:
        raise ValueError(f"{variable} must be a {'positive ' if positive else ''}number of seconds; got {raw!r}")
    return value


def _greedy(role: str) -> dict[str, float]:
    """The sampling a role overrides: none, or temperature 0 for a grader."""
    return {"temperature": 0.0} if role in GREEDY_ROLES else {}


def _provider_model(spec: str, role: str, reliability: dict[str, Any]) -> ChatModel:
    provider, _, name = spec.partition(":")
    if spec == "local":
        # The agent's turns keep a server slot (and its prompt cache) of their own: a judge's or
        # a reviewer's call in between would otherwise evict the agent's cached prefix.
        sampling = {**LOCAL_SAMPLING, **_greedy(role), "extra_body": {**LOCAL_SAMPLING["extra_body"], "id_slot": local_slot(role)}}
        return OpenAICompatibleModel(
            spec, role=role, model=QWEN_CODER_1_5B.name, record_as=f"local:{QWEN_CODER_1_5B.name}",
            base_url=local_base_url, api_key="local", text_tools=True, sampling=sampling,
            first_token_s=max(LOCAL_FIRST_TOKEN_S, reliability["idle_timeout_s"]), reply_tokens=LOCAL_REPLY_TOKENS, cut_loops=True,
            **reliability,
        )
    if provider == "openai" and name:
        api_key = os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise ValueError(f"model spec {spec!r} needs OPENAI_API_KEY (any value for a server without keys)")
        return OpenAICompatibleModel(spec, role=role, model=name, record_as=spec, base_url=_openai_base_url(), api_key=api_key,
                                     sampling=_greedy(role), **reliability)
    if provider == "scripted" and name:
        return ScriptedModel(name, role=role)
    raise ValueError(f"unknown model spec {spec!r}: expected 'openai:<model>', 'local' or 'scripted:<name>'")


def _openai_base_url() -> str | None:
    return os.environ.get("OPENAI_API_BASE") or os.environ.get("OPENAI_BASE_URL") or None


def endpoint_problem(spec: str, timeout_s: float | None = None) -> str | None:
    """Why the endpoint behind `spec` cannot serve a run, from one `GET /models` (a refused or failed connection,
    no answer within `timeout_s`, a rejected key); None when it answers. Only `openai:` specs have an endpoint
    to ask: the local server starts on demand, and scripted models have none."""
    if spec.partition(":")[0] != "openai":
        return None
    if timeout_s is None:
        timeout_s = min(PROBE_TIMEOUT_S, _seconds("HERA_IDLE_TIMEOUT_S", IDLE_TIMEOUT_S, positive=True))
    base_url = (_openai_base_url() or "https://api.openai.com/v1").rstrip("/")
    try:
        answer = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"},
                           timeout=timeout_s)
    except httpx.TimeoutException:
        return f"{base_url} did not answer within {timeout_s:g} s"
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        return f"{base_url} is unreachable ({error or type(error).__name__})"
    if answer.status_code in (401, 403):
        return f"{base_url} refused the key in OPENAI_API_KEY (HTTP {answer.status_code})"
    return None


_unreachable: dict[str, list[str]] = {}  # spec -> its calls in a row that found no endpoint answering


def endpoint_down(*specs: str) -> str | None:
    """Why a run on these specs should stop now: one whose last `TRIP_AFTER` calls found no endpoint answering."""
    for spec in specs:
        failed = _unreachable.get(spec, [])
        if len(failed) >= TRIP_AFTER:
            return f"{spec}: {len(failed)} calls in a row found no endpoint answering (last: {failed[-1]})"
    return None


def reset_endpoints(*specs: str) -> None:
    """Gives these specs' endpoints (without specs, every one) a fresh start: a new evaluation tries them again."""
    for spec in specs or list(_unreachable):
        _unreachable.pop(spec, None)


def _unicode_message(message: AIMessage) -> AIMessage:
    """A model's reply as text every record can hold (`unicode_text`): a reply cut off inside an escaped emoji holds half
    of it."""
    fields = ("content", "tool_calls", "invalid_tool_calls", "additional_kwargs", "response_metadata")
    text = {f: unicode_text(getattr(message, f)) for f in fields}
    return message if all(text[f] is getattr(message, f) for f in fields) else message.model_copy(update=text)


def _tool_json(tool: ToolInfo) -> dict[str, Any]:
    return tool.model_dump(mode="json")


class JournaledModel:
    """A model whose replies inside checkpointed runs go through the call journal (state/journal.py),
    so a resumed run does not make a finished call again."""

    def __init__(self, model: ChatModel):
        self.model, self.spec = model, model.spec
        self.role = getattr(model, "role", "")

    def __repr__(self) -> str:
        return repr(self.model)

    def _request(self, method: str, messages: list[BaseMessage], **more: Any) -> dict[str, Any]:
        return {"spec": self.spec, "role": self.role, "method": method, "messages": Items(messages, message_to_dict), **more}

    async def complete(self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *,
                       max_tokens: int | None = None, temperature: float | None = None,
                       action_mode: ActionMode = "text", seed: int | None = None) -> Completion:
        request = self._request("complete", messages, tools=Items(tools or (), _tool_json),
                                max_tokens=max_tokens, temperature=temperature,
                                **({"action_mode": action_mode} if action_mode != "text" else {}),
                                **({"seed": seed} if seed is not None else {}))

        def dump(c: Completion) -> str:
            return json.dumps({"message": c.message.model_dump(mode="json"), "usage": c.usage.model_dump(mode="json"),
                               "truncated": c.truncated})

        def load(text: str) -> Completion:
            data = json.loads(text)
            return Completion(AIMessage.model_validate(data["message"]), UsageRecord.model_validate(data["usage"]), data["truncated"])

        async def call() -> Completion:
            done = await self.model.complete(messages, tools, max_tokens=max_tokens, temperature=temperature, action_mode=action_mode,
                                             seed=seed)
            return replace(done, message=_unicode_message(done.message))

        return await self._watched(journaled(request, call, dump, load))

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        request = self._request("structured", messages, schema=schema.model_json_schema())

        def dump(result: tuple[BaseModel, UsageRecord]) -> str:
            return json.dumps({"value": result[0].model_dump(mode="json"), "usage": result[1].model_dump(mode="json")})

        def load(text: str) -> tuple[BaseModel, UsageRecord]:
            data = json.loads(text)
            return schema.model_validate(data["value"]), UsageRecord.model_validate(data["usage"])

        async def call() -> tuple[BaseModel, UsageRecord]:
            value, usage = await self.model.structured(messages, schema)
            dumped = value.model_dump()
            text = unicode_text(dumped)
            return (value if text is dumped else schema.model_validate(text)), usage

        return await self._watched(journaled(request, call, dump, load))

    async def _watched(self, call: Coroutine[Any, Any, T]) -> T:
        """`call`, counted against its endpoint: not made while the endpoint is down, a failure to reach it
        counted, any answer (a bad one too) clearing the count."""
        down = endpoint_down(self.spec)
        if down:
            call.close()
            raise InfrastructureError("connection", f"not tried: {down}", self.spec)
        try:
            result = await call
        except InfrastructureError as error:
            if error.kind in UNREACHABLE:
                _unreachable.setdefault(self.spec, []).append(f"{error.kind}: {error.detail}"[:300])
            else:  # an endpoint that answers, if badly, is up
                _unreachable.pop(self.spec, None)
            raise
        _unreachable.pop(self.spec, None)
        return result
