"""The programmatic API: compile the graphs with persistence and run them.

    metrics = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import itertools
import secrets
import sqlite3
import uuid
from contextlib import asynccontextmanager
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncIterator, Callable

import aiosqlite
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from envs.catalog import CATALOG, load_catalog
from graphs import evaluate as evaluate_graph
from graphs.metrics import Metrics
from graphs.selection import GATE_LEVEL
from state.context import Context
from harness.bundle import load_bundle
from roles.models import reset_endpoints
from state.ledger import Ledger, LedgerError, held, runs_dir
from state.evolution import Diagnosis
from state.records import EpisodeRecord


BUSY_TIMEOUT_S = 60.0  # how long opening or writing the checkpoints waits for another process's write
SETUP_RETRY_S = 0.05
# The record types our checkpoints carry, allowed by name when read back.
SERDE = JsonPlusSerializer(allowed_msgpack_modules=[
    ("state.records", name) for name in ("EpisodeRecord", "EpisodeKey", "Grade", "Observation", "UsageRecord", "Certification", "CheckResult")
] + [("state.evolution", name) for name in ("FailureRecord", "FailureGroup", "Diagnosis", "ProposedChange", "Skill",
                                            "ModificationSpec", "ComponentChoice", "LineageEntry")
] + [("state.evolution", name) for name in ("ProposalTarget", "Review", "ProposalOutcome")
] + [("state.records", name) for name in ("Mutation", "StateOp", "ToolPatch", "Scope", "Evidence")
] + [("state.construction", name) for name in ("Decision", "SolverAttempt", "TaskDraft")
] + [("state.records", name) for name in ("ToolInfo", "AnswerCheck", "StateCheck", "CallPattern", "TaskSpec", "ReferenceSolution", "ToolCall")
] + [("state.context", "EpisodeRequest"), ("graphs.metrics", "Metrics"), ("graphs.fdcr", "Turn")])


def tune_gc() -> None:
    """For a process that runs many episodes: start-up objects leave the
    collector's view and young objects are collected less often, which cuts
    the collector's share of CPU per episode (benchmarks/bench_runtime.py)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def split_pairs(split: str, catalog: str = "") -> list[str]:
    """The split's pairs, one theme at a time in turn, so that any prefix spans the themes."""
    by_theme: dict[str, list[str]] = {}
    for pid, e in sorted(load_catalog(catalog or CATALOG).items()):
        if e.pair.split == split:
            by_theme.setdefault(e.env.theme, []).append(pid)
    rounds = itertools.zip_longest(*by_theme.values())
    return [pid for round_ in rounds for pid in round_ if pid]


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
) -> tuple[str, Metrics]:
    """Runs (or resumes, given the id of an interrupted run) an evaluation; the run id and its metrics.

    One process at a time evaluates a run (a claim in the ledger); a resume whose run the ledger has lost
    is refused (`LedgerError`) before anything is evaluated."""
    _check_request(pair_ids, trials, concurrency, context)
    reset_endpoints(context.agent_model, context.judge_model)
    run_id = run_id or new_run_id()
    await asyncio.to_thread(runs_dir().mkdir, parents=True, exist_ok=True)
    # every episode does blocking work (ledger, grading) in threads: size the pool to the concurrency
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=concurrency + 4))
    ledger = await asyncio.to_thread(Ledger, context.ledger)
    async with checkpointer(checkpoints_path()) as saver:
        graph = evaluate_graph.builder.compile(checkpointer=saver, name="evaluate")
        config = {"configurable": {"thread_id": run_id}, "max_concurrency": concurrency, "recursion_limit": 100}
        previous = await graph.aget_state(config)
        # the planner records the run in the ledger: past it, a run the ledger does not know was lost there
        if "order" in previous.values and await asyncio.to_thread(ledger.run, run_id) is None:
            raise LedgerError(f"run {run_id} has checkpoints in {checkpoints_path()} but no row in the ledger {ledger.path}: "
                              "the ledger was emptied or replaced; restore it from a backup, or start a new run "
                              "(without --run-id); nothing was evaluated")
        owner = uuid.uuid4().hex
        holder = await asyncio.to_thread(ledger.claim_run, run_id, owner)
        if holder is not None:
            raise ValueError(f"run {run_id} is being evaluated by pid {holder['pid']} on {holder['host']} since "
                             f"{holder['started_at']} (a claim in {ledger.path}); wait for it, or stop it and resume")
        async with held(ledger, f"run:{run_id}", owner):
            payload = None if previous.tasks else {"run_id": run_id, "bundle": bundle, "pair_ids": pair_ids, "trials": trials,
                                                  "seed": seed, **({"sides": sides} if sides else {})}
            if payload:
                await asyncio.to_thread(_check_same_run, run_id, payload, context)
            async for update in graph.astream(payload, config, context=context, stream_mode="updates", durability="sync"):
                for node, value in update.items():
                    if node == "episode_worker" and on_episode and value:
                        for record in value["results"].values():
                            on_episode(record)
            final = await graph.aget_state(config)
    return run_id, final.values["metrics"]


