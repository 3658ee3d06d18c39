"""Generated environment tools, run only in the sandbox (`envs.sandbox`).

A model-written `tools.py` is untrusted code, so this process never imports
it: `check_tools` runs the tool checks, `SandboxedTools` serves the tools to
one solver run and `check_task` replays a task and tests its verifier, each
in a sandboxed child that gets a copy of the environment's public files only
(`envs.construct.stage_public`: no tasks, no construction log). What the
tools print goes to the child's stderr, never into the protocol.

    python -m harness.tool_sandbox check DIR          one JSON line: {"problems", "tools"}
    python -m harness.tool_sandbox verify DIR TASK    one JSON line: a TaskCheck
    python -m harness.tool_sandbox serve DIR          {"tool", "args"} lines in, {"op", ...} lines out
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Self

from envs.construct import check_task as run_task_check, stage_public, tool_problems
from envs.runtime import EnvInstance
from envs.spec import SpecError, load_environment, run_untrusted_here
from harness.remote import _Channel
from envs.sandbox import Child, ChildError, run_sandboxed, scratch, workspace
from state.construction import TaskCheck
from state.records import Observation, TaskSpec, ToolInfo


class ToolSandboxError(RuntimeError):
    """The sandboxed child crashed, timed out or broke the protocol."""


def _run(directory: Path, args: list[str], timeout_s: float, files: dict[str, str] | None = None) -> dict:
    with workspace("tools") as tmp:
        copy = stage_public(Path(directory), tmp)
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        try:
            done = run_sandboxed(["-m", "harness.tool_sandbox", args[0], str(copy), *args[1:]], timeout_s=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise ToolSandboxError(f"{directory}: did not finish within {timeout_s:g}s (an endless loop in tools.py?)") from None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        tail = done.stderr.strip().replace(str(copy), str(directory))[-800:]
        raise ToolSandboxError(f"{directory}: the sandboxed child crashed (exit {done.returncode}): {tail}") from None


async def check_tools(directory: Path | str, timeout_s: float = 120) -> tuple[list[str], list[ToolInfo]]:
    """The problems of an environment's tools and the tools' public faces,
    found by running every declared call in the sandbox."""
    try:
        result = await asyncio.to_thread(_run, Path(directory), ["check"], timeout_s)
    except ToolSandboxError as exc:
        return [str(exc)], []
    return list(result["problems"]), [ToolInfo.model_validate(t) for t in result["tools"]]


async def check_task(directory: Path | str, task: TaskSpec, timeout_s: float = 120) -> TaskCheck:
    """The task's reference replayed in the sandbox, with the verifier run on it and on perturbed outcomes."""
    result = await asyncio.to_thread(_run, Path(directory), ["verify", "../task.json"], timeout_s,
                                     {"task.json": task.model_dump_json()})
    if "error" in result:
        raise ToolSandboxError(f"{directory}: {result['error']}")
    return TaskCheck.model_validate(result)


class SandboxedTools:
    """An environment's public tools served from one sandboxed child, with fresh state, for one run."""

    def __init__(self, directory: Path | str, *, timeout_s: float = 30, cpu_s: int = 600, memory_mb: int = 1024):
        self.directory, self.timeout_s, self.cpu_s, self.memory_mb = Path(directory), timeout_s, cpu_s, memory_mb
        self.tools: list[ToolInfo] = []
        self._child: Child | None = None
        self._workdir: Path | None = None

    async def __aenter__(self) -> Self:
        self._workdir = await asyncio.to_thread(scratch, "tools")
        copy = await asyncio.to_thread(stage_public, self.directory, self._workdir)
        try:
            self._child = await Child.start(["-m", "harness.tool_sandbox", "serve", str(copy)], workdir=self._workdir,
                                            cpu_s=self.cpu_s, memory_mb=self.memory_mb, owner=self)
            ready = await self._child.receive(self.timeout_s)
            if ready.get("op") != "ready":
                raise ToolSandboxError(f"{self.directory}: the environment does not load in the sandbox: {ready.get('error', ready)}")
            self.tools = [ToolInfo.model_validate(t) for t in ready["tools"]]
        except ChildError as exc:
            await self.aclose()
            raise ToolSandboxError(f"{self.directory}: {exc}") from None
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def call(self, name: str, args: dict[str, Any]) -> Observation:
        """One tool call; a call that crashes the child raises ToolSandboxError."""
        try:
            await self._child.send({"tool": name, "args": args}, self.timeout_s)
            reply = await self._child.receive(self.timeout_s)
        except ChildError as exc:
            raise ToolSandboxError(f"{name}: {exc}") from None
        if reply.get("op") != "observation":
            raise ToolSandboxError(f"{name}({json.dumps(args)}): {reply.get('error', reply)}")
        return Observation.model_validate(reply["value"])

    async def aclose(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await child.close()
        if self._workdir is not None:
            await asyncio.to_thread(shutil.rmtree, self._workdir, True)
            self._workdir = None


def _serve(channel: _Channel, directory: str) -> None:
    try:
        instance = EnvInstance(load_environment(directory))
    except SpecError as exc:
        channel.send({"op": "error", "error": str(exc)})
        return
    channel.send({"op": "ready", "tools": [t.model_dump(mode="json") for t in instance.public_tools]})
    while (request := channel.receive()) is not None:
        try:
            obs = instance.call(str(request["tool"]), dict(request.get("args") or {}))
        except BaseException as exc:  # escaped the runtime's guard: report it, and stop serving a broken state
            channel.send({"op": "error", "error": f"escaped the runtime with {type(exc).__name__}: {exc}"})
            return
        channel.send({"op": "observation", "value": obs.model_dump(mode="json")})


def main(argv: list[str]) -> None:
    run_untrusted_here()
    channel = _Channel()
    command, directory = argv[0], argv[1]
    if command == "serve":
        _serve(channel, directory)
    elif command == "check":
        problems, tools = tool_problems(directory)
        channel.send({"problems": problems, "tools": [t.model_dump(mode="json") for t in tools]})
    elif command == "verify":
        task = TaskSpec.model_validate_json(Path(directory, argv[2]).read_text())
        try:
            env = load_environment(directory)
        except SpecError as exc:
            channel.send({"error": str(exc)})
            return
        channel.send(run_task_check(env, task).model_dump(mode="json"))


if __name__ == "__main__":
    main(sys.argv[1:])
