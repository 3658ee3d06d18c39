"""The `evaluate` graph: a harness on both sides of pairs, graded and scored.

`planner` checks the bundle in the sandbox and the pairs, and orders the pairs
by environment; `episodes` runs one `EpisodeTask` per pair × side × trial, in
that order, at most the caller's `max_concurrency` attempts at once (with
`AHEAD` times as many episodes in hand, so that the claims and records of the
others go on beside them; an attempt's place is given back once its model
calls are done, while its replay finishes), each through
`episode_worker`, which reuses a finished episode from the rollout cache (the
ledger) or runs, grades and stores it, re-running infrastructure errors, and
runs nothing more once a model's endpoint is down
(`roles.models.endpoint_down`), which leaves the run incomplete for a resume;
`scorer` computes the metrics. An episode is run under a claim on its key in
the ledger: a concurrent evaluation that needs the same episode waits for the
result instead of running it again, and every run scores the record the ledger
holds. Each attempt runs in this process or on the engine `graphs.engine` opens.

The episodes are one node's work, not one task (`Send`) each: LangGraph's
runner waits on every task of a step at each wake-up and filters its pending
writes at each task's end, which made the coordinator's CPU per episode grow
with the episodes in a run (10% of it at 512 episodes, py-spy on
benchmarks/bench_runtime.py). The one who asked for the run sees each episode
as it ends (`ON_EPISODE`).
"""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import time
import traceback
import uuid
from functools import lru_cache
from typing import Annotated, Callable

import anyio
from langchain_core.messages import messages_to_dict
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from mcp.shared.exceptions import McpError
from pydantic import Field
from typing_extensions import NotRequired, TypedDict

from envs.catalog import load_entry, run_entry, side_env
from envs.grading import ReplayMismatch, deterministic_grade, grade, rejudged
from envs.spec import SpecError
from envs.untrusted import EnvironmentFault
from graphs import engine
from graphs.episode import run_episode
from graphs.inputs import AtLeastOne, Ids, Name, RunId, checked
from harness.bundle import hashed_bundle, load_bundle
from harness.check import check_bundle
from harness.tool_sandbox import ToolSandboxError
from roles.abstention_judge import abstention_judge, judge_id
from roles.models import InfrastructureError, endpoint_down
from state.context import ConfigError, Context, EpisodeRequest
from state import journal
from state.ledger import Ledger, held
from state.metrics import Metrics, score
from state.records import EpisodeKey, EpisodeRecord, Side, capped, merge

# Episodes in hand at once, per attempt allowed at once: the claims, cache reads and ledger writes of the others (trips
# off the event loop, long ones in a busy process) go on while the attempts run, instead of holding an attempt's place.
AHEAD = 2
POLL_S = 1.0  # how often an episode that another evaluation is running is looked for in the ledger
# Called with each episode's record as it ends, in the context of the run's caller (`graphs.runner.evaluate`).
ON_EPISODE: contextvars.ContextVar[Callable[[EpisodeRecord], None] | None] = contextvars.ContextVar("hera_on_episode", default=None)
# Gives the running attempt's place back (`Turn.leave`) once its model calls are done, while its replay (no model)
# finishes; a no-op on an engine's worker, which holds no place.
LEAVE: contextvars.ContextVar[Callable[[], None]] = contextvars.ContextVar("hera_leave", default=lambda: None)


class EvaluateInput(TypedDict):
    run_id: RunId
    bundle: Name
    pair_ids: Ids
    trials: AtLeastOne
    seed: int
    sides: NotRequired[Annotated[list[Side], Field(min_length=1)]]  # default both; a screening runs only the abstain side (scored as incomplete)


class EvaluateOutput(TypedDict, total=False):
    results: dict[str, EpisodeRecord]
    metrics: Metrics
    order: list[str]  # the pairs grouped by environment, the order episodes run in


