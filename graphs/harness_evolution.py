"""The `harness_evolution` graph: one block of ECDYSIS Algorithm 1 / HERA's harness update.

`baseline` evaluates the starting bundle on the training pool and the
validation pairs; then, n times: `failure_analyst` diagnoses the latest
harness's training failures; `fdcr` reviews them into a modification spec
(skipped in serial mode); `harness_optimizer` edits a staging copy
(aggregated: one edit from the spec; serial: one edit per failure, in
sequence); `bundle_checks` runs the sandboxed interface check, a smoke
episode and the leakage lint; `candidate_evaluation` scores a candidate that
passed, which becomes the parent of the next. `selector` adopts the best
candidate that satisfies the selection rule against the starting bundle
(guarded and gated: `graphs.selection`).
Every candidate is a lineage entry in the ledger, adopted or not, with why.
Evaluations are the `evaluate` graph with the rollout cache, so a resumed
block re-runs no finished episode.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import time
from pathlib import Path
from typing import Annotated, Callable, Literal

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import NotRequired, TypedDict

from envs.catalog import load_entry
from graphs import fdcr, runner
from graphs.episode import run_episode
from graphs.inputs import AtLeastOne, AtLeastZero, Ids, Level, Name, RunId, checked
from state.metrics import fraction
from graphs.selection import GATE_LEVEL, SPLIT, gate_warning, judge
from harness.bundle import bundle_diff, load_bundle
from harness.check import check_bundle, placeholder
from harness.leakage import leaks, private_terms
from roles.models import scripted
from roles.failure_analyst import analyse_failures, failure_records, replay_library, replay_references
from roles.harness_optimizer import describe_bundle, failure_text, optimize_harness, signature, spec_text, stage
from state.context import Context, EpisodeRequest
from state.evolution import Diagnosis, FailureGroup, FailureRecord, LineageEntry, ModificationSpec, Replay, Turn, group_key, pair_halves
from state.ledger import Ledger
from state.metrics import RunScores
from state.paths import RunPaths
from state.records import UsageRecord, merge

Mode = Literal["fdcr", "aggregate", "serial"]
Rule = Literal["hera", "ecdysis"]


class HarnessEvolutionInput(TypedDict):
    run_id: RunId
    base: Name
    pool: Ids
    validation: Ids
    candidates: AtLeastOne
    mode: Mode
    channel: Literal["structured", "code"]
    rounds: AtLeastZero
    rule: Rule
    gate_level: NotRequired[Level]  # the selection gate's sign-test level (default GATE_LEVEL)
    gate_trials: NotRequired[AtLeastOne]  # trials of each harness on the split the gate reads (default 1)
    tried: NotRequired[list[str]]  # the failure groups ("kind/category") candidates of earlier blocks started from


class HarnessEvolutionOutput(TypedDict, total=False):
    lineage: dict[str, LineageEntry]
    selected: str
    usage: list[UsageRecord]
    started: list[str]  # the failure group each candidate of this block started from


class HarnessEvolutionState(HarnessEvolutionInput, HarnessEvolutionOutput, total=False):
    lineage: Annotated[dict[str, LineageEntry], merge]
    usage: Annotated[list[UsageRecord], operator.add]
    started: Annotated[list[str], operator.add]
    parent: str
    failures: list[FailureRecord]
    episodes: int
    replay: Replay  # the library over the parent's training episodes (`replay_library`)
    index: int
    candidate: str
    notes: list[str]
    edit_problems: list[str]  # why the optimizer's last edit was rejected, when none passed its checks
    round_start: tuple[float, int]  # wall clock and len(usage) when the candidate's round began
    # the fdcr subgraph's keys
    diagnosis: Diagnosis
    harness: str
    review: bool
    spec: ModificationSpec
    transcript: list[Turn]


def _entries(pair_ids: list[str], ctx: Context) -> dict:
    return {p: load_entry(p, ctx.catalog) for p in pair_ids}


async def _evaluate(bundle: str, pairs: list[str], ctx: Context, run_id: str, trials: int = 1) -> tuple[RunScores, list]:
    """Metrics and graded episodes of one bundle on some pairs, as an evaluation run of its own (resumed by id)."""
    writer = get_stream_writer()
    run = await runner.evaluate(bundle, pairs, ctx, run_id=run_id, trials=trials,
                                on_episode=lambda r: writer(runner.episode_event(r)))
    return RunScores(**run.metrics.model_dump(), run_id=run.run_id), run.done


async def _scores(bundle: str, state: HarnessEvolutionState, ctx: Context, name: str) -> tuple[RunScores, RunScores, dict]:
    """Training and validation scores, the gate's split with `gate_trials` trials (on a small model one trial of a
    harness can score Abstain 1/6 and the next 6/6, which a sign test over one trial's tasks cannot tell from a gain),
    and what the failure analyst reads of the training episodes: `failures`, `episodes`, `replay`."""
    trials = {split: state.get("gate_trials", 1) if split == SPLIT[state["rule"]] else 1 for split in ("training", "validation")}
    train, train_records = await _evaluate(bundle, state["pool"], ctx, f"{state['run_id']}-{name}-train", trials["training"])
    validation, _ = await _evaluate(bundle, state["validation"], ctx, f"{state['run_id']}-{name}-validation", trials["validation"])
    entries = await asyncio.to_thread(_entries, state["pool"], ctx)
    replayed = (await replay_library(train_records, entries)).model_copy(update=await replay_references(entries))
    return train, validation, {"failures": failure_records(train_records, entries), "episodes": len(train_records), "replay": replayed}


async def baseline(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Rejects input its schema does not allow; scores the starting bundle. Writes the input as typed, `lineage`,
    `parent`, `failures`, `episodes`, `replay`, `index`."""
    given = checked(HarnessEvolutionInput, state, "harness_evolution")
    state = {**state, **given}
    bundle = load_bundle(state["base"])
    train, validation, read = await _scores(state["base"], state, runtime.context, "base")
    rule = state["rule"]
    warning = gate_warning(len(state["validation"] if rule == "hera" else state["pool"]), state.get("gate_level", GATE_LEVEL),
                           "validation" if rule == "hera" else "training")
    entry = LineageEntry(id=f"{state['run_id']}:{bundle.id}", bundle_id=bundle.id, parent_id=None, run_id=state["run_id"],
                         path=str(bundle.path), mode=state["mode"], train=train, validation=validation, adopted=True,
                         reason="the starting harness" + (f"; {warning}" if warning else ""))
    ledger = await asyncio.to_thread(Ledger, runtime.context.ledger)
    await asyncio.to_thread(ledger.record_lineage, entry)
    return {**given, "lineage": {entry.id: entry}, "parent": entry.id, "index": 0, **read}


