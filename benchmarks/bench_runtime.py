"""Harness runtime benchmark, measured side by side in one run.

1. Overhead per turn: an episode whose scripted model sleeps a set latency
   per call (default 200 ms) and calls one tool per turn, against the same
   number of bare model calls. Goal: under 2%.
2. Throughput: episodes per second through the evaluate graph at
   concurrency 1, 8, 32 and 64, against the ideal (concurrency / episode
   time at zero overhead). Goal: at least 90% of ideal at 64. Each level runs
   twice, with Python's default garbage collector settings and with the
   tuning `hera eval` applies (`graphs.api.tune_gc`).
3. Against bare LangGraph: the same episodes (the same scripted model object,
   `roles.models.scripted`, with the same latency, turns and tool
   descriptions; the same tool code on a fresh SQLite state per episode)
   through a two-node LangGraph agent (a model node and the prebuilt
   `ToolNode`) with the tool in process, at each concurrency: CPU per episode
   and share of ideal, ours (the evaluate graph: call journal, ledger,
   grading, judge) beside it.
   Goal: our CPU per episode at most 2× bare LangGraph's.
4. On the engine (`--engine local:N`): episodes/s with 1, 2 and 4 worker
   processes against the same evaluation in one process, with a scripted
   model of near-zero latency (default 0 ms) so that the harness itself is
   the bottleneck and one process is CPU-bound; CPU per episode of the
   coordinator (with Dask's scheduler) and of the workers; at 16 and at 32
   attempts in flight (`--engine-concurrency`), each against one process at
   the same concurrency. Goal: 2 workers at least 1.7× one process.

The machine's load average before and after the run is printed with the
results: a loaded machine lowers every share of ideal.

    python benchmarks/bench_runtime.py [--latency-ms 200] [--turns 5] [--engine-workers 1 2 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from rich.console import Console
from rich.table import Table

from envs.catalog import load_entry, side_env
from envs.runtime import EnvInstance
from envs.spec import tool_infos
from graphs import api, engine
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
                  ledger=str(tmp / f"ledger-{uuid.uuid4().hex}.db"))  # a ledger of its own: no episode reused between runs
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


@tool
def get_item(sku: str, config: RunnableConfig) -> dict:
    """Returns an item's name, price and stock."""
    return config["configurable"]["env"].call("get_item", {"sku": sku}).output


