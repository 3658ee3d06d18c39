"""Models behind an OpenAI-compatible chat completions endpoint: any `openai:<model>` server, and the embedded
llama.cpp model (`local`), whose tool calls go through the text adapter of `roles.models.tool_calls`. Every
call has a timeout, replies are streamed so a silent endpoint is noticed within the idle timeout, and
endpoint trouble is retried with backoff, then raised as `InfrastructureError`."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import weakref
from contextlib import nullcontext
from typing import Any, Awaitable, Callable, TypeVar

import httpx
import openai
from langchain_core.messages import AIMessage, BaseMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ValidationError

from roles.models.base import CONTEXT_MARKERS, ActionMode, Completion, ContextLimitError, InfrastructureError, check_messages, cost_usd
from roles.models.local import local_server, slots
from roles.models.tool_calls import (
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

MAX_BACKOFF_S = 60.0
# A structured reply longer than this is a model going round in its grammar (seen: a 1.5B model past 2,000
# tokens of one JSON reply at 3 tokens/s); it is cut off and asked again, not waited for.
STRUCTURED_MAX_TOKENS = 1536
IDLE_TIMEOUT_S = 45.0
# A text reply whose tail is one passage said over and over is cut after the passage's first copy: in run std18
# three bench episodes of the embedded model wrote the same JSON line or sentence until the reply limit, turn after
# turn (2,950 of the bench's 4,924 seconds). A passage counts from 12 characters, six copies and 300 characters on.
LOOP_COPIES, LOOP_CHARS, LOOP_UNIT = 6, 300, (12, 400)
LOOP_CHECK_CHARS = 64  # how much new text a reply gains between two looks for a loop
COUNT_TIMEOUT_S = 10.0  # for the server's token count of a reply cut off
SEEDS = 2 ** 31  # sampling seeds are taken modulo this: llama.cpp's are 32-bit, with one value meaning "random"
T = TypeVar("T")


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


def loop_cut(text: str) -> int | None:
    """Where `text` should stop when its tail is one passage said over and over (`LOOP_COPIES` copies of 12 to 400
    characters, `LOOP_CHARS` in all): the end of the passage's first copy; None when it is not."""
    n = len(text)
    for size in range(LOOP_UNIT[0], min(LOOP_UNIT[1], n // LOOP_COPIES) + 1):
        unit, copies = text[n - size:], max(LOOP_COPIES, -(-LOOP_CHARS // size))
        if copies * size > n or any(text[n - (k + 1) * size:n - k * size] != unit for k in range(1, copies)):
            continue
        start = n - copies * size
        while start >= size and text[start - size:start] == unit:
            start -= size
        return start + size
    return None


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


async def local_base_url() -> str:
    server = await asyncio.to_thread(local_server)
    return f"{server.base_url}/v1"


class OpenAICompatibleModel:
    """A `ChatModel` over an OpenAI-compatible chat completions endpoint.

    With `text_tools`, tools are described in the prompt and calls parsed from
    the reply text (`roles.models.tool_calls`) instead of requested natively.
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
                 first_token_s: float | None = None, reply_tokens: int | None = None, cut_loops: bool = False):
        if cut_loops and not callable(base_url):
            raise ValueError("cut_loops needs an endpoint this process starts itself: its calls go one at a time")
        self.spec, self.role, self.model, self.record_as = spec, role, model, record_as
        self.cut_loops = cut_loops
        self.reply_tokens = reply_tokens  # the most tokens a text reply may have, whatever a caller asks for
        self.timeout_s, self.max_retries, self.retry_base_s = timeout_s, max_retries, retry_base_s
        self.idle_timeout_s, self.first_token_s = idle_timeout_s, first_token_s or idle_timeout_s
        self.text_tools, self.own_server = text_tools, callable(base_url)
        self._base_url, self._api_key, self._sampling = base_url, api_key, dict(sampling or {})
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ChatOpenAI] = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, role={self.role!r})"

    async def complete(self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *,
                       max_tokens: int | None = None, temperature: float | None = None,
                       action_mode: ActionMode = "text", seed: int | None = None) -> Completion:
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
        limits = [n for n in (max_tokens, self.reply_tokens) if n is not None]
        if limits and not structured:
            options["max_tokens"] = min(limits)
        if temperature is not None:
            options["temperature"] = temperature
        started, tries = time.monotonic(), itertools.count()

        async def attempt() -> tuple[AIMessage, str, list[dict[str, Any]], bool]:
            # A retry after a malformed or truncated reply must not sample that reply again: it takes the next seed.
            seeded = options if seed is None else {**options, "seed": (seed + next(tries)) % SEEDS}
            reply = await self._invoke(sent, seeded, cut_loops=self.cut_loops and not structured)
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
            truncated = reply.response_metadata.get("finish_reason") in ("length", "loop")
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

    async def _invoke(self, messages: list[BaseMessage], options: dict[str, Any], cut_loops: bool = False) -> AIMessage:
        client = await self._client()
        async with self._gate():
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._stream(client, messages, options, cut_loops)
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

    async def _stream(self, client: ChatOpenAI, messages: list[BaseMessage], options: dict[str, Any],
                      cut_loops: bool) -> AIMessage:
        """The reply's chunks added up; silence longer than the first-token or the idle allowance is a timeout.
        With `cut_loops`, a reply going round one passage stops there."""
        loop, reply, text, looked, end = asyncio.get_running_loop(), None, "", 0, None
        try:
            async with asyncio.timeout(self.first_token_s) as idle:
                async for chunk in client.astream(messages, **options):
                    reply = chunk if reply is None else reply + chunk
                    idle.reschedule(loop.time() + self.idle_timeout_s)
                    text += chunk.content if cut_loops and isinstance(chunk.content, str) else ""
                    if len(text) - looked >= LOOP_CHECK_CHARS:
                        looked = len(text)
                        if (end := loop_cut(text)) is not None:
                            break
        except TimeoutError as error:
            if not idle.expired():
                raise
            silent = (f"no token within {self.first_token_s:g} s of the request" if reply is None
                      else f"no token for {self.idle_timeout_s:g} s mid-reply")
            raise _Failure("timeout", f"{silent} (HERA_IDLE_TIMEOUT_S)") from error
        if reply is None:
            raise _Failure("malformed", "the response is not a chat completion stream: it carried no chunk")
        if end is not None:
            # Closing the client's connections is what stops the server: a stream left early is closed only when
            # the garbage collector gets to it. The next call makes a new client.
            self._clients.pop(loop, None)
            await client.http_async_client.aclose()
            return await self._cut(reply, messages, text, end)
        return reply

    async def _cut(self, reply: AIMessage, messages: list[BaseMessage], text: str, end: int) -> AIMessage:
        """`reply` cut off at `end` of its `text`, with the tokens the server counts in its prompt and in what came
        (a stream closed early brings no usage); a server without `/tokenize` leaves them 0, logged."""
        base_url = await self._base_url() if callable(self._base_url) else self._base_url
        root, usage = str(base_url).removesuffix("/").removesuffix("/v1"), {"input_tokens": 0, "output_tokens": 0}
        roles = {"system": "system", "human": "user", "ai": "assistant"}
        try:
            async with httpx.AsyncClient(base_url=root, timeout=COUNT_TIMEOUT_S, trust_env=not self.own_server) as http:
                prompt = (await http.post("/apply-template", json={"messages": [
                    {"role": roles.get(m.type, "user"), "content": text_of(m.content)} for m in messages]})).json()["prompt"]
                for key, content in (("input_tokens", prompt), ("output_tokens", text)):
                    answer = await http.post("/tokenize", json={"content": content, "parse_special": True})
                    usage[key] = len(answer.raise_for_status().json()["tokens"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            log.warning("%s: a reply cut off in a loop has no token count (%s)", self.spec, _root_cause(error))
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        log.info("%s: reply cut off after %d characters that went round one passage", self.spec, len(text) - end)
        return reply.model_copy(update={"content": text[:end], "usage_metadata": usage,
                                        "response_metadata": {**reply.response_metadata, "finish_reason": "loop"}})

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
