"""Bundle checks: load a bundle and drive every hook once on a synthetic
episode, in a sandboxed subprocess (`envs.sandbox`; `isolation()` says how
contained it is), so a broken hook is rejected before any episode runs. The
child gets a copy of the bundle, as private directories may hold the original.

    python -m harness.check BUNDLE_DIR      (prints a JSON list of problems)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from langchain_core.messages import BaseMessage, HumanMessage
from pydantic import BaseModel

from envs.spec import SpecError
from harness.abi import Decision, EpisodeView, Final, ToolRequest, call_hook
from harness.bundle import load_bundle, resolve_bundle
from envs.sandbox import run_sandboxed, stage, workspace
from state.records import Observation, ToolInfo

_TOOL = ToolInfo(name="lookup", description="Looks a record up.", input_schema={"type": "object", "properties": {"id": {"type": "string"}}}, read_only=True)


def placeholder(schema: type[BaseModel]) -> BaseModel:
    """A valid instance of `schema` with plain default values, the answer `view.ask` gives in a check.
    Built from its JSON schema, so that it also answers the stand-in class a sandboxed hook's question
    arrives as (`harness.remote.answer_schema`), which has no fields of its own."""
    js = schema.model_json_schema()
    return schema.model_validate(_example(js, js.get("$defs", {})))


def _example(node: dict, defs: dict):
    if "$ref" in node:
        return _example(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in node:
        return node["const"]
    if node.get("enum"):
        return node["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if node.get(key):
            return _example(node[key][0], defs)
    kind = node.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        return {k: _example(v, defs) for k, v in node.get("properties", {}).items() if k in node.get("required", ())}
    return {"boolean": False, "integer": 0, "number": 0.0, "string": "", "array": [], "null": None}.get(kind)


async def _ask(messages: list[BaseMessage], schema: type[BaseModel]) -> BaseModel:
    return placeholder(schema)


async def _lookup(tool: str, args: dict) -> Observation:
    if tool != _TOOL.name:
        raise ValueError(f"view.lookup: {tool!r} is not a read-only tool of this environment")
    return Observation(tool=tool, args=args, ok=True, output={"id": "R-1"}, source="harness")



async def drive(bundle_dir: str) -> list[str]:
    """Run each hook once and check what it returns; the problems found."""
    try:
        bundle = load_bundle(bundle_dir)
        harness = bundle.harness()
    except SpecError as exc:
        return [str(exc)]
    view = EpisodeView(instruction="Look up record R-1.", context="A test environment.", tools=[_TOOL],
                       config=bundle.config, prompts=bundle.prompts, skills=bundle.skills, ask=_ask, lookup=_lookup)
    call = ToolRequest(id="call_1", name="lookup", args={"id": "R-1"})
    obs = Observation(tool="lookup", args={"id": "R-1"}, ok=True, output={"id": "R-1"})
    checks = [
        ("initialize", (view,), type(None)),
        ("compose_instructions", (view,), str),
        ("prepare_turn", (view, [HumanMessage("Look up record R-1.")]), list),
        ("before_tool_call", (view, call), Decision),
        ("present_result", (view, call, obs), str),
        ("after_tool_result", (view, call, obs), (str, type(None))),
        ("finalize", (view, "Record R-1 exists."), Final),
    ]
    problems = []
    me = os.getpid()
    for hook, args, expected in checks:
        where = f"{bundle.path / 'hooks.py'}: Harness.{hook}"
        failure = None
        try:
            result = await call_hook(getattr(harness, hook), *args)
        except Exception as exc:  # the hook's own failure is what this check reports
            failure = f"{where}: raised {type(exc).__name__}: {exc}"
        if os.getpid() != me:  # a copy forked by the hook must not go on
            os._exit(0)
        if failure:
            problems.append(failure)
            continue
        if not isinstance(result, expected):
            problems.append(f"{where}: returned {type(result).__name__}, expected {getattr(expected, '__name__', expected)}")
        elif hook == "prepare_turn" and not all(isinstance(m, BaseMessage) for m in result):
            problems.append(f"{where}: returned a list that is not all messages")
    return problems


def check_bundle(name: str | Path, timeout_s: float = 60) -> list[str]:
    """Problems with a bundle, found by driving its hooks in the sandbox."""
    path = resolve_bundle(name).resolve()
    with workspace("check") as tmp:
        copy = stage(path, tmp)
        try:
            done = run_sandboxed(["-m", "harness.check", str(copy)], timeout_s=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return [f"{path}: hooks did not finish within {timeout_s:.0f}s"]
    try:
        problems = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        problems = [f"{path}: the bundle check crashed (exit {done.returncode}): {done.stderr.strip()[-500:]}"]
    return [str(p).replace(str(copy), str(path)) for p in problems]


if __name__ == "__main__":
    print(json.dumps(asyncio.run(drive(sys.argv[1]))))
