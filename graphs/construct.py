"""The `construct` graph: an environment and its validated tasks from a theme
(HERA §3.1, App. B.1–B.2).

`environment_builder` drafts the database and the spec loader checks it
(types, primary keys, references); `tool_coder` writes the tools module with
the calls each tool promises to accept and refuse, and `tool_validator` runs
them in the sandbox (each tool executes, results match the declared schema,
read-only tools keep the state, failed calls write nothing, valid and invalid
calls behave as declared). Both loops send the problems back and are bounded
by `max_attempts`. `task_proposer` writes tasks and their verification rules;
`fan_out_tasks` sends each that passes the pre-checks to `solver`, which
attempts it through the sandboxed public tools only; `verifier` replays each
attempt in the sandbox and keeps the task when the verifier accepts the
replay and rejects every perturbed outcome. `recorder` writes every decision
to `construction.json` in the output directory. Generated code never runs in
this process.
"""

from __future__ import annotations

import asyncio
import json
import operator
from pathlib import Path
from typing import Annotated, Literal

import yaml
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send
from typing_extensions import TypedDict

from envs.construct import describe_database, public_context, task_problems, task_spec, write_database, write_tools_module
from envs.runtime import EnvInstance
from envs.spec import SpecError, load_database, load_environment
from envs.untrusted import EnvironmentFault
from harness.tool_sandbox import ToolSandboxError, check_task, check_tools
from roles.environment_builder import environment_builder as build_database
from roles.solver import solver as solve
from roles.task_proposer import task_proposer as propose_tasks
from roles.tool_coder import tool_coder as code_tools
from state.construction import Decision, SolverAttempt, TaskDraft
from state.context import Context
from state.records import Observation, TaskSpec, ToolCall, ToolInfo, UsageRecord, merge

LOG = "construction.json"
MIN_REJECTED = 2  # perturbed outcomes a kept task's verifier must reject, as certification asks
PROPOSER_ROWS = 10  # rows per table the task proposer sees, to ground its tasks in


class ConstructInput(TypedDict):
    theme: str
    out: str
    tasks: int
    max_attempts: int
    max_turns: int


class ConstructOutput(TypedDict, total=False):
    status: Literal["built", "rejected"]
    env_id: str
    kept: list[str]
    decisions: list[Decision]
    usage: list[UsageRecord]


class ConstructState(ConstructInput, ConstructOutput, total=False):
    decisions: Annotated[list[Decision], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]
    attempt: int
    feedback: str
    previous: str
    tools: list[ToolInfo]
    drafts: list[TaskDraft]
    attempts: Annotated[dict[str, SolverAttempt], merge]


class SolverInput(TypedDict):
    """All a solver gets: where the public tools are, the instruction, its turn limit."""

    out: str
    task_id: str
    instruction: str
    max_turns: int


def _feedback(problems: list[str]) -> str:
    return "\n".join(f"- {p}" for p in problems)


async def environment_builder(state: ConstructState, runtime: Runtime[Context]) -> Command[Literal["environment_builder", "tool_coder", "recorder"]]:
    """Drafts the database and writes it to the output directory; on problems, drafts again within
    `max_attempts`; writes `decisions`, `env_id`, `attempt`, `feedback`."""
    ctx, out = runtime.context, Path(state["out"])
    attempt = state.get("attempt", 0) + 1
    draft, usage = await build_database(state["theme"], state.get("feedback", ""), ctx.builder_model, ctx.model_timeout_s)
    problems = await asyncio.to_thread(write_database, draft, out, state["theme"])
    rows = sum(len(t.rows) for t in draft.tables)
    decision = Decision(step="database", subject=draft.id, attempt=attempt, accepted=not problems,
                        reasons=tuple(problems) or (f"{len(draft.tables)} tables, {rows} rows; types, keys and references check",))
    update = {"decisions": [decision], "usage": [usage], "env_id": draft.id}
    if not problems:
        return Command(goto="tool_coder", update={**update, "attempt": 0, "feedback": ""})
    if attempt < state["max_attempts"]:
        return Command(goto="environment_builder", update={**update, "attempt": attempt, "feedback": _feedback(problems)})
    return Command(goto="recorder", update={**update, "status": "rejected"})