class EvaluateState(EvaluateInput, EvaluateOutput, total=False):
    results: Annotated[dict[str, EpisodeRecord], merge]
    tiers: dict[str, str]  # pair id -> tier, for the scores by tier


class EpisodeTask(TypedDict):
    run_id: str
    request: EpisodeRequest


async def planner(state: EvaluateState, runtime: Runtime[Context]) -> dict:
    """Rejects input its schema does not allow, a bundle whose hooks fail the sandboxed check, unknown pairs or an
    engine it cannot reach (starting a local one); records the run. Writes the input as typed, `order` and `tiers`."""
    given = checked(EvaluateInput, state, "evaluate")
    state = {**state, **given}
    if runtime.context.engine:
        await asyncio.to_thread(engine.client, runtime.context.engine)
    problems = await asyncio.to_thread(_check, state["bundle"])
    if problems:
        raise ConfigError("the bundle fails its checks: " + "; ".join(problems))
    catalog = runtime.context.catalog
    try:
        entries = {p: await asyncio.to_thread(load_entry, p, catalog) for p in state["pair_ids"]}
    except KeyError as exc:
        raise ConfigError(f"evaluate input: pair_ids: {exc.args[0]}") from None
    envs = {p: e.env.id for p, e in entries.items()}
    bundle = await asyncio.to_thread(load_bundle, state["bundle"])
    ledger = await asyncio.to_thread(Ledger, runtime.context.ledger)
    await asyncio.to_thread(
        ledger.record_run, state["run_id"], bundle=bundle.id, harness_hash=bundle.hash,
        model=runtime.context.agent_model, judge=runtime.context.judge_model, pairs=state["pair_ids"], trials=state["trials"],
        seed=state["seed"], bundle_ref=state["bundle"], tiers={p: e.pair.tier for p, e in entries.items()},
        max_turns=runtime.context.max_turns or 0,  # 0: no cap but the harness's own
    )
    # Episodes of one environment back to back: they share the prompt prefix a local server keeps cached.
    return {**given, "order": sorted(state["pair_ids"], key=lambda p: (envs[p], state["pair_ids"].index(p))),
            "tiers": {p: e.pair.tier for p, e in entries.items()}}


_passed: set[str] = set()


def _check(bundle: str) -> list[str]:
    """The sandboxed check's problems, run once per bundle content in this
    process: the hash covers every file the check reads (the manifest, which it
    does not, is checked by loading), so a pass stays a pass."""
    try:
        digest = load_bundle(bundle).hash
    except SpecError:
        return check_bundle(bundle)
    if digest in _passed:
        return []
    problems = check_bundle(bundle)
    if not problems:
        _passed.add(digest)
    return problems


def episode_tasks(state: EvaluateState) -> list[EpisodeTask]:
    return [
        EpisodeTask(run_id=state["run_id"], request=EpisodeRequest(pair_id=p, side=side, bundle=state["bundle"], seed=state["seed"], trial=t))
        for p in state.get("order") or state["pair_ids"] for t in range(state["trials"]) for side in state.get("sides") or ("act", "abstain")
    ]