def _check_request(pair_ids: list[str], trials: int, concurrency: int, context: Context) -> None:
    """Refuses, before anything is recorded, an evaluation that could never complete or run."""
    twice = sorted(p for p, n in collections.Counter(pair_ids).items() if n > 1)
    problems = ["no pairs"] if not pair_ids else []
    problems += [f"pairs given more than once: {', '.join(twice)}"] if twice else []
    problems += [f"trials={trials} (at least 1)"] if trials < 1 else []
    problems += [f"concurrency={concurrency} (at least 1)"] if concurrency < 1 else []
    problems += [f"max_infra_retries={context.max_infra_retries} (at least 0)"] if context.max_infra_retries < 0 else []
    problems += [f"max_turns={context.max_turns} (at least 1, or None)"] if context.max_turns is not None and context.max_turns < 1 else []
    if problems:
        raise ValueError("cannot evaluate: " + "; ".join(problems))


def checkpoints_path() -> Path:
    """Where evaluation runs keep their checkpoints (LangGraph's, one thread per run id)."""
    return runs_dir() / "checkpoints.db"


def checkpointed_runs() -> list[str]:
    """The ids of the evaluation runs with checkpoints in the runs directory, read without writing."""
    path = checkpoints_path()
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("select distinct thread_id from checkpoints order by thread_id")]
    except sqlite3.DatabaseError:  # no checkpoint written yet, or not a checkpoint file: nothing to compare
        return []
    finally:
        conn.close()


def unrecorded_note(ledger: Ledger) -> str | None:
    """A note when the ledger holds no runs while the runs directory holds checkpoints of evaluation runs."""
    if ledger.runs():
        return None
    ids = checkpointed_runs()
    if not ids:
        return None
    shown = ", ".join(ids[:5]) + (", …" if len(ids) > 5 else "")
    return (f"the ledger {ledger.path} holds no runs, but {checkpoints_path()} holds checkpoints of {len(ids)} evaluation "
            f"run(s) ({shown}): if they were recorded in this ledger, it was emptied or replaced; restore it from a backup")


def recorded_run(run_id: str, context: Context) -> dict | None:
    """What a recorded evaluation run evaluated: bundle, pair_ids, trials, seed, model, judge; None for an unknown run."""
    run = Ledger(context.ledger).run(run_id)
    if run is None or not run.get("pairs"):
        return None
    return {"bundle": run.get("bundle_ref") or run["bundle"], "pair_ids": json.loads(run["pairs"]),
            "trials": run.get("trials"), "seed": run.get("seed") or 0, "model": run.get("model"), "judge": run.get("judge")}


def _check_same_run(run_id: str, payload: dict, context: Context) -> None:
    """A run id names one evaluation: resuming it with other pairs, bundle, trials or models is refused, not silently merged."""
    recorded = recorded_run(run_id, context)
    if recorded is None:
        return
    given = {**payload, "model": context.agent_model, "judge": context.judge_model}
    differs = [k for k, v in recorded.items() if v is not None and given.get(k) != v and not (k == "bundle" and load_bundle(given[k]).hash == load_bundle(v).hash)]
    if differs:
        raise ValueError(f"run {run_id} evaluated " + ", ".join(f"{k}={recorded[k]!r}" for k in differs)
                         + "; resume it with the same settings (omit them to reuse the recorded ones) or start a new run")


def episode_event(record: EpisodeRecord) -> dict:
    """What progress displays show of a finished episode."""
    return {"episode": record.pair_id, "side": record.key.side, "bundle": record.bundle,
            "success": bool(record.grade and record.grade.success), "status": record.status}


@asynccontextmanager
async def checkpointer(path: Path) -> AsyncIterator[AsyncSqliteSaver]:
    """A checkpointer on `path` that waits for another writer (a second evaluation in the same runs
    directory) instead of failing with "database is locked"."""
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


