"""A candidate bundle's hooks, run in a sandboxed child, one per episode.

`SandboxedHarness` stands in for the bundle's `Harness` in the episode: its
hooks are async and forward each call as one JSON line on the stdin of
`python -m harness.remote BUNDLE_DIR`, started in the sandbox
(`envs.sandbox`) on the first call. The child runs the real hooks on its
own `EpisodeView` mirror: the first call carries the view, each call the
observations appended since the last one, and each reply the public fields
(instruction, context, tools) the hook changed. Messages cross as
`messages_to_dict`, records as pydantic dumps.

`view.ask(messages, schema)` in the child sends the messages, the schema's
JSON schema and its class name; the parent asks its model with a stand-in
class that shows the model that exact schema and validates the reply against
it (`answer_schema`), and the child validates the answer again with the real
class. `view.lookup(tool, args)` in the child is made by the parent's episode,
which refuses a state-changing tool and records the call with the others. A hook that raises, answers garbage, dies (a resource limit) or takes
longer than `timeout_s` of the child's time raises `HookError`: the
harness's fault, not the infrastructure's. The child is killed by `aclose`.

    child -> parent: {"op": "ready"} | {"op": "ask", ...} | {"op": "lookup", "tool", "args"}
                     | {"op": "return", "value", "view"} | {"op": "raise", "error"}
    parent -> child: {"op": "call", "hook", "args", "from", "observations", "turn", "calls", "view"?}
                     | {"op": "answer", "value" | "error"}
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any, Self

import jsonschema
from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
from pydantic import BaseModel, ValidationError

from envs.spec import SpecError
from harness.abi import (
    BaseHarness,
    Decision,
    EpisodeView,
    Final,
    HarnessConfig,
    ToolRequest,
    answer_schema,
    call_hook,
)
from harness.bundle import Bundle, load_bundle
from envs.sandbox import Child, ChildError, private_stdio, scratch, stage
from state.records import Observation, ToolInfo

_PUBLIC = ("instruction", "context", "tools")
STARTUP_S = 60.0  # starting the sandboxed interpreter and importing the bundle: not the hooks' time, and slow on a loaded machine


class HookError(RuntimeError):
    """A sandboxed hook crashed, timed out or broke the protocol."""


class SandboxedHarness(BaseHarness):
    """The hooks of an untrusted bundle, each run in the episode's sandboxed child."""

    def __init__(self, bundle: Bundle, *, timeout_s: float = 30, memory_mb: int = 1024, cpu_s: int = 600):
        self.bundle, self.timeout_s, self.memory_mb, self.cpu_s = bundle, timeout_s, memory_mb, cpu_s
        self._where = f"{bundle.path / 'hooks.py'}: Harness"
        self._child: Child | None = None
        self._workdir: Path | None = None
        self._staged = ""
        self._sent = 0
        self._broken: str | None = None
        self._lock = asyncio.Lock()

    async def initialize(self, view: EpisodeView) -> None:
        await self._call("initialize", view)

    async def compose_instructions(self, view: EpisodeView) -> str:
        return _expect(await self._call("compose_instructions", view), str, self._where, "compose_instructions")

    async def prepare_turn(self, view: EpisodeView, messages: list[BaseMessage]) -> list[BaseMessage]:
        value = await self._call("prepare_turn", view, messages_to_dict(messages))
        try:
            return messages_from_dict(value)
        except (TypeError, KeyError, ValueError) as exc:
            raise HookError(f"{self._where}.prepare_turn: returned messages that do not load: {exc}") from None

    async def before_tool_call(self, view: EpisodeView, call: ToolRequest) -> Decision:
        return _record(Decision, await self._call("before_tool_call", view, call.model_dump(mode="json")),
                       self._where, "before_tool_call")

    async def present_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str:
        value = await self._call("present_result", view, call.model_dump(mode="json"), observation.model_dump(mode="json"))
        return _expect(value, str, self._where, "present_result")

    async def after_tool_result(self, view: EpisodeView, call: ToolRequest, observation: Observation) -> str | None:
        value = await self._call("after_tool_result", view, call.model_dump(mode="json"), observation.model_dump(mode="json"))
        return None if value is None else _expect(value, str, self._where, "after_tool_result")

    async def finalize(self, view: EpisodeView, answer: str) -> Final:
        return _record(Final, await self._call("finalize", view, answer), self._where, "finalize")

    async def aclose(self) -> None:
        """Kill the child and everything it started; remove its working directory."""
        child, self._child = self._child, None
        if child is not None:
            await child.close()
        if self._workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self._workdir, True)
            self._workdir = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _call(self, hook: str, view: EpisodeView, *args: Any) -> Any:
        async with self._lock:
            if self._broken is not None:
                raise HookError(f"{self._where}.{hook}: the sandboxed harness is no longer running ({self._broken})")
            try:
                return await self._exchange(hook, view, args)
            except HookError as exc:
                self._broken = str(exc)
                await self.aclose()
                raise
            except BaseException as exc:  # the parent's own failure (the model, a cancel): the child is left mid-call
                self._broken = f"stopped by {type(exc).__name__}"
                await self.aclose()
                raise

    async def _exchange(self, hook: str, view: EpisodeView, args: tuple) -> Any:
        request: dict[str, Any] = {"op": "call", "hook": hook, "args": list(args)}
        if self._child is None:
            await self._start(hook)
            request["view"] = {"instruction": view.instruction, "context": view.context,
                               "tools": [t.model_dump(mode="json") for t in view.tools],
                               "config": view.config.model_dump(mode="json"), "prompts": view.prompts,
                               "skills": view.skills, "memory": view.memory}
            self._sent = 0
        request["from"] = min(self._sent, len(view.observations))
        request["observations"] = [o.model_dump(mode="json") for o in view.observations[request["from"]:]]
        request["turn"], request["calls"] = view.turn, view.calls
        self._sent = len(view.observations)
        await self._send(hook, request)
        while True:
            reply = await self._receive(hook)
            op = reply.get("op")
            if op == "ask":
                await self._send(hook, await self._ask(hook, view, reply))
            elif op == "lookup":
                await self._send(hook, await self._lookup(view, reply))
            elif op == "return":
                self._apply(hook, view, reply.get("view") or {})
                return reply.get("value")
            elif op == "raise":
                raise HookError(self._shown(f"{self._where}.{hook}: raised {reply.get('error', '?')}\n{reply.get('traceback', '')}".rstrip()))
            else:
                raise HookError(f"{self._where}.{hook}: the sandboxed child sent {op!r}, not a reply")

    async def _start(self, hook: str) -> None:
        self._workdir = await asyncio.to_thread(scratch, "harness")
        staged = await asyncio.to_thread(stage, self.bundle.path, self._workdir)
        self._staged = str(staged)
        self._child = await Child.start(["-m", "harness.remote", str(staged)], workdir=self._workdir, cpu_s=self.cpu_s,
                                        memory_mb=self.memory_mb, owner=self)
        ready = await self._receive(hook, max(self.timeout_s, STARTUP_S))
        if ready.get("op") != "ready":
            raise HookError(f"{self._where}: the bundle does not load in the sandbox: {self._shown(str(ready.get('error', ready)))}")

    async def _send(self, hook: str, message: dict) -> None:
        try:
            await self._child.send(message, self.timeout_s)
        except ChildError as exc:
            raise HookError(f"{self._where}.{hook}: {self._shown(str(exc))}") from None

    async def _receive(self, hook: str, timeout_s: float | None = None) -> dict:
        try:
            return await self._child.receive(timeout_s or self.timeout_s)
        except ChildError as exc:
            raise HookError(f"{self._where}.{hook}: {self._shown(str(exc))}") from None

    def _shown(self, text: str) -> str:
        """`text` naming the bundle where it is, not where the child sees its copy."""
        return text.replace(self._staged, str(self.bundle.path)) if self._staged else text

    async def _ask(self, hook: str, view: EpisodeView, request: dict) -> dict:
        if view.ask is None:
            return {"op": "answer", "error": "this episode has no model to ask"}
        try:
            schema = answer_schema(str(request.get("name", "")), request["schema"])
            messages = messages_from_dict(request["messages"])
        except (KeyError, TypeError, ValueError, jsonschema.SchemaError) as exc:
            raise HookError(f"{self._where}.{hook}: view.ask sent an unusable request: {exc}") from None
        answer = await view.ask(messages, schema)
        return {"op": "answer", "value": answer.model_dump(mode="json")}

    async def _lookup(self, view: EpisodeView, request: dict) -> dict:
        """A hook's own read-only call, made by the episode (which records it); a refused one is the hook's to handle."""
        if view.lookup is None:
            return {"op": "answer", "error": "this episode has no environment to look up"}
        tool, args = request.get("tool"), request.get("args")
        if not isinstance(tool, str) or not isinstance(args, dict):
            return {"op": "answer", "error": "view.lookup takes a tool name and a dict of arguments"}
        try:
            observation = await view.lookup(tool, args)
        except ValueError as exc:
            return {"op": "answer", "error": str(exc)}
        self._sent += 1  # the child appends it to its own view too
        return {"op": "answer", "value": observation.model_dump(mode="json")}

    def _apply(self, hook: str, view: EpisodeView, changed: dict) -> None:
        try:
            for name, value in changed.items():
                if name == "tools":
                    view.tools = [ToolInfo.model_validate(t) for t in value]
                elif name in _PUBLIC:
                    setattr(view, name, _expect(value, str, self._where, hook))
        except ValidationError as exc:
            raise HookError(f"{self._where}.{hook}: left view.tools invalid: {exc.errors()[0]['msg']}") from None


