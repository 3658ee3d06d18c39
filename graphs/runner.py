"""The runner: compiles a graph with checkpoints under the runs directory and runs it by run id, resuming an
interrupted run from its last checkpoint; the programmatic API, the CLI and the evolution graphs (which run
evaluations and sub-runs of their own) all run graphs through it.

`evaluate` runs the `evaluate` graph under a claim in the ledger and returns the run's metrics with its
episode records; `run_checkpointed` runs any other graph and returns its final state.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import gc
import json
import secrets
import sqlite3
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncIterator, Callable

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import StateGraph

from graphs import engine, evaluate as evaluate_graph
from state.metrics import Metrics
from harness.bundle import load_bundle
from roles.models import reset_endpoints
from state import journal
from state.context import ConfigError, Context
from state.ledger import Ledger, LedgerError, held
from state.paths import RunPaths
from state.records import EpisodeRecord
from state.store import StoreError, redacted, store_url

BUSY_TIMEOUT_S = 60.0  # how long opening or writing the checkpoints waits for another process's write
SETUP_RETRY_S = 0.05
# The record types our checkpoints carry, allowed by name when read back.
SERDE = JsonPlusSerializer(allowed_msgpack_modules=[
    ("state.records", name) for name in ("EpisodeRecord", "EpisodeKey", "Grade", "Observation", "UsageRecord", "Certification", "CheckResult")
] + [("state.evolution", name) for name in ("FailureRecord", "FailureGroup", "Diagnosis", "Replay", "ProposedChange", "Skill",
                                            "ModificationSpec", "ComponentChoice", "LineageEntry")
] + [("state.evolution", name) for name in ("ProposalTarget", "Review", "ProposalOutcome")
] + [("state.records", name) for name in ("Mutation", "StateOp", "ToolPatch", "Scope", "Evidence")
] + [("state.construction", name) for name in ("Decision", "SolverAttempt", "TaskDraft")
] + [("state.records", name) for name in ("ToolInfo", "AnswerCheck", "StateCheck", "CallPattern", "TaskSpec", "ReferenceSolution", "ToolCall")
] + [("state.context", "EpisodeRequest"), ("state.metrics", "Metrics"), ("state.metrics", "RunScores"), ("state.evolution", "Turn")])


@dataclass(frozen=True)
class Evaluation:
    """A finished (or, when an endpoint went down, incomplete) evaluation run: its metrics and the episode
    records it scored, in the order it ran them."""

    run_id: str
    metrics: Metrics
    episodes: tuple[EpisodeRecord, ...]

    @property
    def done(self) -> list[EpisodeRecord]:
        """The episodes that ended and were graded (not infrastructure errors)."""
        return [r for r in self.episodes if r.status == "done"]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def tune_gc() -> None:
    """For a process that runs many episodes: start-up objects leave the
    collector's view and young objects are collected less often, which cuts
    the collector's share of CPU per episode (benchmarks/bench_runtime.py)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@asynccontextmanager
async def checkpointer(path: Path) -> AsyncIterator[BaseCheckpointSaver]:
    """A checkpointer on `path` that waits for another writer (a second evaluation in the same runs
    directory) instead of failing with "database is locked"; with a PostgreSQL store (`state.store`), on the
    store's schema named after the file (`checkpoints`, `evolution`, `coevolution`). On the way out, the run's
    journaled calls are kept (`journal.flush`) whether it finished or not: a resume reads them back."""
    try:
        async with _checkpointer(path) as saver:
            yield saver
    finally:
        await asyncio.to_thread(journal.flush)


@asynccontextmanager
async def _checkpointer(path: Path) -> AsyncIterator[BaseCheckpointSaver]:
    url = store_url()
    if url:
        async with postgres_checkpointer(url, path.stem) as saver:
            yield saver
        return
    async with aiosqlite.connect(path, timeout=BUSY_TIMEOUT_S) as conn:
        saver = AsyncSqliteSaver(conn)
        saver.serde = SERDE
        # Two connections setting up a new file at once: one's switch to WAL fails at once, busy timeout or not
        # (seen: 58 of 200 concurrent first opens); it is tried again once the other is done.
        for _ in range(int(BUSY_TIMEOUT_S / SETUP_RETRY_S)):
            try:
                await saver.setup()
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error):
                    raise
                await asyncio.sleep(SETUP_RETRY_S)
        yield saver


