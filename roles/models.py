"""The model seam: every LLM role gets its model here, from a spec string.

`openai:<model>` is any OpenAI-compatible endpoint through `ChatOpenAI`
(OPENAI_API_KEY, OPENAI_BASE_URL), with native tool calls. `local` is the
embedded llama.cpp model of `roles.local_model`, which writes its tool calls as
text, so its conversations go through the adapter of `roles.tool_calls`.
`scripted:<name>` replays a script registered in `roles.scripted` (tests).

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

import asyncio
import json
import logging
import os
import random
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, Literal, Protocol, Sequence, TypeVar, runtime_checkable

import httpx
import openai
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage, messages_to_dict
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from roles.journal import journaled
from roles.local_model import QWEN_CODER_1_5B, local_server, slots
from roles.tool_calls import (
    ACTION_INSTRUCTION,
    ActionError,
    action_schema,
    describe_object,
    fold_history,
    number_calls,
    parse_action,
    parse_tool_calls,
    text_of,
    with_system_note,
)
from state.records import ToolInfo, UsageRecord

log = logging.getLogger(__name__)

KINDS = ("rate_limited", "server_error", "timeout", "malformed", "truncated", "connection")
MAX_BACKOFF_S = 60.0
# A structured reply longer than this is a model going round in its grammar (seen: a 1.5B model past 2,000
# tokens of one JSON reply at 3 tokens/s); it is cut off and asked again, not waited for.
STRUCTURED_MAX_TOKENS = 1536
IDLE_TIMEOUT_S = 45.0
PROBE_TIMEOUT_S = 10.0
TRIP_AFTER = 3  # calls in a row, each after its own retries, that found no endpoint answering
UNREACHABLE = ("connection", "timeout")
# The embedded model reads a prompt at about 30 tokens/s on two cores (README), so a full 16k-token slot
# without a cached prefix takes some 550 s before its first token; a server that is alive is given that time.
LOCAL_FIRST_TOKEN_S = 900.0
LOCAL_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "extra_body": {"top_k": 20, "repeat_penalty": 1.05}}
T = TypeVar("T")
ActionMode = Literal["text", "structured"]


class InfrastructureError(Exception):
    """The model endpoint failed us (down, overloaded, too slow, or a broken reply) even after retries.

    Never an agent failure: record it and re-run. `kind` is one of `KINDS`.
    """

    def __init__(self, kind: str, detail: str = "", spec: str = "", attempts: int = 1):
        if kind not in KINDS:
            raise ValueError(f"InfrastructureError kind must be one of {', '.join(KINDS)}; got {kind!r}")
        super().__init__(kind, detail, spec, attempts)
        self.kind, self.detail, self.spec, self.attempts = kind, detail, spec, attempts

    def __str__(self) -> str:
        where = f"{self.spec}: " if self.spec else ""
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        return f"{where}{self.kind}{tries}" + (f": {self.detail}" if self.detail else "")


class ContextLimitError(Exception):
    """The conversation no longer fits the model's context window. Building
    the context is the harness's job, so this ends the episode as the
    harness's failure; it is not an infrastructure error."""


CONTEXT_MARKERS = ("context size", "context length", "context_length", "maximum context", "too many tokens", "context window")


@dataclass(frozen=True)
class Completion:
    """One model turn: the reply (tool calls with our ids `call_<n>`), its usage, and whether it was cut off."""

    message: AIMessage
    usage: UsageRecord
    truncated: bool = False


@runtime_checkable
class ChatModel(Protocol):
    """What every role calls. Both methods raise `InfrastructureError` when the endpoint fails for good."""

    spec: str

    async def complete(
        self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *, max_tokens: int | None = None,
        temperature: float | None = None, action_mode: ActionMode = "text",
    ) -> Completion:
        """The next assistant turn of `messages`, free to call `tools`; `temperature` None keeps the model's
        default. With `action_mode="structured"` the turn is exactly one call of `tools` or a final answer
        (`roles.tool_calls.action_schema`), and a reply outside that grammar is a malformed reply."""
        ...

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        """A reply constrained to `schema` (a JSON-schema response format) and validated against it."""
        ...


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