async def failure_analyst(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Diagnoses the parent's training failures; writes `diagnosis` (with `replay`), `harness`, `review`, `usage`."""
    parent = state["lineage"][state["parent"]]
    start = (time.time(), len(state.get("usage", [])))
    diagnosis, usage = await analyse_failures(state["failures"], state["episodes"], runtime.context.analyst_model, runtime.context.model_timeout_s)
    groups = starting_order(diagnosis.groups, state.get("tried", []), state["index"])
    return {"diagnosis": diagnosis.model_copy(update={"groups": groups, "replay": state.get("replay", Replay())}),
            "harness": describe_bundle(load_bundle(parent.path)), "review": state["mode"] == "fdcr", "usage": usage, "round_start": start,
            "started": [group_key(groups[0])] if groups else []}


def starting_order(groups: tuple[FailureGroup, ...], tried: list[str], index: int) -> tuple[FailureGroup, ...]:
    """The diagnosed groups in the order candidate `index` of a block reads them, the first being where it starts: the
    groups no candidate of an earlier block started from (`tried`) before the others, each part recurring first as
    diagnosed, turned by `index` so that the candidates of one block start from different groups, and the first
    group of the other half of a pair (`pair_halves`) moved up to second. With one candidate a block and a harness
    nothing replaced, every block would otherwise start from the same group."""
    ordered = tuple(g for g in groups if group_key(g) not in tried) + tuple(g for g in groups if group_key(g) in tried)
    k = index % len(ordered) if ordered else 0
    turned = ordered[k:] + ordered[:k]
    halves = {key: i for i, key in enumerate(pair_halves([group_key(g) for g in turned]))}
    return tuple(sorted(turned, key=lambda g: halves.get(group_key(g), len(halves))))


def route_after_failure_analyst(state: HarnessEvolutionState) -> Literal["fdcr", "harness_optimizer", "selector"]:
    if not state["failures"]:
        return "selector"
    return "harness_optimizer" if state["mode"] == "serial" else "fdcr"


def candidate_name(run_id: str, index: int, lineage: dict[str, LineageEntry]) -> str:
    """c{index}, or the next free one past it: a block starting from an earlier block's candidate (its c1, say) has
    that bundle's id in its lineage already, and a lineage id names one entry."""
    return next(n for n in (f"c{i}" for i in itertools.count(index)) if f"{run_id}:{n}" not in lineage)


async def harness_optimizer(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Stages the next candidate from the parent and lets the coding agent edit it; writes `candidate`, `notes`, `usage`, `index`."""
    ctx, parent = runtime.context, state["lineage"][state["parent"]]
    index = state["index"] + 1
    name = candidate_name(state["run_id"], index, state["lineage"])
    manifest = {"id": name, "parent_id": parent.bundle_id, "origin": f"harness_evolution:{state['mode']}:{state['channel']}",
                "description": f"Candidate {index} of evolution run {state['run_id']}."}
    staging = await asyncio.to_thread(stage, Path(parent.path), RunPaths.here().bundles(state["run_id"]) / name, manifest)
    groups = [group_key(g) for g in state["diagnosis"].groups]
    if state["mode"] == "serial":
        briefs = [failure_text(f) for f in state["failures"]]
    else:
        briefs = [f"Start from this failure group: {groups[0]}.\n{spec_text(state['spec'])}" if groups else spec_text(state["spec"])]
    # Candidates of one block must differ: none may rebuild the starting bundle or an earlier candidate.
    taken = tuple([await asyncio.to_thread(signature, Path(e.path)) for e in state["lineage"].values() if Path(e.path).is_dir()])
    private = frozenset(private_terms((await asyncio.to_thread(_entries, state["pool"] + state["validation"], ctx)).values()))
    notes, usage, problems, applied = [], [], [], 0
    for i, brief in enumerate(briefs, 1):
        harness = describe_bundle(load_bundle(staging))
        more_notes, more_usage, failed = await optimize_harness(staging, brief, harness, ctx.optimizer_model, state["channel"],
                                                                ctx.model_timeout_s, groups, taken, private, state["diagnosis"].replay)
        notes += more_notes
        usage += more_usage
        if not failed:
            applied += 1
            continue
        problems = problems or failed
        if len(briefs) > 1:  # serial: one failure at a time; one whose edit was rejected is skipped
            notes.append(f"failure {i} of {len(briefs)} skipped: {'; '.join(failed)}")
    return {"candidate": str(staging), "notes": notes, "usage": usage, "index": index,
            "edit_problems": [] if applied else [f"edit: {p}" for p in problems]}


def _smoke_steps(structured: bool):
    """A deterministic exerciser: call a read-only tool on its first turn, then answer; answer any hook question with
    defaults. In the structured action mode a turn is an action object (`{"tool", "arguments"}` or `{"final_answer"}`)."""
    turns = [0]

    def step(messages, second):
        if isinstance(second, type):
            return placeholder(second)
        turns[0] += 1
        if turns[0] > 1:
            return {"final_answer": "Done."} if structured else "Done."
        tool = min(second, key=lambda t: (not t.read_only, len(t.input_schema.get("required", []))))
        if structured:  # the action grammar holds the arguments to the tool's schema
            return {"tool": tool.name, "arguments": _minimal_arguments(tool.input_schema)}
        return {"tool_calls": [{"name": tool.name, "args": {}}]}

    return step


SAMPLE = {"string": "x", "integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}


def _minimal_arguments(schema: dict) -> dict:
    """Arguments a tool's schema accepts: each required property's first allowed value, or a sample of its type."""
    properties = schema.get("properties", {})
    return {name: (properties.get(name, {}).get("enum") or [SAMPLE.get(properties.get(name, {}).get("type"), "x")])[0]
            for name in schema.get("required", [])}


async def smoke_episode(bundle: str, pair_id: str, ctx: Context) -> str | None:
    """Runs the bundle through one whole episode with the exerciser model; the problem, or None."""
    loaded = load_bundle(bundle)
    name = f"smoke-{loaded.hash}"
    scripted.register(name, [_smoke_steps(loaded.config.action_mode == "structured")] * 64)
    try:
        out = await run_episode(EpisodeRequest(pair_id=pair_id, side="act", bundle=bundle), Context(
            agent_model=f"scripted:{name}", catalog=ctx.catalog, ledger=ctx.ledger), f"smoke-{name}")
    except Exception as exc:  # whatever the candidate's hooks did, the check reports it
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # the MCP session's task group wraps it
            exc = exc.exceptions[0]
        return f"smoke episode: {type(exc).__name__}: {exc}"
    finally:
        scripted.clear(name)
    if out.get("termination") not in ("final_answer", "turn_limit"):
        return f"smoke episode ended by {out.get('termination')}: {out.get('error', '')}".strip()
    return None


async def bundle_checks(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Interface, smoke episode and leakage lint; records the candidate's lineage entry; writes `lineage`."""
    ctx, parent = runtime.context, state["lineage"][state["parent"]]
    candidate = state["candidate"]
    problems = list(state.get("edit_problems", [])) or list(await asyncio.to_thread(check_bundle, candidate))
    diff = await asyncio.to_thread(bundle_diff, parent.path, candidate)
    if not problems:
        smoke = await smoke_episode(candidate, state["pool"][0], ctx)
        problems += [smoke] if smoke else []
    entries = await asyncio.to_thread(_entries, state["pool"] + state["validation"], ctx)
    leaked = leaks(diff, entries.values())
    if leaked:
        problems.append(f"leakage: the diff contains private values of the pool: {', '.join(leaked[:10])}")
    bundle_id = Path(candidate).name
    started, mark = state["round_start"]
    entry = LineageEntry(id=f"{state['run_id']}:{bundle_id}", bundle_id=bundle_id, parent_id=parent.id, run_id=state["run_id"],
                         path=candidate, mode=state["mode"], spec=state.get("spec") if state["mode"] != "serial" else None,
                         diff=diff, problems=tuple(problems), reason="; ".join(state.get("notes", [])),
                         usage=tuple(state["usage"][mark:]), build_s=time.time() - started)
    ledger = await asyncio.to_thread(Ledger, ctx.ledger)
    await asyncio.to_thread(ledger.record_lineage, entry)
    return {"lineage": {entry.id: entry}}


def route_after_bundle_checks(state: HarnessEvolutionState) -> Literal["candidate_evaluation", "failure_analyst", "selector"]:
    entry = state["lineage"][f"{state['run_id']}:{Path(state['candidate']).name}"]
    if not entry.problems:
        return "candidate_evaluation"
    return "failure_analyst" if state["index"] < state["candidates"] else "selector"


async def candidate_evaluation(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Scores a checked candidate, which becomes the parent of the next; writes `lineage`, `parent`, `failures`, `episodes`,
    `replay`."""
    entry_id = f"{state['run_id']}:{Path(state['candidate']).name}"
    train, validation, read = await _scores(state["candidate"], state, runtime.context, Path(state["candidate"]).name)
    entry = state["lineage"][entry_id].model_copy(update={"train": train, "validation": validation})
    ledger = await asyncio.to_thread(Ledger, runtime.context.ledger)
    await asyncio.to_thread(ledger.record_lineage, entry)
    return {"lineage": {entry_id: entry}, "parent": entry_id, **read}


def route_after_candidate_evaluation(state: HarnessEvolutionState) -> Literal["failure_analyst", "selector"]:
    return "failure_analyst" if state["index"] < state["candidates"] else "selector"


def judge_candidate(base: LineageEntry, candidate: LineageEntry, rule: Rule, level: float = GATE_LEVEL) -> tuple[bool, str, dict]:
    """Whether `candidate` may replace `base` under the guarded, gated selection rule; why, and the figures used."""
    if candidate.problems:
        return False, "failed its checks: " + "; ".join(candidate.problems), {}
    split = "validation" if rule == "hera" else "train"
    return judge(getattr(base, split), getattr(candidate, split), rule, level)


async def selector(state: HarnessEvolutionState, runtime: Runtime[Context]) -> dict:
    """Adopts the best candidate that passes the rule against the starting bundle; writes `lineage`, `selected`."""
    lineage = state["lineage"]
    base = next(e for e in lineage.values() if e.parent_id is None)
    metric = "validation" if state["rule"] == "hera" else "train"
    updates, passing = {}, []
    for entry in lineage.values():
        if entry.id == base.id:
            continue
        ok, reason, figures = judge_candidate(base, entry, state["rule"], state.get("gate_level", GATE_LEVEL))
        updates[entry.id] = entry.model_copy(update={"adopted": ok, "reason": reason, "decision": figures})
        if ok:
            scores = getattr(entry, metric)
            passing.append(((fraction(scores, "pair"), fraction(scores, "abstain")), entry.id))
    selected = max(passing)[1] if passing else base.id
    for entry_id, entry in updates.items():
        if entry.adopted and entry_id != selected:
            updates[entry_id] = entry.model_copy(update={"adopted": False, "reason": entry.reason + "; another candidate scored higher"})
    ledger = await asyncio.to_thread(Ledger, runtime.context.ledger)
    for entry in updates.values():
        await asyncio.to_thread(ledger.record_lineage, entry)
    return {"lineage": updates, "selected": selected}


def build_harness_evolution() -> StateGraph:
    builder = StateGraph(HarnessEvolutionState, context_schema=Context, input_schema=HarnessEvolutionInput,
                         output_schema=HarnessEvolutionOutput)
    builder.add_node(baseline)
    builder.add_node(failure_analyst)
    builder.add_node("fdcr", fdcr.graph)
    builder.add_node(harness_optimizer)
    builder.add_node(bundle_checks)
    builder.add_node(candidate_evaluation)
    builder.add_node(selector)
    builder.add_edge(START, "baseline")
    builder.add_edge("baseline", "failure_analyst")
    builder.add_conditional_edges("failure_analyst", route_after_failure_analyst)
    builder.add_edge("fdcr", "harness_optimizer")
    builder.add_edge("harness_optimizer", "bundle_checks")
    builder.add_conditional_edges("bundle_checks", route_after_bundle_checks)
    builder.add_conditional_edges("candidate_evaluation", route_after_candidate_evaluation)
    builder.add_edge("selector", END)
    return builder


builder = build_harness_evolution()
graph = builder.compile(name="harness_evolution")


async def run_harness_evolution(
    base: str,
    pool: list[str],
    validation: list[str],
    context: Context,
    *,
    candidates: int = 4,
    mode: str = "fdcr",
    channel: str = "structured",
    rounds: int = 2,
    rule: str = "hera",
    gate_level: float = GATE_LEVEL,
    gate_trials: int = 1,
    tried: list[str] | None = None,
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) one harness-evolution block; the run id and its final state (lineage, selected, started).
    `tried`: the failure groups candidates of earlier blocks started from (`starting_order`)."""
    run_id = run_id or runner.new_run_id()
    payload = {"run_id": run_id, "base": base, "pool": pool, "validation": validation, "candidates": candidates,
               "mode": mode, "channel": channel, "rounds": rounds, "rule": rule, "gate_level": gate_level, "gate_trials": gate_trials,
               "tried": tried or []}
    return run_id, await runner.run_checkpointed(builder, "harness_evolution", run_id, payload, context,
                                           50 + 10 * candidates, on_event, RunPaths.here().evolution)
