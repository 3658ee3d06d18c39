"""The programmatic API: compile the graphs with persistence and run them.

    metrics = asyncio.run(evaluate("H0", ["weather-la-precip-missing"], Context(agent_model="local")))
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Callable

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from envs.catalog import CATALOG, load_catalog
from graphs import evaluate as evaluate_graph
from graphs.metrics import Metrics
from state.context import Context
from state.ledger import runs_dir
from state.records import EpisodeRecord


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def split_pairs(split: str, catalog: str = "") -> list[str]:
    return sorted(pid for pid, e in load_catalog(catalog or CATALOG).items() if e.pair.split == split)


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
    async with AsyncSqliteSaver.from_conn_string(str(runs_dir() / "checkpoints.db")) as saver:
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