def _provider_model(spec: str, role: str, reliability: dict[str, Any]) -> ChatModel:
    provider, _, name = spec.partition(":")
    if spec == "local":
        # The agent's turns keep a server slot (and its prompt cache) of their own: a judge's or
        # a reviewer's call in between would otherwise evict the agent's cached prefix.
        sampling = {**LOCAL_SAMPLING, "extra_body": {**LOCAL_SAMPLING["extra_body"], "id_slot": local_slot(role)}}
        return OpenAICompatibleModel(
            spec, role=role, model=QWEN_CODER_1_5B.name, record_as=f"local:{QWEN_CODER_1_5B.name}",
            base_url=_local_base_url, api_key="local", text_tools=True, sampling=sampling,
            first_token_s=max(LOCAL_FIRST_TOKEN_S, reliability["idle_timeout_s"]), **reliability,
        )
    if provider == "openai" and name:
        api_key = os.environ.get("OPENAI_API_KEY")
        if not api_key:
            raise ValueError(f"model spec {spec!r} needs OPENAI_API_KEY (any value for a server without keys)")
        return OpenAICompatibleModel(spec, role=role, model=name, record_as=spec, base_url=_openai_base_url(),
                                     api_key=api_key, **reliability)
    if provider == "scripted" and name:
        from roles.scripted import ScriptedModel

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


class JournaledModel:
    """A model whose replies inside checkpointed runs go through the call journal (roles/journal.py),
    so a resumed run does not make a finished call again."""

    def __init__(self, model: ChatModel):
        self.model, self.spec = model, model.spec
        self.role = getattr(model, "role", "")

    def __repr__(self) -> str:
        return repr(self.model)

    def _request(self, method: str, messages: list[BaseMessage], **more: Any) -> dict[str, Any]:
        return {"spec": self.spec, "role": self.role, "method": method, "messages": messages_to_dict(messages), **more}

    async def complete(self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *,
                       max_tokens: int | None = None, temperature: float | None = None,
                       action_mode: ActionMode = "text") -> Completion:
        request = self._request("complete", messages, tools=[t.model_dump(mode="json") for t in tools or ()],
                                max_tokens=max_tokens, temperature=temperature,
                                **({"action_mode": action_mode} if action_mode != "text" else {}))

        def dump(c: Completion) -> str:
            return json.dumps({"message": c.message.model_dump(mode="json"), "usage": c.usage.model_dump(mode="json"),
                               "truncated": c.truncated})

        def load(text: str) -> Completion:
            data = json.loads(text)
            return Completion(AIMessage.model_validate(data["message"]), UsageRecord.model_validate(data["usage"]), data["truncated"])

        return await self._watched(journaled(request, lambda: self.model.complete(
            messages, tools, max_tokens=max_tokens, temperature=temperature, action_mode=action_mode), dump, load))

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        request = self._request("structured", messages, schema=schema.model_json_schema())

        def dump(result: tuple[BaseModel, UsageRecord]) -> str:
            return json.dumps({"value": result[0].model_dump(mode="json"), "usage": result[1].model_dump(mode="json")})

        def load(text: str) -> tuple[BaseModel, UsageRecord]:
            data = json.loads(text)
            return schema.model_validate(data["value"]), UsageRecord.model_validate(data["usage"])

        return await self._watched(journaled(request, lambda: self.model.structured(messages, schema), dump, load))

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


def model_prices() -> dict[str, tuple[float, float, float]]:
    """HERA_MODEL_PRICES: {"model": [usd_per_M_input, usd_per_M_output, usd_per_M_cached_input]}."""
    raw = os.environ.get("HERA_MODEL_PRICES")
    if not raw:
        return {}
    expected = 'HERA_MODEL_PRICES must be JSON {"model": [usd_per_M_input, usd_per_M_output, usd_per_M_cached_input]}'
    try:
        table = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"{expected}; it is not JSON ({error})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{expected}; got a {type(table).__name__}")
    prices = {}
    for model, price in table.items():
        if not (isinstance(price, list) and len(price) == 3 and all(isinstance(p, (int, float)) for p in price)):
            raise ValueError(f"{expected}; the entry for {model!r} is {price!r}")
        prices[model] = (float(price[0]), float(price[1]), float(price[2]))
    return prices


def cost_usd(model: str, input_tokens: int, output_tokens: int, cached_tokens: int) -> float | None:
    """Dollars for one call, or None when `model` (with or without its provider prefix) has no price."""
    prices = model_prices()
    price = prices.get(model) or prices.get(model.partition(":")[2])
    if price is None:
        return None
    per_input, per_output, per_cached = price
    return ((input_tokens - cached_tokens) * per_input + cached_tokens * per_cached + output_tokens * per_output) / 1e6


