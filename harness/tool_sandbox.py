"""Generated environment tools, run only in the sandbox (`envs.sandbox`).

A model-written `tools.py` is untrusted code, so this process never imports
it: `check_tools` runs the tool checks and `check_task` replays a task and
tests its verifier, each in a sandboxed child that gets a copy of the
environment's public files only (`envs.construct.stage_public`: no tasks, no
construction log). A solver's tools are served by `EnvInstance`, which runs
such code in a sandboxed child of its own (`envs.untrusted`). What the tools
print goes to the child's stderr, never into the protocol.

    python -m harness.tool_sandbox check DIR          one JSON line: {"problems", "tools", "failing"}
    python -m harness.tool_sandbox verify DIR TASK    one JSON line: a TaskCheck
    python -m harness.tool_sandbox menu DIR TASK      one JSON line: {"options"}, the task's mutation menu
    python -m harness.tool_sandbox seeds DIR N SEED   one JSON line: {"seeds"}, up to N task seeds (`envs.seeds`)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from envs.catalog import Parent
from envs.construct import check_task as run_task_check, stage_public, tool_problems
from envs.menu import Option, menu, remember
from envs.seeds import task_seeds
from envs.sandbox import run_sandboxed, workspace
from envs.spec import SpecError, load_environment, run_untrusted_here
from harness.remote import _Channel
from state.construction import TaskCheck, TaskSeed
from state.records import Mutation, TaskSpec, ToolInfo


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


async def check_tools(directory: Path | str, timeout_s: float = 120) -> tuple[list[str], list[ToolInfo], list[str]]:
    """The problems of an environment's tools, the tools' public faces and the names of the tools with a problem
    of their own, found by running every declared call in the sandbox."""
    try:
        result = await asyncio.to_thread(_run, Path(directory), ["check"], timeout_s)
    except ToolSandboxError as exc:
        return [str(exc)], [], []
    return list(result["problems"]), [ToolInfo.model_validate(t) for t in result["tools"]], list(result["failing"])


async def check_task(directory: Path | str, task: TaskSpec, timeout_s: float = 120) -> TaskCheck:
    """The task's reference replayed in the sandbox, with the verifier run on it and on perturbed outcomes."""
    result = await asyncio.to_thread(_run, Path(directory), ["verify", "../task.json"], timeout_s,
                                     {"task.json": task.model_dump_json()})
    if "error" in result:
        raise ToolSandboxError(f"{directory}: {result['error']}")
    return TaskCheck.model_validate(result)


async def sandboxed_seeds(directory: Path | str, count: int, seed: int, timeout_s: float = 600) -> list[TaskSeed]:
    """Up to `count` task seeds of a built environment (`envs.seeds`), drawn with `seed` in a sandboxed child."""
    result = await asyncio.to_thread(_run, Path(directory), ["seeds", str(count), str(seed)], timeout_s)
    if "error" in result:
        raise ToolSandboxError(f"{directory}: {result['error']}")
    return [TaskSeed.model_validate(s) for s in result["seeds"]]


async def sandboxed_menu(parent: Parent, timeout_s: float = 1800) -> list[Option]:
    """The mutation menu of a task on a generated environment, computed in one sandboxed child (where certifying the
    options runs the tools in process, not in a sandboxed child per instance) and remembered by this process's menu."""
    result = await asyncio.to_thread(_run, parent.env_dir, ["menu", "../task.json"], timeout_s, {"task.json": parent.task.model_dump_json()})
    if "error" in result:
        raise ToolSandboxError(f"{parent.env_dir}: {result['error']}")
    options = [Option(o["id"], o["category"], o["operation"], o["summary"], Mutation.model_validate(o["mutation"])) for o in result["options"]]
    remember(parent.env, parent, options)
    return options


def main(argv: list[str]) -> None:
    run_untrusted_here()
    channel = _Channel()
    command, directory = argv[0], argv[1]
    if command == "check":
        problems, tools, failing = tool_problems(directory)
        channel.send({"problems": problems, "tools": [t.model_dump(mode="json") for t in tools], "failing": failing})
        return
    if command == "seeds":
        try:
            seeds = task_seeds(directory, int(argv[2]), int(argv[3]))
        except SpecError as exc:
            channel.send({"error": str(exc)})
            return
        channel.send({"seeds": [s.model_dump(mode="json") for s in seeds]})
        return
    task = TaskSpec.model_validate_json(Path(directory, argv[2]).read_text())
    try:
        env = load_environment(directory)
    except SpecError as exc:
        channel.send({"error": str(exc)})
        return
    if command == "verify":
        channel.send(run_task_check(env, task).model_dump(mode="json"))
    elif command == "menu":
        options = menu(env, Parent(task.id, env, task, (), Path(directory)))
        channel.send({"options": [{"id": o.id, "category": o.category, "operation": o.operation, "summary": o.summary,
                                   "mutation": o.mutation.model_dump(mode="json")} for o in options]})


if __name__ == "__main__":
    main(sys.argv[1:])
