"""Environment runtime benchmark: tool-call latency direct vs MCP, and episode setup.

For each sampled pair, the reference calls are replayed (1) in process on an
`EnvInstance` and (2) through an MCP stdio server, one server process per
episode as the episode graph uses it. Reported side by side in one run:
per-call latency (median and p95), MCP/direct ratio, and per-episode setup
time (cold template build, warm copy, MCP server start + initialize).

    python benchmarks/bench_envs.py [--episodes 5] [--pairs 6] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from rich.console import Console
from rich.table import Table

from envs import runtime
from envs.catalog import load_catalog
from envs.mcp_server import connection
from envs.runtime import EnvInstance


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def direct(entry, episodes: int) -> tuple[list[float], list[float], float]:
    runtime._templates.clear()
    start = time.perf_counter()
    EnvInstance(entry.env).close()
    cold = time.perf_counter() - start
    calls, setups = [], []
    for _ in range(episodes):
        start = time.perf_counter()
        instance = EnvInstance(entry.env)
        setups.append(time.perf_counter() - start)
        for call in entry.pair.task.reference.calls:
            start = time.perf_counter()
            instance.call(call.tool, call.args)
            calls.append(time.perf_counter() - start)
        instance.close()
    return calls, setups, cold


async def over_mcp(pair_id: str, entry, episodes: int) -> tuple[list[float], list[float]]:
    conn = connection(pair_id, "act")
    params = StdioServerParameters(command=conn["command"], args=conn["args"], cwd=conn["cwd"])
    calls, setups = [], []
    for _ in range(episodes):
        start = time.perf_counter()
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            setups.append(time.perf_counter() - start)
            for call in entry.pair.task.reference.calls:
                start = time.perf_counter()
                await session.call_tool(call.tool, call.args)
                calls.append(time.perf_counter() - start)
    return calls, setups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=6, help="pairs sampled, one per theme first")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    catalog = load_catalog()
    by_theme: dict[str, str] = {}
    for pair_id, entry in catalog.items():
        by_theme.setdefault(entry.env.theme, pair_id)
    chosen = list(by_theme.values())[: args.pairs]
    d_calls, d_setup, cold, m_calls, m_setup = [], [], [], [], []
    for pair_id in chosen:
        entry = catalog[pair_id]
        c, s, k = direct(entry, args.episodes)
        d_calls += c
        d_setup += s
        cold.append(k)
        c, s = asyncio.run(over_mcp(pair_id, entry, args.episodes))
        m_calls += c
        m_setup += s
    ms = 1000.0
    result = {
        "pairs": chosen,
        "episodes_per_pair": args.episodes,
        "tool_calls": {"direct": len(d_calls), "mcp": len(m_calls)},
        "call_ms": {
            "direct_median": statistics.median(d_calls) * ms, "direct_p95": pct(d_calls, 0.95) * ms,
            "mcp_median": statistics.median(m_calls) * ms, "mcp_p95": pct(m_calls, 0.95) * ms,
        },
        "setup_ms": {
            "cold_template_median": statistics.median(cold) * ms,
            "warm_copy_median": statistics.median(d_setup) * ms,
            "mcp_start_median": statistics.median(m_setup) * ms,
        },
    }
    result["mcp_over_direct_call"] = result["call_ms"]["mcp_median"] / result["call_ms"]["direct_median"]
    result["mcp_start_over_warm_setup"] = result["setup_ms"]["mcp_start_median"] / result["setup_ms"]["warm_copy_median"]
    if args.json:
        print(json.dumps(result, indent=1))
        return
    table = Table(title=f"{len(chosen)} pairs × {args.episodes} episodes, {len(d_calls)} tool calls per path")
    table.add_column("measure")
    table.add_column("direct", justify="right")
    table.add_column("MCP stdio", justify="right")
    table.add_column("MCP / direct", justify="right")
    c = result["call_ms"]
    table.add_row("tool call, median ms", f"{c['direct_median']:.3f}", f"{c['mcp_median']:.3f}", f"{result['mcp_over_direct_call']:.1f}×")
    table.add_row("tool call, p95 ms", f"{c['direct_p95']:.3f}", f"{c['mcp_p95']:.3f}", f"{c['mcp_p95'] / c['direct_p95']:.1f}×")
    s = result["setup_ms"]
    table.add_row("episode setup, median ms", f"{s['warm_copy_median']:.3f} (cold {s['cold_template_median']:.1f})",
                  f"{s['mcp_start_median']:.1f}", f"{result['mcp_start_over_warm_setup']:.0f}×")
    Console().print(table)


if __name__ == "__main__":
    main()