def check_messages(messages: Sequence[BaseMessage]) -> None:
    for index, message in enumerate(messages):
        if not isinstance(message, (SystemMessage, HumanMessage, AIMessage, ToolMessage)):
            raise TypeError(f"messages[{index}] is a {type(message).__name__}; "
                            "expected SystemMessage, HumanMessage, AIMessage or ToolMessage")


def openai_tool(tool: ToolInfo) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema}}


def response_format(schema: type[BaseModel]) -> dict[str, Any]:
    """A `json_schema` response format; strict only when the schema meets OpenAI's strict-mode rules."""
    json_schema = schema.model_json_schema()
    return {"type": "json_schema",
            "json_schema": {"name": schema.__name__, "schema": json_schema, "strict": _strict(json_schema)}}


def _strict(node: Any) -> bool:
    if isinstance(node, list):
        return all(_strict(item) for item in node)
    if not isinstance(node, dict):
        return True
    if "properties" in node and (node.get("additionalProperties") is not False
                                 or set(node.get("required", ())) != set(node["properties"])):
        return False
    return all(_strict(value) for key, value in node.items() if key not in ("enum", "const", "default"))


class _Failure(Exception):
    """One failed attempt that may succeed if tried again."""

    def __init__(self, kind: str, detail: str, retry_after: float | None = None):
        super().__init__(kind, detail)
        self.kind, self.detail, self.retry_after = kind, detail, retry_after


def backoff_s(retry: int, base_s: float, retry_after: float | None = None) -> float:
    delay = min(base_s * 2**retry, MAX_BACKOFF_S) * (0.5 + random.random())
    return max(delay, min(retry_after or 0.0, MAX_BACKOFF_S))


