"""Scripted models for tests: named lists of replies, replayed in order and strict about surprises.

`register("agent", steps)` then `chat_model("scripted:agent", role=...)`. Every
model built from the same name reads the same script, one step per call; a
call past the end raises `ScriptError`, and `assert_consumed` raises while
steps remain, so a test notices both an extra call and a missing one.

A step for `complete` is an AIMessage, a str (the reply's content), a dict
`{"content": ..., "tool_calls": [{"name", "args"}]}`, or a callable (plain or
async, so a benchmark can simulate latency) `(messages, tools) -> ` any of these. A step for `structured` is a pydantic
instance, a dict or a JSON str validated against the schema, or a callable
`(messages, schema) -> ` any of these; one that does not validate raises
`InfrastructureError("malformed")` at once. Any step may be an exception
instance, which the call raises. Scripted models never retry.

With `register(..., text_tools=True)` the model behaves like the local one:
callables see the folded conversation, and calls are parsed out of the reply
text. A call with `action_mode="structured"` takes a step that is an action
object (`{"tool", "arguments"}` or `{"final_answer"}`) or its JSON text, and a
reply outside that grammar raises `InfrastructureError("malformed")`. Usage is counted deterministically, a token per four characters.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Union

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ValidationError

from roles.models.base import Completion, InfrastructureError, check_messages, cost_usd
from roles.models.tool_calls import ACTION_INSTRUCTION, ActionError, fold_history, number_calls, parse_action, parse_tool_calls, text_of
from state.records import ToolInfo, UsageRecord

Step = Union[AIMessage, str, dict, BaseModel, BaseException, Callable[..., Any]]


class ScriptError(AssertionError):
    """A scripted model was called when its script did not expect it, or not called when it did."""


@dataclass(frozen=True)
class ScriptedCall:
    """What one call of a scripted model received."""

    method: Literal["complete", "structured"]
    messages: list[BaseMessage]
    tools: list[ToolInfo] | None = None
    schema: type[BaseModel] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    action_mode: str = "text"
    seed: int | None = None


@dataclass
class Script:
    steps: list[Step]
    text_tools: bool = False
    calls: list[ScriptedCall] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return len(self.steps) - len(self.calls)


_scripts: dict[str, Script] = {}


def register(name: str, steps: Iterable[Step], *, text_tools: bool = False) -> None:
    """Make `scripted:<name>` replay `steps`, replacing any earlier script of that name."""
    _scripts[name] = Script(steps=list(steps), text_tools=text_tools)


def calls(name: str) -> list[ScriptedCall]:
    """The calls the script `name` has answered so far, in order."""
    return list(_script(name).calls)


def assert_consumed(name: str | None = None) -> None:
    """Raise ScriptError if the script `name` (or, without a name, any script) has steps left."""
    for script_name in [name] if name else sorted(_scripts):
        script = _script(script_name)
        if script.remaining:
            nxt = script.steps[len(script.calls)]
            raise ScriptError(f"script {script_name!r}: {script.remaining} of {len(script.steps)} steps "
                              f"not consumed; the next is {_preview(nxt)}")


def clear(name: str | None = None) -> None:
    """Forget the script `name`, or every script."""
    if name:
        _scripts.pop(name, None)
    else:
        _scripts.clear()


def worker_plugin(**scripts: Iterable[Step]):
    """A Dask worker plugin that registers `scripts` in every worker process of an engine, one started in place of
    a dead worker too (the engine's tests and benchmarks): each process replays its own copy, as strictly."""
    from distributed import WorkerPlugin

    class Scripts(WorkerPlugin):
        name = "scripts"  # registering another replaces it: a fresh copy for the next run

        def setup(self, worker) -> None:
            clear()
            for name, steps in scripts.items():
                register(name, steps)

    return Scripts()


def _script(name: str) -> Script:
    if name not in _scripts:
        known = ", ".join(sorted(_scripts)) or "none"
        raise ScriptError(f"no script registered as {name!r} (registered: {known}); call roles.models.scripted.register first")
    return _scripts[name]


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _tokens(text: str) -> int:
    return len(text) // 4


class ScriptedModel:
    """A `ChatModel` that answers from the script registered under `name`."""

    def __init__(self, name: str, *, role: str):
        self.name, self.role, self.spec = name, role, f"scripted:{name}"

    def __repr__(self) -> str:
        return f"ScriptedModel(spec={self.spec!r}, role={self.role!r})"

    def _next(self, call: ScriptedCall) -> tuple[int, Step]:
        script = _script(self.name)
        index = len(script.calls)
        if index >= len(script.steps):
            last = call.messages[-1] if call.messages else None
            raise ScriptError(f"script {self.name!r} has {len(script.steps)} steps; call {index + 1} "
                              f"({call.method}, role {self.role!r}) was not expected. Last message: {_preview(last)}")
        script.calls.append(call)
        return index, script.steps[index]

    async def complete(self, messages: list[BaseMessage], tools: list[ToolInfo] | None = None, *,
                       max_tokens: int | None = None, temperature: float | None = None,
                       action_mode: str = "text", seed: int | None = None) -> Completion:
        check_messages(messages)
        text_tools = _script(self.name).text_tools
        structured = action_mode == "structured" and bool(tools)
        if structured:
            seen = fold_history(messages, tools, ACTION_INSTRUCTION)
        else:
            seen = fold_history(messages, tools or ()) if text_tools else list(messages)
        index, step = self._next(ScriptedCall("complete", list(messages), list(tools) if tools is not None else None,
                                              max_tokens=max_tokens, temperature=temperature, action_mode=action_mode,
                                              seed=seed))
        if callable(step) and not isinstance(step, (type, BaseException)):
            step = step(seen, tools)
            if inspect.isawaitable(step):
                step = await step
        if isinstance(step, BaseException):
            raise step
        if structured and isinstance(step, dict) and not {"content", "tool_calls"} & set(step):
            step = json.dumps(step)  # an action object, as the grammar would have it written
        reply = self._message(index, step)
        content, found = text_of(reply.content), list(reply.tool_calls)
        if structured:
            try:
                content, found = parse_action(content, tools)
            except ActionError as error:
                raise InfrastructureError("malformed", f"step {index + 1}: {error}", self.spec) from error
        elif text_tools and tools:
            content, parsed = parse_tool_calls(content, tools)
            found += parsed
        message = AIMessage(content=content, tool_calls=number_calls(found, messages),
                            response_metadata=reply.response_metadata)
        truncated = reply.response_metadata.get("finish_reason") == "length"
        prompt = "".join(text_of(m.content) for m in seen) + (json.dumps([t.model_dump() for t in tools]) if tools else "")
        output = content + (json.dumps([[c["name"], c["args"]] for c in message.tool_calls]) if found else "")
        return Completion(message=message, usage=self._usage(prompt, output), truncated=truncated)

    async def structured(self, messages: list[BaseMessage], schema: type[BaseModel]) -> tuple[BaseModel, UsageRecord]:
        check_messages(messages)
        index, step = self._next(ScriptedCall("structured", list(messages), schema=schema))
        if callable(step) and not isinstance(step, (type, BaseException)):
            step = step(list(messages), schema)
        if isinstance(step, BaseException):
            raise step
        try:
            if isinstance(step, BaseMessage):
                raise ScriptError(f"script {self.name!r} step {index + 1} is a {type(step).__name__}; a structured "
                                  "call takes a pydantic instance, a dict, a JSON str, a callable or an exception")
            if isinstance(step, schema):
                value = step
            elif isinstance(step, BaseModel):
                value = schema.model_validate(step.model_dump())
            elif isinstance(step, dict):
                value = schema.model_validate(step)
            elif isinstance(step, str):
                value = schema.model_validate_json(step)
            else:
                raise ScriptError(f"script {self.name!r} step {index + 1} is a {type(step).__name__}; a structured "
                                  "call takes a pydantic instance, a dict, a JSON str, a callable or an exception")
        except ValidationError as error:
            raise InfrastructureError("malformed", f"step {index + 1} is not a valid {schema.__name__}: "
                                                   f"{error.errors()[0]['msg']}", self.spec) from error
        prompt = "".join(text_of(m.content) for m in messages)
        # model_dump_json's text, without encoding it: a lone surrogate in a value is the caller's to handle
        return value, self._usage(prompt, json.dumps(value.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":")))

    def _message(self, index: int, step: Any) -> AIMessage:
        if isinstance(step, AIMessage):
            return step
        if isinstance(step, str):
            return AIMessage(content=step)
        if isinstance(step, dict):
            unknown = set(step) - {"content", "tool_calls"}
            if unknown:
                raise ScriptError(f"script {self.name!r} step {index + 1} has keys {sorted(unknown)}; "
                                  "expected 'content' and 'tool_calls'")
            tool_calls = [{"name": c["name"], "args": c.get("args", {}), "id": None} for c in step.get("tool_calls", ())]
            return AIMessage(content=step.get("content", ""), tool_calls=tool_calls)
        raise ScriptError(f"script {self.name!r} step {index + 1} is a {type(step).__name__}; a complete call "
                          "takes an AIMessage, a str, a dict, a callable or an exception")

    def _usage(self, prompt: str, output: str) -> UsageRecord:
        input_tokens, output_tokens = _tokens(prompt), _tokens(output)
        return UsageRecord(role=self.role, model=self.spec, input_tokens=input_tokens, output_tokens=output_tokens,
                           cost_usd=cost_usd(self.spec, input_tokens, output_tokens, 0))
