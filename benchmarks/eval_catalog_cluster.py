"""The whole built-in catalog evaluated on the engine with the shared store, with scripted models: every pair's
two sides as Dask tasks on a LocalCluster, ledger, journal and checkpoints in PostgreSQL, then the same run
resumed to show it is finished and read back from the store.

The scripted agent reads the first read-only tool the pair offers, with the fewest arguments its schema
requires, then answers that it cannot complete the request (a refusal: it scores as an abstention, never as a
completed task); the judge calls every answer a refusal quoting the first words. Scores are not the point: the
run is, on every environment of the catalog, through the engine and the store.

    python benchmarks/eval_catalog_cluster.py --store postgresql://USER@HOST/DB [--workers 2] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from envs.catalog import load_catalog
from graphs import api, engine
from roles.models import scripted
from state.context import Context
from state.ledger import Ledger


def refuse_after_one_lookup(messages, tools):
    """One call of a read-only tool with its required arguments filled with "x", then a refusal."""
    if any(getattr(m, "type", "") == "tool" for m in messages):
        return "I cannot complete this request: what it needs is not available."
    tool = next((t for t in tools if t.read_only), tools[0])
    required = tool.input_schema.get("required", [])
    args = {k: (1 if tool.input_schema["properties"][k].get("type") == "integer" else "x") for k in required}
    return {"tool_calls": [{"name": tool.name, "args": args}]}


def refusal(messages, schema):
    return {"verdict": "declines_all", "quote": "I cannot complete this request", "reason": "it declines"}


async def run(store: str, workers: int, concurrency: int) -> None:
    pairs = sorted(load_catalog())
    ctx = Context(agent_model="scripted:agent", judge_model="scripted:judge", engine=f"local:{workers}")
    cluster = await asyncio.to_thread(engine.client, ctx.engine)
    await asyncio.to_thread(cluster.register_plugin, scripted.worker_plugin(agent=[refuse_after_one_lookup] * (4 * len(pairs)),
                                                              judge=[refusal] * (2 * len(pairs))))
    start = time.perf_counter()
    done = await api.evaluate("H0", pairs, ctx, concurrency=concurrency)
    wall = time.perf_counter() - start
    m = done.metrics
    print(f"{len(pairs)} pairs, {m.finished}/{m.planned} episodes finished (complete: {m.complete}) in {wall:.1f} s "
          f"({m.finished / wall:.1f} episodes/s) on local:{workers}, store {Ledger(store).path}")
    print("counts", m.counts, "of", m.totals)
    again = await api.evaluate("H0", pairs, ctx, concurrency=concurrency, run_id=done.run_id)  # finished: read back
    status = [a["status"] for a in Ledger(store).attempts(done.run_id)]  # a store that held these episodes already reuses them
    print(f"resumed run {done.run_id}: same metrics {again.metrics == m}; its attempts in the store: {status.count('done')} run, "
          f"{status.count('reused')} reused (the resume's, and any the store held before), "
          f"{status.count('infrastructure_error')} infrastructure errors")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True, help="a PostgreSQL URL")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    os.environ["HERA_STORE"] = args.store
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HERA_RUNS"] = tmp
        try:
            asyncio.run(run(args.store, args.workers, args.concurrency))
        finally:
            engine.close()


if __name__ == "__main__":
    main()