async def retrying(attempt: Callable[[], Awaitable[T]], *, spec: str, max_retries: int, base_s: float) -> T:
    """`attempt()`, tried up to `max_retries` more times while it fails with `_Failure`."""
    for retry in range(max_retries + 1):
        try:
            return await attempt()
        except _Failure as failure:
            if retry == max_retries:
                raise InfrastructureError(failure.kind, failure.detail, spec, retry + 1) from failure
            delay = backoff_s(retry, base_s, failure.retry_after)
            log.warning("%s: %s (%s); attempt %d of %d, retrying in %.2f s",
                        spec, failure.kind, failure.detail, retry + 1, max_retries + 1, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def local_slot(role: str) -> int:
    """The local server's slot for a role's calls: the agent's own, or the one every other role shares."""
    return 0 if role == "agent" else slots() - 1


_local_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


async def _local_base_url() -> str:
    server = await asyncio.to_thread(local_server)
    return f"{server.base_url}/v1"


class OpenAICompatibleModel:
    """A `ChatModel` over an OpenAI-compatible chat completions endpoint.

    With `text_tools`, tools are described in the prompt and calls parsed from
    the reply text (`roles.tool_calls`) instead of requested natively.
    `base_url` may be a coroutine function, for an endpoint this process
    starts itself: `local`. Such an endpoint costs nothing and is reached
    without proxies; a lost connection asks for it again (which restarts a
    crashed server); and calls go one at a time, each call's timeout starting
    when its turn comes, because the server has one slot and a request queued
    behind others is not a slow endpoint.

    Replies are streamed: no chunk within `first_token_s` (default
    `idle_timeout_s`) of the request, or within `idle_timeout_s` of the last
    chunk, is a timeout, while `timeout_s` bounds the whole reply.
    """

    def __init__(self, spec: str, *, role: str, model: str, record_as: str,
                 base_url: str | None | Callable[[], Awaitable[str]], api_key: str,
                 timeout_s: float, max_retries: int, retry_base_s: float, text_tools: bool = False,
                 sampling: dict[str, Any] | None = None, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 first_token_s: float | None = None):
        self.spec, self.role, self.model, self.record_as = spec, role, model, record_as
        self.timeout_s, self.max_retries, self.retry_base_s = timeout_s, max_retries, retry_base_s
        self.idle_timeout_s, self.first_token_s = idle_timeout_s, first_token_s or idle_timeout_s
        self.text_tools, self.own_server = text_tools, callable(base_url)
        self._base_url, self._api_key, self._sampling = base_url, api_key, dict(sampling or {})
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ChatOpenAI] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, role={self.role!r})"

    async def complete(self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *,
                       max_tokens: int | None = None, temperature: float | None = None,
                       action_mode: ActionMode = "text") -> Completion:
        check_messages(messages)
        tools = list(tools or ())
        structured = action_mode == "structured" and bool(tools)
        if structured:
            # One grammar-constrained action per turn, for any endpoint: earlier calls come back as plain turns.
            sent = fold_history(messages, tools, ACTION_INSTRUCTION)
            options = {"response_format": {"type": "json_schema", "json_schema": {"name": "Action", "schema": action_schema(tools)}},
                       "max_tokens": min(max_tokens or STRUCTURED_MAX_TOKENS, STRUCTURED_MAX_TOKENS)}
        elif self.text_tools:
            sent, options = fold_history(messages, tools), {}
        else:
            sent, options = list(messages), ({"tools": [openai_tool(t) for t in tools]} if tools else {})
        if max_tokens is not None and not structured:
            options["max_tokens"] = max_tokens
        if temperature is not None:
            options["temperature"] = temperature
        started = time.monotonic()

        async def attempt() -> tuple[AIMessage, str, list[dict[str, Any]], bool]:
            reply = await self._invoke(sent, options)
            content, calls = text_of(reply.content), list(reply.tool_calls)
            if structured:
                if reply.response_metadata.get("finish_reason") == "length":
                    raise _Failure("truncated", "the structured turn hit the token limit")
                try:
                    content, calls = parse_action(content, tools)
                except ActionError as error:
                    raise _Failure("malformed", str(error)) from error
            elif self.text_tools and tools:
                content, calls = parse_tool_calls(content, tools)
            truncated = reply.response_metadata.get("finish_reason") == "length"
            if truncated and not content.strip() and not calls:
                raise _Failure("truncated", "the reply hit the token limit before any content")
            return reply, content, calls, truncated

        reply, content, calls, truncated = await retrying(
            attempt, spec=self.spec, max_retries=self.max_retries, base_s=self.retry_base_s)
        message = AIMessage(content=content, tool_calls=number_calls(calls, messages),
                            invalid_tool_calls=reply.invalid_tool_calls, usage_metadata=reply.usage_metadata,
                            response_metadata=reply.response_metadata, id=reply.id)
        return Completion(message=message, usage=self._usage(reply, time.monotonic() - started), truncated=truncated)

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        check_messages(messages)
        sent = list(messages)
        if self.text_tools:
            # llama.cpp constrains the grammar but never shows the model the schema; OpenAI does.
            note = f"Answer with one JSON object of this form: {describe_object(schema.model_json_schema())}"
            sent = with_system_note(fold_history(messages), note)
        options = {"response_format": response_format(schema), "max_tokens": STRUCTURED_MAX_TOKENS}
        started = time.monotonic()

        async def attempt() -> tuple[AIMessage, BaseModel]:
            reply = await self._invoke(sent, options)
            if reply.response_metadata.get("finish_reason") == "length":
                raise _Failure("truncated", f"the {schema.__name__} reply hit the token limit")
            try:
                return reply, schema.model_validate_json(text_of(reply.content))
            except ValidationError as error:
                first = error.errors()[0]
                raise _Failure("malformed", f"the reply is not a valid {schema.__name__}: "
                                            f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}") from error

        reply, value = await retrying(attempt, spec=self.spec, max_retries=self.max_retries, base_s=self.retry_base_s)
        return value, self._usage(reply, time.monotonic() - started)

    async def _client(self) -> ChatOpenAI:
        # One client per event loop: an HTTP connection pool must not outlive the loop it was made on.
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            base_url = await self._base_url() if callable(self._base_url) else self._base_url
            self._clients[loop] = ChatOpenAI(
                model=self.model, api_key=self._api_key, base_url=base_url, timeout=self.timeout_s, max_retries=0,
                use_responses_api=False, http_async_client=openai.DefaultAsyncHttpxClient(trust_env=not self.own_server),
                stream_usage=True, stream_chunk_timeout=None, **self._sampling)
            # Structured replies stream through `client.beta`, whose modules load on first use (0.3 s): here, off
            # the event loop, rather than inside the first call's timeout.
            await asyncio.to_thread(lambda: self._clients[loop].root_async_client.beta)
        return self._clients[loop]

    def _gate(self):
        if not self.own_server:
            return nullcontext()
        loop = asyncio.get_running_loop()
        return _local_gates.setdefault(loop, asyncio.Semaphore(1))

    async def _invoke(self, messages: list[BaseMessage], options: dict[str, Any]) -> AIMessage:
        client = await self._client()
        async with self._gate():
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._stream(client, messages, options)
            except TimeoutError as error:
                raise _Failure("timeout", f"no reply within {self.timeout_s:g} s") from error
            except openai.APIStatusError as error:
                raise _status_failure(error) from error
            except openai.APITimeoutError as error:
                raise _Failure("timeout", f"no reply within {self.timeout_s:g} s") from error
            except openai.APIConnectionError as error:
                if self.own_server:
                    self._clients.pop(asyncio.get_running_loop(), None)
                if _cut_off(error):
                    raise _Failure("truncated", "the response body was cut off") from error
                raise _Failure("connection", _root_cause(error)) from error
            except openai.LengthFinishReasonError as error:
                raise _Failure("truncated", "the reply hit the token limit") from error
            except openai.APIResponseValidationError as error:
                raise _Failure("malformed", str(error)) from error
            except json.JSONDecodeError as error:
                kind = "truncated" if _ends_early(error) else "malformed"
                raise _Failure(kind, f"the response body is not JSON: {error.msg} at {error.pos}") from error
            except openai.APIError as error:  # an error event in the middle of a stream
                if any(m in str(error).lower() for m in CONTEXT_MARKERS):
                    raise ContextLimitError(str(error)[:200]) from error
                raise _Failure("server_error", f"the stream broke off: {str(error)[:200]}") from error
            except httpx.TimeoutException as error:
                raise _Failure("timeout", f"the stream stalled: {type(error).__name__}") from error
            except httpx.TransportError as error:  # raised while reading a stream, where openai does not wrap it
                if _cut_off(error):
                    raise _Failure("truncated", "the response body was cut off") from error
                raise _Failure("connection", str(error) or type(error).__name__) from error
            except (ValueError, TypeError, KeyError) as error:
                # ChatOpenAI raises these when a 200 body is not a chat completion (no choices, an error object, HTML).
                raise _Failure("malformed", f"the response is not a chat completion: {str(error)[:200]}") from error

    async def _stream(self, client: ChatOpenAI, messages: list[BaseMessage], options: dict[str, Any]) -> AIMessage:
        """The reply's chunks added up; silence longer than the first-token or the idle allowance is a timeout."""
        loop, reply = asyncio.get_running_loop(), None
        try:
            async with asyncio.timeout(self.first_token_s) as idle:
                async for chunk in client.astream(messages, **options):
                    reply = chunk if reply is None else reply + chunk
                    idle.reschedule(loop.time() + self.idle_timeout_s)
        except TimeoutError as error:
            if not idle.expired():
                raise
            silent = (f"no token within {self.first_token_s:g} s of the request" if reply is None
                      else f"no token for {self.idle_timeout_s:g} s mid-reply")
            raise _Failure("timeout", f"{silent} (HERA_IDLE_TIMEOUT_S)") from error
        if reply is None:
            raise _Failure("malformed", "the response is not a chat completion stream: it carried no chunk")
        return reply

    def _usage(self, reply: AIMessage, latency_s: float) -> UsageRecord:
        usage = reply.usage_metadata or {}
        input_tokens, output_tokens = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
        cached = (usage.get("input_token_details") or {}).get("cache_read") or 0
        cost = cost_usd(self.record_as, input_tokens, output_tokens, cached)
        return UsageRecord(role=self.role, model=self.record_as, input_tokens=input_tokens,
                           output_tokens=output_tokens, cached_tokens=cached, latency_s=round(latency_s, 3),
                           cost_usd=0.0 if cost is None and self.own_server else cost)