async def episodes(state: EvaluateState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    """Every episode of the run through `episode_worker`, taken in the planned order, at most `max_concurrency`
    attempts at once (all at once without it) and `AHEAD` times as many episodes in hand. An exception that is our
    bug stops the others and fails the run."""
    tasks = episode_tasks(state)
    queue, results, told = iter(tasks), {}, ON_EPISODE.get()
    limit = min(config.get("max_concurrency") or len(tasks), len(tasks))
    gate, last = asyncio.Semaphore(limit), asyncio.Event()
    last.set()

    async def work() -> None:
        nonlocal last
        for task in queue:  # the workers share one iterator: each takes the next episode when its last one ends
            turn = Turn(gate, last)
            last = turn.taken
            try:
                update = await episode_worker(task, runtime, turn)
            finally:
                turn.taken.set()
            for slot, record in update.get("results", {}).items():
                results[slot] = record
                if told:
                    told(record)

    workers = [asyncio.create_task(work()) for _ in range(min(AHEAD * limit, len(tasks)))]
    try:
        await asyncio.gather(*workers)
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return {"results": results}


class Turn:
    """An episode's place at the run's gate (at most `max_concurrency` attempts at once), taken in the planned order:
    its first entry waits until the episode taken before it has entered or passed (`taken`), so that episodes in hand
    start in that order whatever order their claims come back in; a later entry (a re-run) waits only for a place."""

    def __init__(self, gate: asyncio.Semaphore, before: asyncio.Event):
        self.gate, self.before, self.taken, self.held = gate, before, asyncio.Event(), False

    async def __aenter__(self) -> None:
        await self.before.wait()
        await self.gate.acquire()
        self.held = True
        self.taken.set()

    def leave(self) -> None:
        """Gives the place back before the block ends (once)."""
        if self.held:
            self.held = False
            self.gate.release()

    async def __aexit__(self, *exc) -> None:
        self.leave()


async def episode_worker(task: EpisodeTask, runtime: Runtime[Context], turn: Turn) -> dict:
    """Reuses, waits for (while another evaluation runs it) or runs, grades and stores one episode, unless the
    agent's or the judge's endpoint is down; writes `results`, the record the ledger holds. Its model calls (an
    attempt, a judge's new reading of a reused record) are made in its `turn`. An environment fault is not re-run:
    the same tool fails the same way."""
    ctx, request, run_id = runtime.context, task["request"], task["run_id"]
    owner = uuid.uuid4().hex
    ledger, entry, key, (cached, holder) = await asyncio.to_thread(_start, request, ctx, run_id, owner)
    while True:
        if cached is not None:
            async with turn:
                cached = _as_asked(await _judged_now(cached, entry, ctx, ledger), request)
            await asyncio.to_thread(ledger.record_episode, run_id, cached, cached.status == "done")
            return {"results": {_slot(request): cached}}
        if holder is None:
            break
        turn.taken.set()  # the episodes after it go on while another evaluation runs it
        await asyncio.sleep(POLL_S)
        cached, holder = await asyncio.to_thread(_claim, ledger, key, ctx, run_id, owner)
    record = None
    async with held(ledger, f"episode:{key.id}", owner) as claim:
        for attempt in range(ctx.max_infra_retries + 1):
            async with turn:
                if endpoint_down(ctx.agent_model, ctx.judge_model):  # looked at once the place is ours: it may have gone down meanwhile
                    break
                leave = LEAVE.set(turn.leave)
                try:
                    record = await engine.run_attempt(_attempt, entry, request, key, ctx, ledger, _episode_id(key, attempt))
                finally:
                    LEAVE.reset(leave)
            last = record.status == "done" or record.termination == "environment_error" or attempt == ctx.max_infra_retries
            record = _as_asked(await asyncio.to_thread(ledger.record_episode, run_id, record, release=claim if last else None), request)
            if last or record.status == "done":  # done: this attempt's record, or another writer's the ledger holds
                break
    return {"results": {_slot(request): record}} if record is not None else {}


async def _judged_now(record: EpisodeRecord, entry, ctx: Context, ledger: Ledger) -> EpisodeRecord:
    """A finished record of the rollout cache as this run's judge grades it: one that another judge (model or version)
    graded has its answer judged again, its grade remade from the facts it holds and stored in its place; a judge that
    fails leaves it an infrastructure error of this run, not scored (a resume judges it again)."""
    judge = judge_id(ctx.judge_model)
    if record.status != "done" or record.grade is None or record.grade.judge == judge:
        return record
    try:
        verdict, usage = await _judge(entry.pair.task.instruction.strip(), record.answer, ctx, ledger)
    except InfrastructureError as exc:
        return record.model_copy(update={"status": "infrastructure_error", "error": f"grading: {exc}"})
    record = record.model_copy(update={"grade": rejudged(record.grade, verdict.abstained, verdict.quote, judge),
                                       "usage": (*record.usage, *usage)})
    await asyncio.to_thread(ledger.regrade_episode, record)
    return record


def _slot(request: EpisodeRequest) -> str:
    """Where a run keeps an episode's record: one per pair, side and trial, as two pairs of one run may share an
    episode (a twin made from a pair's feasible side has that pair's act episode)."""
    return f"{request.pair_id}/{request.side}/{request.trial}"


def _as_asked(record: EpisodeRecord, request: EpisodeRequest) -> EpisodeRecord:
    """A record from the rollout cache under the names this run gave it: the key is the episode's content (harness
    and environment hashes, task, side, model, seed, trial, turn cap), which another pair or bundle of the same
    content shares, as a twin environment evolution proposes again in a later run does."""
    if (record.pair_id, record.bundle) == (request.pair_id, request.bundle):
        return record
    return record.model_copy(update={"pair_id": request.pair_id, "bundle": request.bundle})


@lru_cache(maxsize=256)
def _run_bundle_hash(run_id: str, bundle: str) -> str:
    """The bundle's hash as the run's first episode in this process read it (`run_entry`)."""
    return load_bundle(bundle).hash


def _start(request: EpisodeRequest, ctx: Context, run_id: str, owner: str):
    """In one trip off the event loop: the ledger, the pair, the rollout-cache key, and the episode's cached record or
    the holder of its claim (`_claim`)."""
    ledger, entry = Ledger(ctx.ledger), run_entry(run_id, request.pair_id, ctx.catalog)
    key = EpisodeKey(harness_hash=_run_bundle_hash(run_id, request.bundle), env_hash=side_env(entry, request.side).hash,
                     task_id=entry.pair.task.id, side=request.side, model=ctx.agent_model, seed=request.seed, trial=request.trial,
                     max_turns=ctx.max_turns, sampling="turn")
    return ledger, entry, key, _claim(ledger, key, ctx, run_id, owner)


def _claim(ledger: Ledger, key: EpisodeKey, ctx: Context, run_id: str, owner: str):
    """`Ledger.claim_episode`. Once `owner` holds the episode for a run in this process, the first attempt's journal
    scope is looked up in the same trip (`journal.look_ahead`): its first model call then makes no trip of its own."""
    claimed = ledger.claim_episode(key.id, run_id, owner)
    thread = journal.run_thread()
    if claimed == (None, None) and thread and not ctx.engine:
        journal.look_ahead(journal.episode_scope(thread, _episode_id(key, 0)))
    return claimed


def _episode_id(key: EpisodeKey, attempt: int) -> str:
    return f"{key.id}-{attempt}"


async def _attempt(entry, request: EpisodeRequest, key: EpisodeKey, ctx: Context, ledger: Ledger, episode_id: str,
                   thread: str | None = None) -> EpisodeRecord:
    """Runs, grades and judges one attempt (`thread`: the run's, on an engine's worker outside it)."""
    base = {"key": key, "pair_id": request.pair_id, "bundle": request.bundle}
    start = time.perf_counter()
    try:
        bundle = hashed_bundle(request.bundle, key.harness_hash) or await asyncio.to_thread(load_bundle, request.bundle)
        out = await run_episode(request, ctx, episode_id, entry, thread=thread, bundle=bundle)
    except Exception as exc:
        if not infrastructure(exc):  # our own bug fails the run loudly rather than hiding as a re-run
            raise
        return EpisodeRecord(**base, status="infrastructure_error", error=capped(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))
    trajectory = {
        "termination": out.get("termination", ""),
        "answer": out.get("answer", ""),
        "messages": tuple(messages_to_dict(out.get("messages", []))),
        "observations": tuple(out.get("observations", [])),
        "latency_s": time.perf_counter() - start,
    }
    usage, error = list(out.get("usage", [])), out.get("error", "")
    if out.get("termination") == "infrastructure_error":
        return EpisodeRecord(**base, **trajectory, usage=tuple(usage), status="infrastructure_error", error=error)
    if out.get("termination") == "environment_error":  # the environment's defect: reported, never scored against the harness
        return EpisodeRecord(**base, **trajectory, usage=tuple(usage), status="infrastructure_error", error=f"environment fault: {error}")
    # The replay and the judge at once: the judge reads only the request and the answer. Once the judge (the last model
    # call) has answered, the attempt's place is given back while the replay finishes: at 64 in flight it once held
    # the place 34 ms an episode. A replay that fails makes the attempt an infrastructure error whatever the judge said.
    replay = asyncio.ensure_future(asyncio.to_thread(deterministic_grade, entry, request.side, trajectory["observations"],
                                                     trajectory["answer"], trajectory["messages"]))
    try:
        judged = await asyncio.gather(_judge(entry.pair.task.instruction.strip(), trajectory["answer"], ctx, ledger), return_exceptions=True)
    except BaseException:  # cancelled: the replay's result is nobody's
        replay.cancel()
        raise
    LEAVE.get()()
    outcomes = [*await asyncio.gather(replay, return_exceptions=True), *judged]
    for outcome in outcomes:
        if isinstance(outcome, (InfrastructureError, ReplayMismatch)):
            return EpisodeRecord(**base, **trajectory, usage=tuple(usage), status="infrastructure_error", error=f"grading: {outcome}")
        if isinstance(outcome, BaseException):
            raise outcome
    facts, (verdict, judge_usage) = outcomes
    return EpisodeRecord(**base, **trajectory, usage=tuple(usage + judge_usage), status="done",
                         grade=grade(request.side, facts, verdict.abstained, verdict.quote, judge_id(ctx.judge_model)), error=error)


# What an episode's machinery may fail with that is not the harness's doing and not our bug: a model endpoint's,
# an MCP session's (its streams, its server process) or a sandboxed child's failure. Re-run, never scored.
INFRASTRUCTURE = (InfrastructureError, McpError, OSError, TimeoutError, subprocess.SubprocessError, ToolSandboxError, EnvironmentFault,
                  anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


def infrastructure(exc: BaseException) -> bool:
    """Whether `exc` (every exception of a group: MCP's task groups raise them) is an infrastructure failure."""
    if isinstance(exc, BaseExceptionGroup):
        return all(infrastructure(e) for e in exc.exceptions)
    return isinstance(exc, INFRASTRUCTURE)


async def _judge(instruction: str, answer: str, ctx: Context, ledger: Ledger):
    """The judge's verdict, asked again on a judge failure rather than re-running the episode."""
    for attempt in range(ctx.max_infra_retries + 1):
        try:
            return await abstention_judge(instruction, answer, ctx.judge_model, ledger)
        except InfrastructureError:
            if attempt == ctx.max_infra_retries:
                raise


async def scorer(state: EvaluateState, runtime: Runtime[Context]) -> dict:
    """Scores the finished episodes; writes `metrics` and records them with the run."""
    metrics = score(list(state.get("results", {}).values()), state["pair_ids"], state["trials"], tiers=state.get("tiers"))
    ledger = await asyncio.to_thread(Ledger, runtime.context.ledger)
    await asyncio.to_thread(ledger.record_run, state["run_id"], metrics=metrics.model_dump())
    return {"metrics": metrics}


def build_evaluate() -> StateGraph:
    builder = StateGraph(EvaluateState, context_schema=Context, input_schema=EvaluateInput, output_schema=EvaluateOutput)
    builder.add_node(planner)
    builder.add_node(episodes)
    builder.add_node(scorer)
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "episodes")
    builder.add_edge("episodes", "scorer")
    builder.add_edge("scorer", END)
    return builder


builder = build_evaluate()
graph = builder.compile(name="evaluate")