async def tool_coder(state: ConstructState, runtime: Runtime[Context]) -> dict:
    """Writes the tools module and its declared calls, given the database and the last problems; writes `previous`, `attempt`."""
    ctx, out = runtime.context, Path(state["out"])
    database = await asyncio.to_thread(describe_database, out)
    draft, usage = await code_tools(database, state.get("previous", ""), state.get("feedback", ""), ctx.builder_model, ctx.model_timeout_s)
    await asyncio.to_thread(write_tools_module, draft, out)
    return {"previous": draft.code, "attempt": state.get("attempt", 0) + 1, "usage": [usage]}


async def tool_validator(state: ConstructState) -> Command[Literal["tool_coder", "task_proposer", "recorder"]]:
    """Runs every declared call in the sandbox; accepts the tools, sends the problems back within
    `max_attempts`, or rejects the environment; writes `decisions`, `tools`, `feedback`, `status`."""
    problems, tools = await check_tools(state["out"])
    attempt = state["attempt"]
    decision = Decision(step="tools", subject=state["env_id"], attempt=attempt, accepted=not problems,
                        reasons=tuple(problems) or (f"{len(tools)} tools; every declared call behaves as declared",))
    if not problems:
        return Command(goto="task_proposer", update={"decisions": [decision], "tools": tools, "status": "built"})
    if attempt < state["max_attempts"]:
        return Command(goto="tool_coder", update={"decisions": [decision], "feedback": _feedback(problems)})
    return Command(goto="recorder", update={"decisions": [decision], "status": "rejected"})


async def task_proposer(state: ConstructState, runtime: Runtime[Context]) -> dict:
    """Proposes tasks with their verification rules and keeps those that pass the pre-checks; writes `drafts`, `decisions`."""
    ctx, out = runtime.context, Path(state["out"])
    database = await asyncio.to_thread(describe_database, out, PROPOSER_ROWS)
    proposed, usage = await propose_tasks(database, state["tools"], state["tasks"], ctx.task_model, ctx.model_timeout_s)
    _, tables, _ = await asyncio.to_thread(load_database, out)
    drafts, decisions, seen = [], [], set()
    for draft in proposed.tasks:
        problems = task_problems(draft, tables, state["tools"]) + ([f"task {draft.id}: a duplicate id"] if draft.id in seen else [])
        seen.add(draft.id)
        checks = len(draft.answer) + len(draft.state)
        decisions.append(Decision(step="task_proposal", subject=draft.id, accepted=not problems,
                                  reasons=tuple(problems) or (f"{checks} checks over existing tables, columns and tools",)))
        if not problems:
            drafts.append(draft)
    return {"drafts": drafts, "decisions": decisions, "usage": [usage]}


def fan_out_tasks(state: ConstructState) -> list[Send] | str:
    if not state["drafts"]:
        return "recorder"
    return [Send("solver", SolverInput(out=state["out"], task_id=d.id, instruction=d.instruction, max_turns=state["max_turns"]))
            for d in state["drafts"]]


async def solver(state: SolverInput, runtime: Runtime[Context]) -> dict:
    """Attempts one task through the sandboxed public tools, knowing only the instruction and the
    environment's public context; writes `attempts`, `usage`."""
    ctx = runtime.context
    context = await asyncio.to_thread(public_context, Path(state["out"]))
    try:  # generated tools: every instance is served from a sandboxed child (envs.untrusted)
        instance = await asyncio.to_thread(EnvInstance, await asyncio.to_thread(load_environment, state["out"]))
    except (SpecError, EnvironmentFault) as exc:
        attempt = SolverAttempt(task_id=state["task_id"], answer="", termination="tool_server_error", error=str(exc))
        return {"attempts": {state["task_id"]: attempt}, "usage": []}
    try:
        attempt = await solve(state["task_id"], state["instruction"], context, instance.public_tools,
                              lambda name, args: asyncio.to_thread(instance.call, name, args), ctx.solver_model,
                              state["max_turns"], ctx.model_timeout_s)
    finally:
        await asyncio.to_thread(instance.close)
    return {"attempts": {state["task_id"]: attempt}, "usage": list(attempt.usage)}


