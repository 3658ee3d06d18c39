"""Local model: the share of prompt tokens served from llama.cpp's prefix cache.

Reads the agent's per-call usage of every episode of a run (default: the
latest run in the ledger) and reports, per episode and overall, cached /
input prompt tokens, and the same for the calls after an episode's first
(the first call of an episode shares only the system prompt with the last
episode).

    python benchmarks/bench_cache.py [--ledger runs/hera.db] [--run RUN] [--json]
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from state.ledger import Ledger


def share(usage) -> tuple[int, int]:
    agent = [u for u in usage if u.role == "agent"]
    return sum(u.cached_tokens for u in agent), sum(u.input_tokens for u in agent)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger")
    parser.add_argument("--run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ledger = Ledger(args.ledger)
    run_id = args.run or ledger.runs()[0]["id"]
    rows = []
    for e in ledger.episodes(run_id):
        agent = [u for u in e.usage if u.role == "agent"]
        later = agent[1:]
        rows.append({"episode": e.key.id, "pair": e.pair_id, "side": e.key.side, "calls": len(agent),
                     "input": sum(u.input_tokens for u in agent), "cached": sum(u.cached_tokens for u in agent),
                     "later_input": sum(u.input_tokens for u in later), "later_cached": sum(u.cached_tokens for u in later)})
    total = {k: sum(r[k] for r in rows) for k in ("input", "cached", "later_input", "later_cached")}
    result = {"run": run_id, "episodes": rows, **total,
              "cached_share": total["cached"] / total["input"] if total["input"] else None,
              "later_cached_share": total["later_cached"] / total["later_input"] if total["later_input"] else None}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    table = Table(title=f"prefix cache, run {run_id}")
    for col in ("pair", "side", "agent calls", "prompt tokens", "cached", "share", "share after 1st call"):
        table.add_column(col, justify="right" if col not in ("pair", "side") else "left")
    for r in rows:
        table.add_row(r["pair"], r["side"], str(r["calls"]), str(r["input"]), str(r["cached"]),
                      f"{r['cached'] / r['input']:.0%}" if r["input"] else "—",
                      f"{r['later_cached'] / r['later_input']:.0%}" if r["later_input"] else "—")
    table.add_section()
    table.add_row("all", "", "", str(total["input"]), str(total["cached"]),
                  f"{result['cached_share']:.0%}" if result["cached_share"] is not None else "—",
                  f"{result['later_cached_share']:.0%}" if result["later_cached_share"] is not None else "—")
    Console().print(table)


if __name__ == "__main__":
    main()
