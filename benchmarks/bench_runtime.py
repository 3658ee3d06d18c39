"""Harness runtime benchmark, measured side by side in one run.

1. Overhead per turn: an episode whose scripted model sleeps a set latency
   per call (default 200 ms) and calls one tool per turn, against the same
   number of bare model calls. Goal: under 2%.
2. Throughput: episodes per second through the evaluate graph at
   concurrency 1, 8, 32 and 64, against the ideal (concurrency / episode
   time at zero overhead). Goal: at least 90% of ideal at 64. Each level runs
   twice, with Python's default garbage collector settings and with the
   tuning `hera eval` applies (`graphs.api.tune_gc`).

    python benchmarks/bench_runtime.py [--latency-ms 200] [--turns 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import tempfile
import time
from pathlib import Path

from langchain_core.messages import HumanMessage, ToolMessage
from rich.console import Console
from rich.table import Table

from graphs import api
from graphs.episode import run_episode
from roles.models import scripted
from roles.models import chat_model
from state.context import Context, EpisodeRequest

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
PAIR = "shop-reserve-drill"
DEFAULT_GC = gc.get_threshold()


def slow_agent(latency_s: float, turns: int):
    """Looks the item up `turns - 1` times, then answers; sleeps `latency_s` per call."""

    async def step(messages, tools):
        await asyncio.sleep(latency_s)
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done < turns - 1:
            return {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}
        return "The drill costs $89.00."

    return step


def judge(messages, schema):
    return {"verdict": "done", "quote": "The drill costs", "reason": "answers"}


async def overhead(latency_s: float, turns: int, repeats: int) -> dict:
    scripted.register("bare", [slow_agent(latency_s, turns)] * (turns * repeats))
    model = chat_model("scripted:bare", role="agent")
    start = time.perf_counter()
    for _ in range(turns * repeats):
        await model.complete([HumanMessage("What does the drill cost?")])
    bare = (time.perf_counter() - start) / (turns * repeats)
    scripted.register("agent", [slow_agent(latency_s, turns)] * (turns * repeats))
    ctx = Context(agent_model="scripted:agent", catalog=str(FIXTURES))
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        out = await run_episode(EpisodeRequest(pair_id=PAIR, side="act", bundle="H0"), ctx, f"bench-{i}")
        times.append((time.perf_counter() - start) / out["turns"])
    per_turn = sorted(times)[len(times) // 2]
    return {"bare_call_ms": bare * 1e3, "runtime_turn_ms": per_turn * 1e3, "overhead_pct": 100 * (per_turn - bare) / bare}


async def throughput(concurrency: int, latency_s: float, turns: int, waves: int, tmp: Path) -> dict:
    episodes = concurrency * waves
    scripted.register("agent", [slow_agent(latency_s, turns)] * (episodes * turns))
    scripted.register("judge", [judge] * episodes)
    ctx = Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES),
                  ledger=str(tmp / f"ledger-{concurrency}-{waves}-{gc.get_freeze_count()}.db"))  # no reuse between runs
    start, cpu = time.perf_counter(), time.process_time()
    # both sides of the pair, so trials × 2 = episodes
    metrics = (await api.evaluate("H0", [PAIR], ctx, trials=episodes // 2, concurrency=concurrency)).metrics
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    if not metrics.complete:
        raise SystemExit(f"concurrency {concurrency}: only {metrics.finished}/{metrics.planned} episodes finished "
                         "without an infrastructure error; the benchmark measures only clean runs")
    ideal = concurrency / (turns * latency_s)
    actual = metrics.finished / wall
    return {"concurrency": concurrency, "gc": "tuned" if gc.get_freeze_count() else "default", "episodes": metrics.finished, "wall_s": wall, "eps_per_s": actual,
            "ideal_eps_per_s": ideal, "of_ideal_pct": 100 * actual / ideal, "cpu_ms_per_episode": 1e3 * cpu / metrics.finished}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--waves", type=int, default=4, help="episodes per run = concurrency × waves")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 64])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HERA_RUNS"] = tmp
        result = {"overhead": asyncio.run(overhead(latency, args.turns, args.repeats)), "throughput": []}
        asyncio.run(throughput(2, latency, args.turns, 1, Path(tmp)))  # warm-up: the bundle check, loads and imports happen once
        for c in args.concurrency:
            for tuned in (False, True):
                gc.unfreeze()
                gc.set_threshold(*DEFAULT_GC)
                if tuned:
                    api.tune_gc()
                result["throughput"].append(asyncio.run(throughput(c, latency, args.turns, args.waves, Path(tmp))))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    o = result["overhead"]
    console = Console()
    console.print(f"per turn: bare model call {o['bare_call_ms']:.1f} ms, runtime turn {o['runtime_turn_ms']:.1f} ms "
                  f"→ overhead {o['overhead_pct']:.2f}% (goal < 2%)")
    table = Table(title=f"episodes/s, {args.turns} turns × {args.latency_ms:.0f} ms model latency")
    for col in ("concurrency", "gc", "episodes", "wall s", "episodes/s", "ideal", "% of ideal", "CPU ms/episode"):
        table.add_column(col, justify="right")
    for t in result["throughput"]:
        table.add_row(str(t["concurrency"]), t["gc"], str(t["episodes"]), f"{t['wall_s']:.1f}", f"{t['eps_per_s']:.2f}",
                      f"{t['ideal_eps_per_s']:.2f}", f"{t['of_ideal_pct']:.1f}", f"{t['cpu_ms_per_episode']:.1f}")
    console.print(table)


if __name__ == "__main__":
    main()