@asynccontextmanager
async def postgres_checkpointer(url: str, schema: str) -> AsyncIterator[BaseCheckpointSaver]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection, Error
    from psycopg.rows import dict_row

    try:
        conn = await AsyncConnection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except Error as exc:
        raise StoreError(f"{redacted(url)}: cannot open the PostgreSQL store ({str(exc).strip().splitlines()[0]})") from None
    async with conn:
        # one process at a time makes the schema and runs the checkpointer's migrations
        await conn.execute("select pg_advisory_lock(hashtext('hera-ddl'))")
        try:
            await conn.execute(f'create schema if not exists "{schema}"')
            await conn.execute(f'set search_path to "{schema}"')
            saver = AsyncPostgresSaver(conn, serde=SERDE)
            await saver.setup()
        finally:
            await conn.execute("select pg_advisory_unlock(hashtext('hera-ddl'))")
        yield saver


async def evaluate(
    bundle: str,
    pair_ids: list[str],
    context: Context,
    *,
    trials: int = 1,
    seed: int = 0,
    concurrency: int = 1,
    run_id: str | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    sides: list[str] | None = None,
) -> Evaluation:
    """Runs (or resumes, given the id of an interrupted run) an evaluation.

    One process at a time evaluates a run (a claim in the ledger); a resume whose run the ledger has lost
    is refused (`LedgerError`) before anything is evaluated."""
    _check_request(pair_ids, trials, concurrency)
    reset_endpoints(context.agent_model, context.judge_model)
    run_id = run_id or new_run_id()
    paths = RunPaths.here()
    await asyncio.to_thread(paths.root.mkdir, parents=True, exist_ok=True)
    engine.bound_pool(asyncio.get_running_loop())
    ledger = await asyncio.to_thread(Ledger, context.ledger)
    async with checkpointer(paths.checkpoints) as saver:
        graph = evaluate_graph.builder.compile(checkpointer=saver, name="evaluate")
        config = {"configurable": {"thread_id": run_id}, "max_concurrency": concurrency, "recursion_limit": 100}
        previous = await graph.aget_state(config)
        # the planner records the run in the ledger: past it, a run the ledger does not know was lost there
        if "order" in previous.values and await asyncio.to_thread(ledger.run, run_id) is None:
            raise LedgerError(f"run {run_id} has checkpoints in {paths.checkpoints} but no row in the ledger {ledger.path}: "
                              "the ledger was emptied or replaced; restore it from a backup, or start a new run "
                              "(without --run-id); nothing was evaluated")
        owner = uuid.uuid4().hex
        holder = await asyncio.to_thread(ledger.claim_run, run_id, owner)
        if holder is not None:
            raise ConfigError(f"run {run_id} is being evaluated by pid {holder['pid']} on {holder['host']} since "
                             f"{holder['started_at']} (a claim in {ledger.path}); wait for it, or stop it and resume")
        async with held(ledger, f"run:{run_id}", owner):
            payload = None if previous.tasks else {"run_id": run_id, "bundle": bundle, "pair_ids": pair_ids, "trials": trials,
                                                  "seed": seed, **({"sides": sides} if sides else {})}
            # an interrupted run goes on with its checkpointed request: only the models and turn cap given now are checked
            await asyncio.to_thread(_check_same_run, run_id, payload or {}, context)
            # Checkpointed when the run ends, not after each episode: the ledger already keeps every finished episode (the
            # rollout cache), so a run killed before its end starts again from the planner and reuses them. Writing each
            # record to the checkpoints as well took 2% of the event loop in one process and 9% of the coordinator's CPU
            # on the engine (py-spy, benchmarks/bench_runtime.py at 64 episodes in flight and on 2 workers).
            # told in the caller's context, not the node's: a caller inside a graph node that asks LangGraph for its
            # stream writer as each episode ends gets its own graph's writer, not the evaluation's
            caller = contextvars.copy_context()
            told = evaluate_graph.ON_EPISODE.set(on_episode and (lambda record: caller.run(on_episode, record)))
            try:
                final = await graph.ainvoke(payload, config, context=context, durability="exit")
            finally:
                evaluate_graph.ON_EPISODE.reset(told)
    order = {p: i for i, p in enumerate(final.get("order") or pair_ids)}
    episodes = sorted(final.get("results", {}).values(),
                      key=lambda r: (order.get(r.pair_id, len(order)), r.key.trial, r.key.side != "act"))
    return Evaluation(run_id, final["metrics"], tuple(episodes))


