"""Local model: does an episode keep the agent's cached prompt prefix? Before and after, side by side in one run.

`before`: one server slot shared by every role, pairs in the order the splits
list them (themes alternate), so the judge's call after each episode and the
next theme's prompt evict the agent's prefix. `after`: the agent's own slot
(HERA_LOCAL_SLOTS=2) and the evaluation's order (one environment's episodes
back to back). Each configuration runs H0 on the same pairs, both sides, in
a child process with its own server and runs directory; the agent's replies
are capped at 32 tokens (`--max-tokens`), so that a call's latency is its
prompt's processing and not a long reply's generation (about 10 tokens a
second). Reported per configuration, over the episodes after the first of
their environment: the latency of an episode's first model call and the
share of the agent's prompt tokens served from the cache (goals: ≤ 10 s and
≥ 95%).

    python benchmarks/bench_cache.py [--pairs P ...] [--max-turns 2] [--max-tokens 32] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Two environments × two pairs of the validation split, short tier first: short episodes.
PAIRS = ["hr-leave-balance-missing", "courses-grace-lopez-schedule-ambiguous", "hr-salary-letter-payroll-stale",
         "courses-busn-mgmt-advising-revoked"]
CONFIGS = {"before": "1", "after": "2"}


def child(config: str, pairs: list[str], max_turns: int, max_tokens: int, runs: Path) -> None:
    """One configuration: `before` evaluates pair by pair in the given order, `after` lets one evaluation order them."""
    import shutil

    from graphs import api
    from harness.bundle import BUNDLES
    from state.context import Context

    bundle = runs / "H0-capped"
    shutil.copytree(BUNDLES / "H0", bundle, dirs_exist_ok=True)
    (bundle / "config.yaml").write_text(f"max_turns: 30\nmax_output_tokens: {max_tokens}\n")
    context = Context(agent_model="local", judge_model="local", max_turns=max_turns)
    if config == "before":
        for pair in pairs:
            asyncio.run(api.evaluate(str(bundle), [pair], context, run_id=f"cache-{config}-{pair}"))
    else:
        asyncio.run(api.evaluate(str(bundle), pairs, context, run_id=f"cache-{config}"))


def measure(runs: Path) -> dict:
    """First-call latency and cached share of the agent's prompt tokens, for episodes after the first of their environment."""
    from envs.catalog import load_entry
    from state.ledger import Ledger

    ledger = Ledger(runs / "hera.db")
    attempts = sorted((a for r in ledger.runs() for a in ledger.attempts(r["id"]) if a["status"] == "done"),
                      key=lambda a: a["created_at"])
    seen_envs, rows = set(), []
    for a in attempts:
        record = ledger.episode(a["episode_id"])
        agent = [u for u in record.usage if u.role == "agent"]
        env = load_entry(record.pair_id).env.id
        rows.append({"pair": record.pair_id, "side": record.key.side, "env": env, "first_in_env": env not in seen_envs,
                     "first_call_s": agent[0].latency_s if agent else None, "calls": len(agent),
                     "input": sum(u.input_tokens for u in agent), "cached": sum(u.cached_tokens for u in agent)})
        seen_envs.add(env)
    later = [r for r in rows if not r["first_in_env"] and r["first_call_s"] is not None]
    first = sorted(r["first_call_s"] for r in later)
    total_in, total_cached = sum(r["input"] for r in later), sum(r["cached"] for r in later)
    return {"episodes": rows, "later_episodes": len(later),
            "first_call_s_median": first[len(first) // 2] if first else None,
            "first_call_s_max": first[-1] if first else None,
            "cached_share": total_cached / total_in if total_in else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", nargs="*", default=PAIRS, help="pairs in the order `before` runs them")
    parser.add_argument("--max-turns", type=int, default=2, help="agent turns per episode")
    parser.add_argument("--max-tokens", type=int, default=32, help="cap on each agent reply")
    parser.add_argument("--out", help="keep the runs directories here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.pairs, args.max_turns, args.max_tokens, Path(os.environ["HERA_RUNS"]))
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-cache-"))
    results = {}
    for config, slots in CONFIGS.items():
        runs = out / config
        runs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HERA_RUNS": str(runs), "HERA_LOCAL_SLOTS": slots}
        subprocess.run([sys.executable, __file__, "--child", config, "--max-turns", str(args.max_turns), "--max-tokens",
                        str(args.max_tokens), "--pairs", *args.pairs], env=env, check=True, cwd=ROOT)
        results[config] = measure(runs)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    table = Table(title=f"agent prompt cache: H0 (replies ≤ {args.max_tokens} tokens) on {len(args.pairs)} pairs × 2 sides, "
                        "episodes after the first of their environment")
    for col in ("configuration", "episodes", "first call (median s)", "first call (max s)", "prompt tokens from cache"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for config, r in results.items():
        table.add_row(config, str(r["later_episodes"]), f"{r['first_call_s_median']:.1f}", f"{r['first_call_s_max']:.1f}",
                      f"{r['cached_share']:.1%}")
    before, after = results["before"], results["after"]
    table.caption = (f"first-call latency after/before: {after['first_call_s_median'] / before['first_call_s_median']:.2f}; "
                     f"runs in {out}")
    Console().print(table)


if __name__ == "__main__":
    main()
