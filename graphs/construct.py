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
attempt in the sandbox and passes the task on when the verifier accepts the
replay and rejects every perturbed outcome; `task_reviewer` keeps the tasks
a reviewer finds realistic and well posed (HERA App. B.2). Then each kept
task becomes a parent: `pair_planner` computes its mutation menu and picks a
category the menu offers (different ones across tasks), `fan_out_mutations`
sends each to environment evolution's `proposal` subgraph (menu choice,
semantic and rescue review, refinement, certification), and `pair_recorder`
writes the certified twins to `pairs/`, which makes the directory a catalog
environment. `recorder` writes every decision to `construction.json` in the
output directory. Generated code never runs in this process.
"""

from __future__ import annotations

import asyncio
import json
import operator
import re
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Literal

import yaml
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Send
from typing_extensions import NotRequired, TypedDict

from envs.catalog import load_parent
from envs.construct import (add_implied_references, add_missing_keys, allow_missing, coerce_rows, database_problems, describe_database, drop_loose_references, example_write_tool,
                            public_context, read_tools_module, request_problems, seed_task_id, starting_module, task_problems, task_spec, tidy_task, tool_functions,
                            with_details, without_tools, write_database, write_tools_module)
from envs.grow import grow, naming_columns, referenced_first
from envs.spec import SpecError, load_database, load_environment
from graphs.env_evolution import ProposalInput, menu_of, proposal_graph
from graphs.inputs import AtLeastOne, AtLeastZero, Name, checked
from graphs import runner
from graphs.episode import run_task
from harness.tool_sandbox import ToolSandboxError, check_task, check_tools, sandboxed_seeds
from roles.models import KINDS, InfrastructureError
from roles.environment_builder import build_database, more_names, more_rows
from roles.task_proposer import describe_tools, propose_tasks
from roles.task_reviewer import review_request, review_task
from roles.task_writer import write_request
from roles.tool_coder import code_tools, declare_tools
from state.construction import DatabaseDraft, Decision, SolverAttempt, TaskDraft, ToolsDraft
from state.context import Context
from state.paths import RunPaths
from state.evolution import ProposalOutcome, ProposalTarget
from state.records import Mutation, Observation, PairSpec, TaskSpec, ToolCall, ToolInfo, UsageRecord, merge

LOG = "construction.json"
MIN_REJECTED = 2  # perturbed outcomes a kept task's verifier must reject, as certification asks
PROPOSER_ROWS = 10  # rows per table the task proposer sees, to ground its tasks in
MIN_EXAMPLES, MAX_EXAMPLES = 5, 8  # rows a table is grown from: a table drafted with fewer gets more, up to the most
MAX_NAMES = 80  # new names (titles, products) asked of the builder per naming column, in rounds of 20


class ConstructInput(TypedDict):
    theme: Name
    out: Name
    tasks: AtLeastOne
    max_attempts: AtLeastOne
    max_turns: AtLeastOne
    rows: NotRequired[AtLeastZero]  # grow each templated table to this many rows (0: the rows as written)
    solver_tries: NotRequired[AtLeastOne]  # solver attempts per task until the verifier accepts one (default 1)
    pairs: NotRequired[AtLeastZero]  # certified twins to seek per kept task (0: stop at tasks)
    max_refinements: NotRequired[AtLeastZero]


class ConstructOutput(TypedDict, total=False):
    status: Literal["built", "rejected"]
    env_id: str
    kept: list[str]
    pairs_written: list[str]
    decisions: list[Decision]
    usage: list[UsageRecord]


class ConstructState(ConstructInput, ConstructOutput, total=False):
    decisions: Annotated[list[Decision], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]
    attempt: int
    feedback: str
    previous: str
    templated: bool  # the tools module holds the example write tool, not the coder's
    tools: list[ToolInfo]
    drafts: list[TaskDraft]
    task_attempt: int
    task_feedback: str
    attempts: Annotated[dict[str, SolverAttempt], merge]
    verdicts: Annotated[dict[str, tuple[tuple[str, ...], str]], merge]  # task id: the verifier's problems, what it checked
    verified: list[TaskSpec]
    targets: list[ProposalTarget]
    outcomes: Annotated[dict[str, ProposalOutcome], merge]


class SolverInput(TypedDict):
    """One proposed task to solve: the harness and its model get only its instruction (and the public tools and
    context of the environment at `out`); its rules stay in the node, which checks each attempt with them."""

    out: str
    draft: TaskDraft
    round: int
    max_turns: int
    tries: int


def _feedback(problems: list[str]) -> str:
    return "\n".join(f"- {p}" for p in problems)


async def environment_builder(state: ConstructState, runtime: Runtime[Context]) -> Command[Literal["environment_builder", "tool_coder", "recorder"]]:
    """Drafts the database (an id made kebab-case, a primary key left out of the columns added, references naming no
    column dropped, references a column's name and values imply added, values of another type with one reading
    converted, a column some rows leave empty made nullable), gives short tables more rows and naming
    columns new names from the builder, grows the tables to `rows`, and writes it to the output directory; on
    problems, drafts again within `max_attempts`. Rejects input its schema does not allow. Writes the input as typed,
    `decisions`, `env_id`, `attempt`, `feedback`."""
    given = checked(ConstructInput, state, "construct")
    state = {**state, **given}
    ctx, out = runtime.context, Path(state["out"])
    attempt = state.get("attempt", 0) + 1
    draft, usage = await build_database(state["theme"], state.get("feedback", ""), ctx.builder_model, ctx.model_timeout_s)
    draft = draft.model_copy(update={"id": re.sub(r"[^a-z0-9]+", "-", draft.id.casefold()).strip("-")})  # "Library_Env": library-env
    draft, notes = add_missing_keys(draft)
    draft, dropped = drop_loose_references(draft)
    notes += dropped
    draft, converted = coerce_rows(draft)
    notes += converted
    draft, nullable = allow_missing(draft)
    notes += nullable
    draft, implied = add_implied_references(draft)
    notes += implied
    usage, grown, written = [usage], [], 0
    if state.get("rows") and not database_problems(draft):
        draft, more = await _top_up(draft, state["theme"], ctx)
        usage += more
        written, vocabulary = sum(len(t.rows) for t in draft.tables), {}
        by_name = {t.name: t for t in draft.tables}
        for table, column in naming_columns(draft.tables):
            names, used = await more_names(state["theme"], by_name[table], column, MAX_NAMES, ctx.builder_model, ctx.model_timeout_s)
            vocabulary[table, column], usage = names, usage + used
        tables, grown = await asyncio.to_thread(grow, draft.tables, state["rows"], zlib.crc32(draft.id.encode()), vocabulary)
        draft = draft.model_copy(update={"tables": tables})
    problems = await asyncio.to_thread(write_database, draft, out, state["theme"])
    rows = sum(len(t.rows) for t in draft.tables)
    shown = f"{len(draft.tables)} tables, {rows} rows" + (f" ({written} written; {'; '.join(grown)})" if grown else "")
    decision = Decision(step="database", subject=draft.id, attempt=attempt, accepted=not problems,
                        reasons=tuple(problems) or (f"{shown}; types, keys and references check", *notes))
    update = {**given, "decisions": [decision], "usage": usage, "env_id": draft.id}
    if not problems:
        return Command(goto="tool_coder", update={**update, "attempt": 0, "feedback": ""})
    if attempt < state["max_attempts"]:
        return Command(goto="environment_builder", update={**update, "attempt": attempt, "feedback": _feedback(problems)})
    return Command(goto="recorder", update={**update, "status": "rejected"})


async def _top_up(draft: DatabaseDraft, theme: str, ctx: Context) -> tuple[DatabaseDraft, list[UsageRecord]]:
    """The draft with each table written with some but fewer than MIN_EXAMPLES rows given more by the builder (referenced
    tables first, so references can name their new keys); a row whose key is missing or taken is dropped."""
    tables, usage = {t.name: t for t in draft.tables}, []
    for table in referenced_first(draft.tables):
        table = tables[table.name]
        if not 0 < len(table.rows) < MIN_EXAMPLES:
            continue
        keys = {name: [r.get(t.primary_key) for r in t.rows] for name, t in tables.items()}
        rows, used = await more_rows(theme, table, keys, MAX_EXAMPLES - len(table.rows), ctx.builder_model, ctx.model_timeout_s)
        taken, kept = set(map(str, keys[table.name])), []
        for row in rows:
            if row.get(table.primary_key) is not None and str(row[table.primary_key]) not in taken:
                taken.add(str(row[table.primary_key]))
                kept.append(row)
        tables[table.name] = table.model_copy(update={"rows": [*table.rows, *kept]})
        usage.append(used)
    return draft.model_copy(update={"tables": [tables[t.name] for t in draft.tables]}), usage


def _same_code(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


async def tool_coder(state: ConstructState, runtime: Runtime[Context]) -> dict:
    """Writes the tools module, the starting module with the tools the coder adds (given the database and the last
    problems), and the declared calls of the tools it added (the starting module's own come with it); a reply that
    repeats the functions that failed is asked for again without them and hotter, not retried as it was; on the last
    of several attempts the example write tool is taken instead, with its own declaration; writes `previous`,
    `attempt`, `templated`."""
    ctx, out = runtime.context, Path(state["out"])
    database = await asyncio.to_thread(describe_database, out)
    starting, declared = await asyncio.to_thread(starting_module, out)
    example, example_declared = await asyncio.to_thread(example_write_tool, out)
    tables = [t.name for t in (await asyncio.to_thread(load_database, out))[1]]
    previous, feedback = state.get("previous", ""), state.get("feedback", "")
    attempt = state.get("attempt", 0) + 1
    if attempt == state["max_attempts"] and attempt > 1:  # the coder's own failed every time: the example tool, as declared
        draft = ToolsDraft(code=f"{starting.rstrip()}\n\n\n{example}\n", tools=[*declared, example_declared])
        await asyncio.to_thread(write_tools_module, draft, out)
        return {"previous": example, "attempt": attempt, "usage": [], "templated": True}
    added, usage = await code_tools(database, starting, example, previous, feedback, ctx.builder_model, ctx.model_timeout_s)
    usages = [usage]
    if previous and _same_code(added, previous):
        feedback += "\n- your last reply repeated the functions that failed, unchanged; write them again, differently"
        added, usage = await code_tools(database, starting, example, "", feedback, ctx.builder_model, ctx.model_timeout_s, temperature=1.0)
        usages.append(usage)
    draft, more = await _declared(database, f"{starting.rstrip()}\n\n\n{added}", starting, declared, tables, ctx)
    await asyncio.to_thread(write_tools_module, draft, out)
    return {"previous": added, "attempt": attempt, "usage": usages + more, "templated": False}


async def _declared(database: str, code: str, starting: str, declared: list, tables: list[str], ctx: Context) -> tuple[ToolsDraft, list[UsageRecord]]:
    """The module with its declarations: the starting module's own for its unchanged tools, the coder's for the rest."""
    functions, template = tool_functions(code), tool_functions(starting)
    kept = [d for d in declared if functions.get(d.name) == template.get(d.name)]
    new = [name for name in functions if name not in {d.name for d in kept}]
    if not new:
        return ToolsDraft(code=code, tools=kept), []
    more, usage = await declare_tools(database, code, new, tables, ctx.builder_model, ctx.model_timeout_s)
    return ToolsDraft(code=code, tools=kept + more), [usage]


def _tools_problems(problems: list[str], tools: list[ToolInfo]) -> list[str]:
    if tools and all(t.read_only for t in tools):  # the coder was asked for the tools that change state; none came
        return [*problems, "no tool changes state: add the @write_tool functions this environment needs"]
    return problems


async def _without_failing(out: Path, failing: list[str]) -> tuple[list[ToolInfo], str] | None:
    """The module kept without the tools that failed their declared calls (and with the example write tool when no
    write tool is left), when that passes every check: its tools and what was done; else the module is put back."""
    draft = await asyncio.to_thread(read_tools_module, out)
    kept, done = without_tools(draft, set(failing)), f"dropped {', '.join(failing)}, which failed their declared calls"
    if all(d.read_only for d in kept.tools):
        example, declared = await asyncio.to_thread(example_write_tool, out)
        if declared.name in tool_functions(kept.code):
            return None
        kept = ToolsDraft(code=f"{kept.code.rstrip()}\n\n\n{example}\n", tools=[*kept.tools, declared])
        done += "; took the example write tool written for this database"
    await asyncio.to_thread(write_tools_module, kept, out)
    problems, tools, _ = await check_tools(out)
    if _tools_problems(problems, tools):
        await asyncio.to_thread(write_tools_module, draft, out)
        return None
    return tools, done


async def tool_validator(state: ConstructState) -> Command[Literal["tool_coder", "task_proposer", "recorder"]]:
    """Runs every declared call in the sandbox; accepts the tools, or the module without the tools that failed when
    the rest passes (a retry of the whole module costs a small coder minutes and seldom mends it), sends the problems
    back within `max_attempts`, or rejects the environment; writes `decisions`, `tools`, `feedback`, `status`."""
    out = Path(state["out"])
    problems, tools, failing = await check_tools(out)
    problems = _tools_problems(problems, tools)
    attempt = state["attempt"]
    shown = f"{len(tools)} tools" + (" (the coder's own write tools failed; the example one written for this database)" if state.get("templated") else "")
    if problems and failing and (kept := await _without_failing(out, failing)):
        tools, done = kept
        shown = f"{len(tools)} tools ({done}: {'; '.join(problems)[:1500]})"
        problems = []
    decision = Decision(step="tools", subject=state["env_id"], attempt=attempt, accepted=not problems,
                        reasons=tuple(problems) or (f"{shown}; every declared call behaves as declared",))
    if not problems:
        return Command(goto="task_proposer", update={"decisions": [decision], "tools": tools, "status": "built"})
    if attempt < state["max_attempts"]:
        return Command(goto="tool_coder", update={"decisions": [decision], "feedback": _feedback(problems)})
    return Command(goto="recorder", update={"decisions": [decision], "status": "rejected"})


async def task_proposer(state: ConstructState, runtime: Runtime[Context]) -> dict:
    """Proposes tasks (again, with every problem found, while none is kept) and keeps those that pass the pre-checks,
    ids made kebab-case and checks the instruction states dropped. With `task_proposals` "menu" each task is a change the
    write tools make on the initial state (`envs.seeds`, drawn anew each round) whose request the task writer words
    (asked again once with what it lacked); with "free" the task proposer writes tasks and their rules. Writes
    `drafts`, `decisions`, `usage`, `task_attempt`, `task_feedback`."""
    ctx, out = runtime.context, Path(state["out"])
    attempt = state.get("task_attempt", 0) + 1
    if ctx.task_proposals == "menu":
        proposed, usage, decisions = await _seeded(state, ctx, out, attempt)
    else:
        database = await asyncio.to_thread(describe_database, out, PROPOSER_ROWS)
        drafted, used = await propose_tasks(database, state["tools"], state["tasks"], state.get("task_feedback", ""), ctx.task_model,
                                            ctx.model_timeout_s)
        proposed, usage, decisions = [(d, []) for d in drafted.tasks], [used], []
    _, tables, rows = await asyncio.to_thread(load_database, out)
    drafts, seen, problems_all = [], set(), [p for d in decisions for p in d.reasons if not p.startswith("request ")]
    for draft, added in proposed:
        draft, notes = tidy_task(draft)
        notes = added + notes
        problems = task_problems(draft, tables, rows, state["tools"]) + ([f"task {draft.id}: a duplicate id"] if draft.id in seen else [])
        seen.add(draft.id)
        checks = len(draft.answer) + len(draft.state)
        decisions.append(Decision(step="task_proposal", subject=draft.id, attempt=attempt, accepted=not problems,
                                  reasons=tuple(problems) or (f"{checks} checks over existing tables, columns and tools; request "
                                                              f"{draft.instruction!r}", *notes)))
        problems_all += problems
        if not problems:
            drafts.append(draft)
    return {"drafts": drafts, "decisions": decisions, "usage": usage, "task_attempt": attempt, "task_feedback": _feedback(problems_all)}


async def _seeded(state: ConstructState, ctx: Context, out: Path,
                  attempt: int) -> tuple[list[tuple[TaskDraft, list[str]]], list[UsageRecord], list[Decision]]:
    """Drafts whose rules come from the seeds and whose requests the task writer words, each with what was added to
    its request; a rejected decision for each request that still names a record wrongly or gives an answer away
    after a second try."""
    try:
        seeds = await sandboxed_seeds(out, state["tasks"], zlib.crc32(state["env_id"].encode()) + attempt)
    except ToolSandboxError as exc:
        return [], [], [Decision(step="task_proposal", subject=state["env_id"], attempt=attempt, accepted=False, reasons=(str(exc),))]
    if not seeds:
        return [], [], [Decision(step="task_proposal", subject=state["env_id"], attempt=attempt, accepted=False,
                                 reasons=("no call of a write tool changed the initial state; nothing to ask for",))]
    context = await asyncio.to_thread(public_context, out)
    drafts, usage, decisions = [], [], []
    for seed in seeds:
        feedback, notes = "", []
        for _ in range(2):
            request, used = await write_request(context, seed, feedback, ctx.task_model, ctx.model_timeout_s)
            usage.append(used)
            instruction = request.instruction
            problems = request_problems(instruction, seed)
            if not problems:
                break
            feedback = _feedback(problems)
        if problems:  # the values the call takes, where the writer still left them out, are said in a sentence each
            instruction, notes = with_details(instruction, seed)
            problems = request_problems(instruction, seed)
        draft = TaskDraft(id=seed_task_id(seed), instruction=instruction, answer=list(seed.answer), state=list(seed.state),
                          allowed_writes=list(seed.tables))
        if problems:
            decisions.append(Decision(step="task_proposal", subject=draft.id, attempt=attempt, accepted=False,
                                      reasons=(*(f"task {draft.id}: {p}" for p in problems), f"request {instruction!r}")))
        else:
            drafts.append((draft, [f"added to the request: {' '.join(notes)}"] if notes else []))
    return drafts, usage, decisions


def fan_out_tasks(state: ConstructState) -> list[Send] | str:
    if not state["drafts"]:
        return "task_proposer" if state["task_attempt"] < state["max_attempts"] else "recorder"
    return [Send("solver", SolverInput(out=state["out"], draft=d, round=state["task_attempt"], max_turns=state["max_turns"],
                                       tries=state.get("solver_tries", 1))) for d in state["drafts"]]


async def solver(state: SolverInput, runtime: Runtime[Context]) -> dict:
    """Attempts one task with the solver harness (`solver_harness`, driven by `solver_model`) through the sandboxed
    public tools, knowing only the instruction and the environment's public context, up to `tries` times until the
    verifier accepts the outcome (a failed attempt is the solver's; rules the verifier finds wanting are not retried);
    writes `attempts`, `verdicts`, `usage`."""
    ctx, out, draft = runtime.context, Path(state["out"]), state["draft"]
    public = await asyncio.to_thread(public_context, out)
    try:
        env = await asyncio.to_thread(load_environment, out)
    except SpecError as exc:
        attempt = SolverAttempt(task_id=draft.id, answer="", termination="environment_error", error=str(exc))
        return {"attempts": {draft.id: attempt}, "verdicts": {draft.id: ((f"the environment does not load: {exc}",), "")}, "usage": []}
    run = replace(ctx, agent_model=ctx.solver_model, max_turns=state["max_turns"])
    usage: list[UsageRecord] = []
    for n in range(1, state["tries"] + 1):
        result = await run_task(ctx.solver_harness, draft.instruction, public, env, run, f"solver:{draft.id}:{state['round']}:{n}")
        if result["termination"] == "infrastructure_error":  # the endpoint's failure, never the solver's: the run stops, to resume
            kind, _, detail = result.get("error", "").partition(": ")
            raise InfrastructureError(kind if kind in KINDS else "server_error", detail)
        usage += [u.model_copy(update={"role": "solver"}) for u in result.get("usage", [])]
        attempt = SolverAttempt(task_id=draft.id, answer=result.get("answer", ""), observations=tuple(result.get("observations", [])),
                                termination=result["termination"], error=result.get("error", ""), tries=n)
        if attempt.termination != "final_answer":
            verdict = ((f"a solver given only the instruction and the tools did not finish it ({_ran(attempt)[:200]})",), "")
            continue
        task = task_spec(draft, tuple(ToolCall(tool=o.tool, args=o.args) for o in attempt.observations if o.ok), attempt.answer)
        problems, shown = await _verification(out, task, attempt)
        verdict = (tuple(problems), shown)
        if not problems or any(not p.startswith(SOLVER_FAULTS) for p in problems):
            break
    return {"attempts": {draft.id: attempt}, "verdicts": {draft.id: verdict}, "usage": usage}


def _ran(attempt: SolverAttempt) -> str:
    return f"{attempt.termination}: {len(attempt.observations)} calls" + (f"; {attempt.error}" if attempt.error else "")


def _same(a: Observation, b: Observation) -> bool:
    return (a.tool, a.args, a.ok, a.output, a.error_code) == (b.tool, b.args, b.ok, b.output, b.error_code)


SOLVER_FAULTS = ("the replay differs", "the verifier rejects the solver's outcome")  # another attempt may do better


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
    """Passes a task on when the verifier accepted the replay of a solver attempt and rejected every perturbed
    outcome; the problems of the others go into the task proposer's feedback; writes `verified`, `decisions`,
    `task_feedback`."""
    round_ = state["task_attempt"]
    decisions, verified, problems_all = [], [], []
    for draft in state["drafts"]:
        attempt, (problems, shown) = state["attempts"][draft.id], state["verdicts"][draft.id]
        finished = attempt.termination == "final_answer"
        tries = f" (try {attempt.tries})" if attempt.tries > 1 else ""
        decisions.append(Decision(step="solver", subject=draft.id, attempt=round_, accepted=finished,
                                  reasons=(f"{_ran(attempt)}{tries}; answer {attempt.answer[:300]!r}",)))
        problems_all += [f"task {draft.id}: {p}" for p in problems]
        if not finished:
            continue
        decisions.append(Decision(step="verification", subject=draft.id, attempt=round_, accepted=not problems,
                                  reasons=tuple(problems) or (shown,)))
        if not problems:
            verified.append(task_spec(draft, tuple(ToolCall(tool=o.tool, args=o.args) for o in attempt.observations if o.ok), attempt.answer))
    return {"verified": verified, "decisions": decisions, "task_feedback": _more(state.get("task_feedback", ""), problems_all)}


def _more(feedback: str, problems: list[str]) -> str:
    return "\n".join(filter(None, (feedback, _feedback(problems))))


def _solution(task: TaskSpec, attempt: SolverAttempt) -> str:
    """A verified task as its reviewer reads it: the request, the solver's calls with what they returned, the answer, the checks."""
    calls = [f"{i + 1}. {o.tool}({json.dumps(o.args, ensure_ascii=False)}) returned {o.text[:300]}"
             for i, o in enumerate(o for o in attempt.observations if o.ok)]
    checks = [f"the answer states {c.name} = {c.value if c.value is not None else ' or '.join(map(str, c.any_of))}" for c in task.answer]
    checks += [f"{c.table} {'lacks' if c.absent else 'holds'} a row with " + ", ".join(f"{k}={v}" for k, v in c.match.items()) for c in task.state]
    return "\n".join([f"Request: {task.instruction}", "Solution:", *calls, f"Answer: {task.reference.answer}", "Checks: " + "; ".join(checks)])


async def task_reviewer(state: ConstructState, runtime: Runtime[Context]) -> dict:
    """Reviews each verified task for what the checks cannot see and keeps the accepted ones in `tasks/`: a realistic,
    well-posed request that the solution answers (a free task); a request read as asking for the change and the values
    its checks hold (a task from a seed); writes `kept`, `decisions`, `usage`."""
    ctx, out = runtime.context, Path(state["out"])
    context = await asyncio.to_thread(public_context, out)
    _, tables, _ = await asyncio.to_thread(load_database, out)
    decisions, kept, usage, rejected = [], [], [], []
    for task in state.get("verified", []):
        if ctx.task_proposals == "menu":
            writes = {t.name: t.description.strip().splitlines()[0] for t in state["tools"] if not t.read_only}
            columns = [c.name for t in tables if t.name in (task.allowed_writes or ()) for c in t.columns]
            told = [c.name for c in task.answer]
            review, used = await review_request(context, task.instruction, writes, {c.tool for c in task.reference.calls if c.tool in writes},
                                                list(dict.fromkeys([*told, *columns])), set(told), ctx.reviewer_model, ctx.model_timeout_s)
        else:
            review, used = await review_task(context, describe_tools(state["tools"]), _solution(task, state["attempts"][task.id]),
                                             ctx.reviewer_model, ctx.model_timeout_s)
        decisions.append(Decision(step="task_review", subject=task.id, attempt=state["task_attempt"], accepted=review.accept,
                                  reasons=(review.reasons,)))
        usage.append(used)
        if review.accept:
            kept.append(task.id)
            await asyncio.to_thread(_write, out / "tasks", task)
        else:
            rejected.append(f"task {task.id}: a reviewer rejected it: {review.reasons[:300]}")
    return {"kept": kept, "decisions": decisions, "usage": usage, "task_feedback": _more(state.get("task_feedback", ""), rejected)}


def after_review(state: ConstructState) -> str:
    """Tasks are proposed again, with every problem found, while none was kept and attempts remain."""
    return "task_proposer" if not state.get("kept") and state["task_attempt"] < state["max_attempts"] else "pair_planner"


def _write(folder: Path, record: TaskSpec | PairSpec) -> None:
    """A task (into `tasks/`) or a pair (into `pairs/`) as the catalog's YAML."""
    folder.mkdir(exist_ok=True)
    text = yaml.safe_dump(record.model_dump(mode="json", exclude_defaults=True), sort_keys=False, allow_unicode=True)
    (folder / f"{record.id}.yaml").write_text(text)


async def pair_planner(state: ConstructState) -> dict:
    """Makes each kept task a parent: computes its mutation menu and picks `pairs` categories it offers, rotating
    so tasks differ; writes `targets`, `decisions`."""
    out, wanted = Path(state["out"]), state.get("pairs", 0)
    targets, decisions = [], []
    for i, task_id in enumerate(state.get("kept", []) if wanted else []):
        parent = await asyncio.to_thread(load_parent, task_id, out)
        offered = list(dict.fromkeys(o.category for o in await menu_of(parent)))
        decisions.append(Decision(step="mutation_menu", subject=task_id, accepted=bool(offered),
                                  reasons=(f"options in {', '.join(offered)}" if offered else "no derived mutation certifies",)))
        chosen = [offered[(i + k) % len(offered)] for k in range(min(wanted, len(offered)))] if offered else []
        targets += [ProposalTarget(id=f"{task_id}--{category.replace('_', '-')}", parent=task_id, category=category, source=str(out))
                    for category in chosen]
    return {"targets": targets, "decisions": decisions}


def fan_out_mutations(state: ConstructState) -> list[Send] | str:
    if not state.get("targets"):
        return "pair_recorder"
    return [Send("proposal", ProposalInput(target=t, weakness="", max_refinements=state.get("max_refinements", 1))) for t in state["targets"]]


async def pair_recorder(state: ConstructState) -> dict:
    """Writes each certified twin to `pairs/` (a training pair of this environment); writes `pairs_written`, `decisions`."""
    out, written, decisions = Path(state["out"]), [], []
    for target in state.get("targets", []):
        outcome = state.get("outcomes", {}).get(target.id)
        if outcome is None:
            continue
        decisions.append(Decision(step="pair", subject=outcome.pair_id, attempt=max(outcome.rounds, 1), accepted=outcome.status == "certified",
                                  reasons=(outcome.reason,)))
        if outcome.status == "certified":
            parent = await asyncio.to_thread(load_parent, target.parent, out)
            pair = parent.twin(outcome.pair_id, Mutation.model_validate(outcome.mutation))
            await asyncio.to_thread(_write, out / "pairs", pair)
            written.append(pair.id)
    return {"pairs_written": written, "decisions": decisions}


async def recorder(state: ConstructState) -> dict:
    """Writes every step's decision and every model call's usage to `construction.json`; writes `status`, `kept`, `pairs_written`."""
    status, kept, pairs = state.get("status", "rejected"), state.get("kept", []), state.get("pairs_written", [])
    log = {"theme": state["theme"], "environment": state.get("env_id", ""), "status": status, "kept": kept, "pairs": pairs,
           "decisions": [d.model_dump(mode="json") for d in state.get("decisions", [])],
           "usage": [u.model_dump(mode="json") for u in state.get("usage", [])]}
    out = Path(state["out"])
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread((out / LOG).write_text, json.dumps(log, indent=1, ensure_ascii=False))
    return {"status": status, "kept": kept, "pairs_written": pairs}


def build_construct() -> StateGraph:
    builder = StateGraph(ConstructState, context_schema=Context, input_schema=ConstructInput, output_schema=ConstructOutput)
    for node in (environment_builder, tool_coder, tool_validator, task_proposer, solver, verifier, task_reviewer, pair_planner,
                 pair_recorder, recorder):
        builder.add_node(node)
    builder.add_node("proposal", proposal_graph)
    builder.add_edge(START, "environment_builder")
    builder.add_edge("tool_coder", "tool_validator")
    builder.add_conditional_edges("task_proposer", fan_out_tasks, ["solver", "task_proposer", "recorder"])
    builder.add_edge("solver", "verifier")
    builder.add_edge("verifier", "task_reviewer")
    builder.add_conditional_edges("task_reviewer", after_review, ["task_proposer", "pair_planner"])
    builder.add_conditional_edges("pair_planner", fan_out_mutations, ["proposal", "pair_recorder"])
    builder.add_edge("proposal", "pair_recorder")
    builder.add_edge("pair_recorder", "recorder")
    builder.add_edge("recorder", END)
    return builder


builder = build_construct()
graph = builder.compile(name="construct")


async def run_construct(
    theme: str,
    out: str,
    context: Context,
    *,
    tasks: int = 3,
    max_attempts: int = 3,
    max_turns: int = 12,
    solver_tries: int = 3,
    rows: int = 200,
    pairs: int = 1,
    max_refinements: int = 1,
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Builds (or resumes building) an environment from a theme into the directory `out`: its database grown to
    `rows` per templated table, validated tools and reviewed tasks (each solved in up to `solver_tries` attempts), and up
    to `pairs` certified twins per kept task;
    the run id and its final state (status, env_id, kept, pairs_written, decisions, usage)."""
    run_id = run_id or runner.new_run_id()
    payload = {"theme": theme, "out": out, "tasks": tasks, "max_attempts": max_attempts, "max_turns": max_turns,
               "solver_tries": solver_tries, "rows": rows, "pairs": pairs, "max_refinements": max_refinements}
    return run_id, await runner.run_checkpointed(builder, "construct", run_id, payload, context, 30 + 4 * max_attempts, on_event,
                                                RunPaths.here().evolution)