def _status_failure(error: openai.APIStatusError) -> _Failure:
    status = error.status_code
    detail = f"HTTP {status}: {str(error.message)[:200]}"
    if status == 429:
        return _Failure("rate_limited", detail, _retry_after(error))
    if status == 408:
        return _Failure("timeout", detail)
    if status >= 500 or status == 409:
        return _Failure("server_error", detail, _retry_after(error))
    if status == 400 and any(m in str(error.message).lower() for m in CONTEXT_MARKERS):
        raise ContextLimitError(detail) from error
    raise error


def _retry_after(error: openai.APIStatusError) -> float | None:
    try:
        return float(error.response.headers.get("retry-after", ""))
    except ValueError:
        return None


def _root_cause(error: BaseException) -> str:
    """The innermost cause's message: the wrappers' own say only "Connection error."."""
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error) or type(error).__name__


def _cut_off(error: BaseException) -> bool:
    """True when the connection closed mid-body (httpx's RemoteProtocolError, whichever httpx is installed)."""
    cause: BaseException | None = error
    while cause is not None:
        if type(cause).__name__ == "RemoteProtocolError" and "complete message body" in str(cause):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _ends_early(error: json.JSONDecodeError) -> bool:
    return error.pos >= len(error.doc.rstrip()) or error.msg.startswith("Unterminated string")
