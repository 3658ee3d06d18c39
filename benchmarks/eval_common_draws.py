"""Common random numbers on a real model: do two harnesses that differ in one sentence run an episode alike more often
when the agent's sampling is seeded (`EpisodeRequest.sampling_seed`) than when every call draws afresh?

Harness A is H0; harness B is H0 with one sentence added to the end of its system prompt (a change of the size of an
evolved harness's prompt addition, which leaves the agent's task as it was). Both run the same pairs, both sides, one
trial, twice: `seeded` (the project's sampling) and `unseeded` (the seed withheld from every call, as before seeding),
each mode in a scratch ledger of its own so that nothing is reused across modes. For each mode, over the episodes
(pair × side): how many ran alike (the same tool calls with the same arguments, in order, and the same answer), how
many made the same first call, and how many ended with the same outcome (done or not, as the grader scored it). Where
the outcomes differ but the sentence changed nothing the agent did, the paired difference of the two harnesses is
noise: that is what seeding is for. Each agent turn is sampled at the model's own settings (the embedded model: 0.7).

    python benchmarks/eval_common_draws.py [--pairs 4] [--model local] [--max-turns 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envs.catalog import split_pairs  # noqa: E402
from graphs import api  # noqa: E402
from harness.bundle import BUNDLES  # noqa: E402
from state.context import Context, EpisodeRequest  # noqa: E402
from state.ledger import Ledger  # noqa: E402
from state.records import EpisodeRecord  # noqa: E402

SENTENCE = "Read the tool results before you answer."
MODES = ("seeded", "unseeded")


def harness_b(into: Path) -> Path:
    bundle = into / "H0-one-sentence"
    shutil.copytree(BUNDLES / "H0", bundle)
    system = bundle / "prompts" / "system.md"
    system.write_text(system.read_text().rstrip("\n") + f"\n\n{SENTENCE}\n")
    (bundle / "manifest.yaml").write_text("id: H0-one-sentence\nparent_id: H0\norigin: benchmark\n"
                                          f"description: H0 with one sentence added ({SENTENCE})\n")
    return bundle


def calls(record: EpisodeRecord) -> list[tuple[str, str]]:
    return [(o.tool, json.dumps(o.args, sort_keys=True)) for o in record.observations if o.source != "harness"]


def compare(a: list[EpisodeRecord], b: list[EpisodeRecord]) -> dict:
    """Per (pair, side) of A and B: alike, same first call, same outcome; and the episodes that were compared."""
    by_b = {(r.pair_id, r.key.side): r for r in b}
    rows = []
    for ra in a:
        rb = by_b.get((ra.pair_id, ra.key.side))
        if rb is None or ra.status != "done" or rb.status != "done":
            continue
        ca, cb = calls(ra), calls(rb)
        rows.append({"pair": ra.pair_id, "side": ra.key.side, "alike": ca == cb and ra.answer == rb.answer,
                     "same_first_call": ca[:1] == cb[:1], "same_outcome": ra.grade.success == rb.grade.success,
                     "calls": [len(ca), len(cb)], "success": [ra.grade.success, rb.grade.success]})
    return {"episodes": len(rows), "alike": sum(r["alike"] for r in rows), "same_first_call": sum(r["same_first_call"] for r in rows),
            "same_outcome": sum(r["same_outcome"] for r in rows), "rows": rows}


async def run_mode(mode: str, pairs: list[str], bundles: dict[str, str], context: Context) -> dict:
    records = {}
    withheld = mock.patch.object(EpisodeRequest, "sampling_seed", lambda self, turn: None) if mode == "unseeded" else nullcontext()
    with withheld:
        for name, bundle in bundles.items():
            run = await api.evaluate(bundle, pairs, context, run_id=f"draws-{mode}-{name}")
            records[name] = Ledger(context.ledger).episodes(run.run_id)
    return compare(records["A"], records["B"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="validation pairs of the short tier, both sides each")
    parser.add_argument("--model", default="local")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--out", help="keep the scratch ledgers here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="eval-draws-"))
    out.mkdir(parents=True, exist_ok=True)
    pairs = split_pairs("validation", tier="short")[: args.pairs]
    bundles = {"A": "H0", "B": str(harness_b(out))}
    results = {}
    for mode in MODES:
        context = Context(agent_model=args.model, judge_model=args.model, max_turns=args.max_turns, ledger=str(out / f"{mode}.db"))
        results[mode] = asyncio.run(run_mode(mode, pairs, bundles, context))
    if args.json:
        print(json.dumps({"pairs": pairs, "sentence": SENTENCE, **results}, indent=1))
        return
    table = Table(title=f"H0 and H0 + one sentence on {len(pairs)} pairs × 2 sides ({args.model}, ≤ {args.max_turns} turns)")
    for column in ("sampling", "episodes", "alike (calls and answer)", "same first call", "same outcome"):
        table.add_column(column)
    for mode, r in results.items():
        table.add_row(mode, str(r["episodes"]), str(r["alike"]), str(r["same_first_call"]), str(r["same_outcome"]))
    Console().print(table)
    print(f"scratch ledgers: {out}")


if __name__ == "__main__":
    main()