def bare_agent(tools: list):
    """A bare LangGraph tool-calling agent: a model node (the same scripted model as ours, `scripted:bare`, given the same
    tool descriptions) and the prebuilt ToolNode, the tool in process."""
    llm = chat_model("scripted:bare", role="agent").model  # the scripted model itself, without our call journal

    async def model(state: MessagesState) -> dict:
        return {"messages": [(await llm.complete(state["messages"], tools)).message]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([get_item]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile()


async def bare(concurrency: int, latency_s: float, turns: int, waves: int) -> dict:
    episodes = concurrency * waves
    spec = side_env(load_entry(PAIR, str(FIXTURES)), "act")
    scripted.register("bare", [slow_agent(latency_s, turns)] * (episodes * turns))
    graph, gate = bare_agent(list(tool_infos(spec).values())), asyncio.Semaphore(concurrency)

    async def episode() -> None:
        async with gate:
            env = EnvInstance(spec)  # a fresh state per episode, as ours
            try:
                out = await graph.ainvoke({"messages": [HumanMessage("What does the drill cost?")]}, {"configurable": {"env": env}})
            finally:
                env.close()
            assert out["messages"][-1].content.startswith("The drill costs")

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(episode() for _ in range(episodes)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    ideal = concurrency / (turns * latency_s)
    return {"concurrency": concurrency, "episodes": episodes, "wall_s": wall, "eps_per_s": episodes / wall,
            "of_ideal_pct": 100 * episodes / wall / ideal, "cpu_ms_per_episode": 1e3 * cpu / episodes}


def import_the_stack() -> None:
    """Run in every worker before the clock starts: what the first episode there would otherwise import."""
    import graphs.runner  # noqa: F401


async def on_engine(workers: int | None, latency_s: float, turns: int, episodes: int, concurrency: int, tmp: Path) -> dict:
    """Episodes/s of one evaluation in this process (`workers` None) or on a LocalCluster of `workers` processes
    (started, and every worker warmed up, before the clock starts); CPU of this process and of the workers."""
    where = f"local:{workers}" if workers else None
    steps = {"agent": [slow_agent(latency_s, turns)] * (episodes * turns), "judge": [judge] * episodes}
    for name, script in steps.items():
        scripted.register(name, script)
    ctx = Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES), engine=where,
                  ledger=str(tmp / f"ledger-engine-{uuid.uuid4().hex}.db"))
    dask = None
    if where:
        dask = await asyncio.to_thread(engine.client, where)
        await asyncio.to_thread(dask.register_plugin, scripted.worker_plugin(**steps))
        await asyncio.to_thread(dask.run, import_the_stack)
        warm = Context(**{**ctx.__dict__, "ledger": str(tmp / f"ledger-engine-{uuid.uuid4().hex}.db")})
        await api.evaluate("H0", [PAIR], warm, trials=workers, concurrency=concurrency)
        await asyncio.to_thread(dask.register_plugin, scripted.worker_plugin(**steps))  # fresh scripts for the measured run
    before = await asyncio.to_thread(dask.run, time.process_time) if dask else {}
    start, cpu = time.perf_counter(), time.process_time()
    metrics = (await api.evaluate("H0", [PAIR], ctx, trials=episodes // 2, concurrency=concurrency)).metrics
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    after = await asyncio.to_thread(dask.run, time.process_time) if dask else {}
    worker_cpu = sum(t - before.get(w, 0.0) for w, t in after.items())
    if not metrics.complete:
        raise SystemExit(f"engine {where}: only {metrics.finished}/{metrics.planned} episodes finished without an infrastructure error")
    return {"engine": where or "in process", "workers": workers or 0, "concurrency": concurrency, "episodes": metrics.finished, "wall_s": wall,
            "eps_per_s": metrics.finished / wall, "coordinator_cpu_ms_per_episode": 1e3 * cpu / metrics.finished,
            "workers_cpu_ms_per_episode": 1e3 * worker_cpu / metrics.finished}


def medians(runs: list[dict], *by: str) -> list[dict]:
    """One row per value of the fields `by`, in the order first run: each measured number the median over the rounds."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(tuple(r[k] for k in by), []).append(r)
    return [{**rs[0], **{k: statistics.median(x[k] for x in rs) for k, v in rs[0].items() if isinstance(v, float)}} for rs in groups.values()]


def summary(result: dict) -> dict:
    """Ours beside bare at each concurrency, and each engine run beside one process: the ratio of the two runs of one
    round (made minutes apart at most), its median and range over the rounds."""
    ours = {(t["round"], t["concurrency"]): t for t in result["throughput"] if t["gc"] == "tuned"}
    beside = []
    for b in medians(result["bare"], "concurrency"):
        rounds = [r for r in result["bare"] if r["concurrency"] == b["concurrency"]]
        ratios = [ours[r["round"], r["concurrency"]]["cpu_ms_per_episode"] / r["cpu_ms_per_episode"] for r in rounds]
        mine = [ours[r["round"], r["concurrency"]] for r in rounds]
        beside.append({"concurrency": b["concurrency"], "ours_cpu_ms": statistics.median(t["cpu_ms_per_episode"] for t in mine),
                       "bare_cpu_ms": b["cpu_ms_per_episode"], "ratio": statistics.median(ratios), "ratios": ratios,
                       "ours_of_ideal_pct": statistics.median(t["of_ideal_pct"] for t in mine), "bare_of_ideal_pct": b["of_ideal_pct"]})
    one = {(r["round"], r["concurrency"]): r for r in result["engine"] if not r["workers"]}
    engine_rows = []
    for e in medians(result["engine"], "concurrency", "engine"):
        speedups = [r["eps_per_s"] / one[r["round"], r["concurrency"]]["eps_per_s"] for r in result["engine"]
                    if (r["engine"], r["concurrency"]) == (e["engine"], e["concurrency"])]
        engine_rows.append({**e, "speedup": statistics.median(speedups), "speedups": speedups})
    return {"beside_bare": beside, "engine": engine_rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, default=200)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--waves", type=int, default=4, help="episodes per run = concurrency × waves")
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 8, 32, 64])
    parser.add_argument("--engine-workers", type=int, nargs="*", default=[1, 2, 4], help="worker processes of each engine run")
    parser.add_argument("--engine-latency-ms", type=float, default=0, help="the scripted model's latency on the engine")
    parser.add_argument("--engine-episodes", type=int, default=512, help="episodes of each engine run (a run of a few seconds: shorter ones are mostly start-up noise)")
    parser.add_argument("--engine-concurrency", type=int, nargs="*", default=[16, 32],
                        help="attempts in flight, on the engine and in one process alike, each a run of its own: a task carries "
                             "an even share of them for each worker process (at most 16): at 16 on 2 workers, 8")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measurement (medians reported): CPU figures move by "
                                                                "a third from run to run on a shared 2-core machine")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HERA_RUNS"] = tmp
        result = {"overhead": asyncio.run(overhead(latency, args.turns, args.repeats)), "throughput": [], "bare": [], "engine": []}
        asyncio.run(throughput(2, latency, args.turns, 1, Path(tmp)))  # warm-up: the bundle check, loads and imports happen once
        asyncio.run(bare(2, latency, args.turns, 1))
        for round_ in range(args.rounds):  # ours and bare side by side at each level, every round: the machine drifts between rounds
            for c in args.concurrency:
                for tuned in (False, True):
                    gc.unfreeze()
                    gc.set_threshold(*DEFAULT_GC)
                    if tuned:
                        api.tune_gc()
                    result["throughput"].append({**asyncio.run(throughput(c, latency, args.turns, args.waves, Path(tmp))), "round": round_})
                result["bare"].append({**asyncio.run(bare(c, latency, args.turns, args.waves)), "round": round_})
            for concurrency in args.engine_concurrency:
                for workers in [None, *args.engine_workers]:  # gc tuned, as `hera eval` runs
                    result["engine"].append({**asyncio.run(on_engine(workers, args.engine_latency_ms / 1000, args.turns, args.engine_episodes,
                                                                     concurrency, Path(tmp))), "round": round_})
                    engine.close()
    result["load_average"] = {"before": load_before, "after": os.getloadavg(), "cpus": os.cpu_count()}
    result["summary"] = summary(result)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    o, sums = result["overhead"], result["summary"]
    console = Console()
    console.print(f"per turn: bare model call {o['bare_call_ms']:.1f} ms, runtime turn {o['runtime_turn_ms']:.1f} ms "
                  f"→ overhead {o['overhead_pct']:.2f}% (goal < 2%)")
    table = Table(title=f"episodes/s, {args.turns} turns × {args.latency_ms:.0f} ms model latency (medians of {args.rounds} rounds)")
    for col in ("concurrency", "gc", "episodes", "wall s", "episodes/s", "ideal", "% of ideal", "CPU ms/episode"):
        table.add_column(col, justify="right")
    for t in medians(result["throughput"], "concurrency", "gc"):
        table.add_row(str(t["concurrency"]), t["gc"], str(t["episodes"]), f"{t['wall_s']:.1f}", f"{t['eps_per_s']:.2f}",
                      f"{t['ideal_eps_per_s']:.2f}", f"{t['of_ideal_pct']:.1f}", f"{t['cpu_ms_per_episode']:.1f}")
    console.print(table)
    side = Table(title="ours (evaluate graph, gc tuned) beside bare LangGraph (model node + prebuilt ToolNode, tool in process): "
                       f"medians of {args.rounds} rounds, the ratio's range over the rounds")
    for col in ("concurrency", "ours CPU ms/episode", "bare CPU ms/episode", "ratio (goal ≤ 2)", "ratio range", "ours % of ideal", "bare % of ideal"):
        side.add_column(col, justify="right")
    for row in sums["beside_bare"]:
        side.add_row(str(row["concurrency"]), f"{row['ours_cpu_ms']:.1f}", f"{row['bare_cpu_ms']:.1f}", f"{row['ratio']:.2f}×",
                     f"{min(row['ratios']):.2f}–{max(row['ratios']):.2f}×", f"{row['ours_of_ideal_pct']:.1f}", f"{row['bare_of_ideal_pct']:.1f}")
    console.print(side)
    scaling = Table(title=f"on the engine: {args.engine_episodes} episodes, {args.turns} turns × {args.engine_latency_ms:.0f} ms model "
                          f"latency, medians of {args.rounds} rounds (goal: 2 workers ≥ 1.7× one process at the same concurrency)")
    for col in ("concurrency", "where", "episodes/s", "× one process", "range", "coordinator CPU ms/episode", "workers CPU ms/episode"):
        scaling.add_column(col, justify="right")
    for row in sums["engine"]:
        scaling.add_row(str(row["concurrency"]), row["engine"], f"{row['eps_per_s']:.2f}", f"{row['speedup']:.2f}×", f"{min(row['speedups']):.2f}–{max(row['speedups']):.2f}×",
                        f"{row['coordinator_cpu_ms_per_episode']:.1f}", f"{row['workers_cpu_ms_per_episode']:.1f}")
    console.print(scaling)
    load = result["load_average"]
    console.print(f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load['before'])}, after "
                  f"{tuple(round(x, 2) for x in load['after'])} on {load['cpus']} CPUs")


if __name__ == "__main__":
    main()