def _same(a: Observation, b: Observation) -> bool:
    return (a.tool, a.args, a.ok, a.output, a.error_code) == (b.tool, b.args, b.ok, b.output, b.error_code)


async def _verification(out: Path, task: TaskSpec, attempt: SolverAttempt) -> tuple[list[str], str]:
    """The problems that drop a task, and what was shown when there are none."""
    try:
        check = await check_task(out, task)
    except ToolSandboxError as exc:
        return [str(exc)], ""
    made = [o for o in attempt.observations if o.ok]
    problems = [f"the replay differs from the attempt at call {i + 1} ({b.tool}): {b.text[:200]} vs {a.text[:200]}"
                for i, (a, b) in enumerate(zip(made, check.observations)) if not _same(a, b)][:1]
    problems += [f"the verifier rejects the solver's outcome: {f}" for f in check.failures]
    problems += [f"the verifier accepts a perturbed outcome: {name}" for name in check.accepted_perturbations]
    if len(check.rejected_perturbations) < MIN_REJECTED:
        problems.append(f"only {len(check.rejected_perturbations)} perturbed outcome(s) to reject; add answer or state checks")
    shown = (f"replayed {len(check.observations)} calls; the verifier accepts the outcome and rejects "
             f"{len(check.rejected_perturbations)} perturbed ones: {'; '.join(check.rejected_perturbations)}")
    return problems, shown


async def verifier(state: ConstructState) -> dict:
    """Replays each solver attempt in the sandbox and keeps the task when its verifier accepts the replay and
    rejects every perturbed outcome; writes the kept tasks to `tasks/`; writes `kept`, `decisions`."""
    out = Path(state["out"])
    decisions, kept = [], []
    for draft in state["drafts"]:
        attempt = state["attempts"][draft.id]
        finished = attempt.termination == "final_answer"
        ran = f"{attempt.termination}: {len(attempt.observations)} calls" + (f"; {attempt.error}" if attempt.error else "")
        decisions.append(Decision(step="solver", subject=draft.id, accepted=finished, reasons=(f"{ran}; answer {attempt.answer[:300]!r}",)))
        if not finished:
            continue
        task = task_spec(draft, tuple(ToolCall(tool=o.tool, args=o.args) for o in attempt.observations if o.ok), attempt.answer)
        problems, shown = await _verification(out, task, attempt)
        decisions.append(Decision(step="verification", subject=draft.id, accepted=not problems, reasons=tuple(problems) or (shown,)))
        if not problems:
            kept.append(draft.id)
            await asyncio.to_thread(_write_task, out, task)
    return {"kept": kept, "decisions": decisions}


def _write_task(out: Path, task: TaskSpec) -> None:
    (out / "tasks").mkdir(exist_ok=True)
    text = yaml.safe_dump(task.model_dump(mode="json", exclude_defaults=True), sort_keys=False, allow_unicode=True)
    (out / "tasks" / f"{task.id}.yaml").write_text(text)


async def recorder(state: ConstructState) -> dict:
    """Writes every step's decision and every model call's usage to `construction.json`; writes `status`, `kept`."""
    status, kept = state.get("status", "rejected"), state.get("kept", [])
    log = {"theme": state["theme"], "environment": state.get("env_id", ""), "status": status, "kept": kept,
           "decisions": [d.model_dump(mode="json") for d in state.get("decisions", [])],
           "usage": [u.model_dump(mode="json") for u in state.get("usage", [])]}
    out = Path(state["out"])
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread((out / LOG).write_text, json.dumps(log, indent=1, ensure_ascii=False))
    return {"status": status, "kept": kept}


def build_construct() -> StateGraph:
    builder = StateGraph(ConstructState, context_schema=Context, input_schema=ConstructInput, output_schema=ConstructOutput)
    for node in (environment_builder, tool_coder, tool_validator, task_proposer, solver, verifier, recorder):
        builder.add_node(node)
    builder.add_edge(START, "environment_builder")
    builder.add_edge("tool_coder", "tool_validator")
    builder.add_conditional_edges("task_proposer", fan_out_tasks, ["solver", "recorder"])
    builder.add_edge("solver", "verifier")
    builder.add_edge("verifier", "recorder")
    builder.add_edge("recorder", END)
    return builder


builder = build_construct()
graph = builder.compile(name="construct")