def _expect(value: Any, kind: type, where: str, hook: str) -> Any:
    if not isinstance(value, kind):
        raise HookError(f"{where}.{hook}: returned {type(value).__name__}, expected {kind.__name__}")
    return value


def _record(model: type[BaseModel], value: Any, where: str, hook: str) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise HookError(f"{where}.{hook}: returned no valid {model.__name__}: {exc.errors()[0]['msg']}") from None


class _Channel:
    """The protocol's private ends of stdin and stdout: what a hook prints goes to stderr."""

    def __init__(self) -> None:
        self.reader, self.writer = private_stdio()

    def send(self, message: dict) -> None:
        self.write(json.dumps(message))

    def write(self, line: str) -> None:
        self.writer.write(line.encode() + b"\n")
        self.writer.flush()

    def receive(self) -> dict | None:
        line = self.reader.readline()
        return json.loads(line) if line else None


_RETURNS = {"initialize": object, "compose_instructions": str, "prepare_turn": list, "before_tool_call": Decision,
            "present_result": str, "after_tool_result": (str, type(None)), "finalize": Final}


def _arguments(hook: str, args: list) -> list:
    if hook == "prepare_turn":
        return [messages_from_dict(args[0])]
    if hook == "before_tool_call":
        return [ToolRequest.model_validate(args[0])]
    if hook in ("present_result", "after_tool_result"):
        return [ToolRequest.model_validate(args[0]), Observation.model_validate(args[1])]
    return args