async def _run_checkpointed(builder, name: str, run_id: str, payload: dict, context: Context, recursion_limit: int,
                            on_event: Callable[[str, dict], None] | None, db: str = "evolution.db") -> dict:
    """Runs a graph under its run id in `runs/<db>`, or resumes it from its last checkpoint; its final state
    (a run that already finished is not run again). A run is unfinished while its last checkpoint has tasks:
    `next` alone misses a run killed after a node's writes were kept but before the next checkpoint.

    `on_event(node, update)` sees every node's update, subgraphs' included, and
    `("episode", {...})` for each episode an evaluation inside it finishes."""
    runs_dir().mkdir(parents=True, exist_ok=True)
    async with checkpointer(runs_dir() / db) as saver:
        graph = builder.compile(checkpointer=saver, name=name)
        config = {"configurable": {"thread_id": run_id}, "recursion_limit": recursion_limit}
        previous = await graph.aget_state(config)
        if previous.values and not previous.tasks:
            return previous.values
        async for _, kind, value in graph.astream(None if previous.tasks else payload, config, context=context,
                                                  stream_mode=["updates", "custom"], subgraphs=True, durability="sync"):
            if on_event is None:
                continue
            if kind == "custom":
                on_event("episode", value)
            else:
                for node, update in value.items():
                    on_event(node, update or {})
        final = await graph.aget_state(config)
    return final.values


async def evolve_harness(
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
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) one harness-evolution block; the run id and its final state (lineage, selected)."""
    from graphs import harness_evolution

    run_id = run_id or new_run_id()
    payload = {"run_id": run_id, "base": base, "pool": pool, "validation": validation, "candidates": candidates,
               "mode": mode, "channel": channel, "rounds": rounds, "rule": rule, "gate_level": gate_level}
    return run_id, await _run_checkpointed(harness_evolution.builder, "harness_evolution", run_id, payload, context,
                                           50 + 10 * candidates, on_event)


async def evolve_envs(
    parents: list[str],
    diagnosis: Diagnosis,
    context: Context,
    *,
    harness: str = "H0",
    proposers: int = 5,
    max_refinements: int = 2,
    batch_size: int = 5,
    tau: float = 0.4,
    batches: int = 1,
    budget: int = 2,
    source: str = "",
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) environment evolution; the run id and its final state (outcomes, screenings, admitted).
    `source`: the directory the parents are loaded from (a built environment's tasks), default the catalog."""
    from graphs import env_evolution

    run_id = run_id or new_run_id()
    payload = {"run_id": run_id, "parents": parents, "diagnosis": diagnosis, "harness": harness, "proposers": proposers,
               "max_refinements": max_refinements, "batch_size": batch_size, "tau": tau, "batches": batches, "budget": budget,
               **({"source": source} if source else {})}
    return run_id, await _run_checkpointed(env_evolution.builder, "env_evolution", run_id, payload, context, 100, on_event)


async def run_coevolution(
    base: str = "H0",
    context: Context | None = None,
    *,
    train: list[str] | None = None,
    validation: list[str] | None = None,
    bench: list[str] | None = None,
    rounds: int = 6,
    env: str = "coevolve",
    proposers: int = 5,
    batch_size: int = 5,
    tau: float = 0.4,
    budget: int = 2,
    max_refinements: int = 2,
    candidates: int = 4,
    mode: str = "fdcr",
    channel: str = "structured",
    review_rounds: int = 2,
    rule: str = "hera",
    gate_level: float = GATE_LEVEL,
    run_id: str | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> tuple[str, dict]:
    """Runs (or resumes) a co-evolution: `rounds` of environment then harness evolution; the run id and its final
    state (pool, batches, harness, lineage, per-round results). Pairs default to the catalog's splits."""
    from graphs import coevolution

    context = context or Context()
    run_id = run_id or new_run_id()
    payload = {"run_id": run_id, "base": base, "train": train if train is not None else split_pairs("train", context.catalog),
               "validation": validation if validation is not None else split_pairs("validation", context.catalog),
               "bench": bench if bench is not None else split_pairs("bench", context.catalog), "rounds": rounds, "env": env,
               "proposers": proposers, "batch_size": batch_size, "tau": tau, "budget": budget, "max_refinements": max_refinements,
               "candidates": candidates, "mode": mode, "channel": channel, "review_rounds": review_rounds, "rule": rule,
               "gate_level": gate_level}
    return run_id, await _run_checkpointed(coevolution.builder, "coevolution", run_id, payload, context, 20 + 10 * rounds,
                                           on_event, db="coevolution.db")


async def build_environment(
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
    from graphs import construct

    run_id = run_id or new_run_id()
    payload = {"theme": theme, "out": out, "tasks": tasks, "max_attempts": max_attempts, "max_turns": max_turns,
               "solver_tries": solver_tries, "rows": rows, "pairs": pairs, "max_refinements": max_refinements}
    return run_id, await _run_checkpointed(construct.builder, "construct", run_id, payload, context, 30 + 4 * max_attempts, on_event)