def _check_request(pair_ids: list[str], trials: int, concurrency: int) -> None:
    """Refuses, before anything is recorded, an evaluation that could never complete or run."""
    twice = sorted(p for p, n in collections.Counter(pair_ids).items() if n > 1)
    problems = ["no pairs"] if not pair_ids else []
    problems += [f"pairs given more than once: {', '.join(twice)}"] if twice else []
    problems += [f"trials={trials} (at least 1)"] if trials < 1 else []
    problems += [f"concurrency={concurrency} (at least 1)"] if concurrency < 1 else []
    if problems:
        raise ConfigError("cannot evaluate: " + "; ".join(problems))


def recorded_run(run_id: str, context: Context) -> dict | None:
    """What a recorded evaluation run evaluated: bundle, pair_ids, trials, seed, model, judge, max_turns (0: no cap
    but the harness's own; None: a run recorded before caps were); None for an unknown run."""
    run = Ledger(context.ledger).run(run_id)
    if run is None or not run.get("pairs"):
        return None
    return {"bundle": run.get("bundle_ref") or run["bundle"], "pair_ids": json.loads(run["pairs"]),
            "trials": run.get("trials"), "seed": run.get("seed") or 0, "model": run.get("model"), "judge": run.get("judge"),
            "max_turns": run.get("max_turns")}


def _check_same_run(run_id: str, payload: dict, context: Context) -> None:
    """A run id names one evaluation: resuming it with other pairs, bundle, trials or models is refused, not silently merged."""
    recorded = recorded_run(run_id, context)
    if recorded is None:
        return
    given = {**payload, "model": context.agent_model, "judge": context.judge_model, "max_turns": context.max_turns or 0}
    differs = [k for k, v in recorded.items() if v is not None and k in given and given[k] != v and not (k == "bundle" and load_bundle(given[k]).hash == load_bundle(v).hash)]
    if differs:
        raise ConfigError(f"run {run_id} evaluated " + ", ".join(f"{k}={recorded[k]!r}" for k in differs)
                         + "; resume it with the same settings (omit them to reuse the recorded ones) or start a new run")


async def node_path(builder: StateGraph, name: str, run_id: str, store: Path) -> list[str]:
    """The nodes a checkpointed run has run so far, oldest first (a fanned-out node once per task), read back from
    its checkpoints: what a parent run shows of a sub-run, whether the sub-run ran now or had finished before."""
    async with checkpointer(store) as saver:
        graph = builder.compile(checkpointer=saver, name=name)
        history = [snapshot async for snapshot in graph.aget_state_history({"configurable": {"thread_id": run_id}})]
    return [node for snapshot in reversed(history) if snapshot.metadata.get("source") != "input" for node in snapshot.next]


def episode_event(record: EpisodeRecord) -> dict:
    """What progress displays show of a finished episode."""
    return {"episode": record.pair_id, "side": record.key.side, "bundle": record.bundle,
            "success": bool(record.grade and record.grade.success), "status": record.status}


async def run_checkpointed(builder: StateGraph, name: str, run_id: str, payload: dict, context: Context, recursion_limit: int,
                           on_event: Callable[[str, dict], None] | None, store: Path) -> dict:
    """Runs a graph under its run id in the checkpoint file `store`, or resumes it from its last checkpoint; its final
    state (a run that already finished is not run again). A run is unfinished while its last checkpoint has tasks:
    `next` alone misses a run killed after a node's writes were kept but before the next checkpoint.

    `on_event(node, update)` sees every node's update, subgraphs' included,
    `("episode", {...})` for each episode an evaluation inside it finishes, and `("stage", {"stage": node})` for each
    node a sub-run inside it finishes."""
    store.parent.mkdir(parents=True, exist_ok=True)
    async with checkpointer(store) as saver:
        graph = builder.compile(checkpointer=saver, name=name)
        config = {"configurable": {"thread_id": run_id}, "recursion_limit": recursion_limit}
        previous = await graph.aget_state(config)
        if previous.values and not previous.tasks:
            return previous.values
        async for _, kind, value in graph.astream(None if previous.tasks else payload, config, context=context,
                                                  stream_mode=["updates", "custom"], subgraphs=True, durability="sync"):
            if on_event is None:
                continue
            if kind == "custom":  # an episode, or a sub-run's node (`{"stage": node}`)
                on_event("stage" if "stage" in value else "episode", value)
            else:
                for node, update in value.items():
                    on_event(node, update or {})
        final = await graph.aget_state(config)
    return final.values