def _encode(hook: str, result: Any) -> Any:
    expected = _RETURNS[hook]
    if not isinstance(result, expected) or (hook == "prepare_turn" and not all(isinstance(m, BaseMessage) for m in result)):
        raise TypeError(f"returned {type(result).__name__}, expected {getattr(expected, '__name__', 'str or None')}"
                        + (" of messages" if hook == "prepare_turn" else ""))
    if hook == "initialize":
        return None
    if hook == "prepare_turn":
        return messages_to_dict(result)
    return result.model_dump(mode="json") if isinstance(result, BaseModel) else result


def _public(view: EpisodeView) -> dict:
    return {"instruction": view.instruction, "context": view.context, "tools": [t.model_dump(mode="json") for t in view.tools]}


async def serve(harness: BaseHarness, channel: _Channel) -> None:
    """The child's loop: one hook call per request, until stdin closes."""
    me = os.getpid()

    async def ask(messages: list[BaseMessage], schema: type[BaseModel]) -> BaseModel:
        channel.send({"op": "ask", "messages": messages_to_dict(messages), "name": schema.__name__,
                      "schema": schema.model_json_schema()})
        reply = channel.receive() or {}
        if "error" in reply:
            raise RuntimeError(f"view.ask failed: {reply['error']}")
        return schema.model_validate(reply.get("value"))

    async def lookup(tool: str, args: dict) -> Observation:
        channel.send({"op": "lookup", "tool": tool, "args": args})
        reply = channel.receive() or {}
        if "error" in reply:
            raise ValueError(f"view.lookup failed: {reply['error']}")
        observation = Observation.model_validate(reply.get("value"))
        view.observations.append(observation)
        return observation

    view: EpisodeView | None = None
    shown: dict = {}
    while (request := channel.receive()) is not None:
        if view is None:
            start = request["view"]
            view = EpisodeView(instruction=start["instruction"], context=start["context"],
                               tools=[ToolInfo.model_validate(t) for t in start["tools"]],
                               config=HarnessConfig.model_validate(start["config"]), prompts=start["prompts"],
                               skills=start["skills"], memory=start["memory"], ask=ask, lookup=lookup)
            shown = _public(view)
        view.observations[request["from"]:] = [Observation.model_validate(o) for o in request["observations"]]
        view.turn, view.calls = request.get("turn", 0), request.get("calls", 0)
        hook = request["hook"]
        try:
            result = await call_hook(getattr(harness, hook), view, *_arguments(hook, request["args"]))
            now = _public(view)
            reply = {"op": "return", "value": _encode(hook, result), "view": {k: v for k, v in now.items() if v != shown[k]}}
            shown = now
            line = json.dumps(reply)
        except Exception as exc:  # the hook's failure is the answer: the parent ends the episode with it
            line = json.dumps({"op": "raise", "error": f"{type(exc).__name__}: {exc}",
                               "traceback": traceback.format_exc(limit=-3)})
        if os.getpid() != me:  # a copy forked by a hook must not answer
            os._exit(0)
        channel.write(line)


def main(bundle_dir: str) -> None:
    channel = _Channel()
    try:
        harness = load_bundle(bundle_dir).harness()
    except SpecError as exc:
        channel.send({"op": "raise", "error": str(exc)})
        return
    channel.send({"op": "ready"})
    asyncio.run(serve(harness, channel))


if __name__ == "__main__":
    main(sys.argv[1])
