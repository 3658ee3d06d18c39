"""The programmatic API: compile the graphs with persistence and run them.

    metrics = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Callable

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from envs.catalog import CATALOG, load_catalog
from graphs import evaluate as evaluate_graph
from graphs.metrics import Metrics
from state.context import Context
from state.ledger import runs_dir
from state.records import EpisodeRecord


# The record types our checkpoints carry, allowed by name when read back.
SERDE = JsonPlusSerializer(allowed_msgpack_modules=[
    ("state.records", name) for name in ("EpisodeRecord", "EpisodeKey", "Grade", "Observation", "UsageRecord", "Certification", "CheckResult")
] + [("state.context", "EpisodeRequest"), ("graphs.metrics", "Metrics")])


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
) -> tuple[str, Metrics]:
    """Runs (or resumes, given the id of an interrupted run) an evaluation; the run id and its metrics."""
    run_id = run_id or new_run_id()
    runs_dir().mkdir(parents=True, exist_ok=True)
    # every episode does blocking work (ledger, grading) in threads: size the pool to the concurrency
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=concurrency + 4))
    async with AsyncSqliteSaver.from_conn_string(str(runs_dir() / "checkpoints.db")) as saver:
        saver.serde = SERDE
        graph = evaluate_graph.builder.compile(checkpointer=saver, name="evaluate")
        config = {"configurable": {"thread_id": run_id}, "max_concurrency": concurrency, "recursion_limit": 100}
        previous = await graph.aget_state(config)
        payload = None if previous.next else {"run_id": run_id, "bundle": bundle, "pair_ids": pair_ids, "trials": trials, "seed": seed}
        async for update in graph.astream(payload, config, context=context, stream_mode="updates", durability="sync"):
            for node, value in update.items():
                if node == "episode_worker" and on_episode and value:
                    for record in value["results"].values():
                        on_episode(record)
        final = await graph.aget_state(config)
    return run_id, final.values["metrics"]
