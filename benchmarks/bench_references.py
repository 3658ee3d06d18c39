"""Every component of the library over the catalog's reference solutions, without a model.

For each pair outside the bench (the bench is for judging, not for design), the reference calls are replayed on both
sides and given the reference answer, and each component, with its default parameters, is asked whether it would
have stepped in (`harness.components.stepped_in`: blocked or held back a call, shown a result otherwise, or sent the
answer back). On the feasible side that is a right episode it touches: a block or a send-back there costs a finished
task. On the twin it is what it does to an agent that goes on as if nothing had changed, the failure a harness taught
to act makes next. A pair is told apart when it steps into the twin and not the feasible side. Components whose
choice turns on a model's answer or a lookup are counted as undecided. Harness evolution shows the panel the same
replay over its training pool (`roles.failure_analyst.reference_steps`).

    python benchmarks/bench_references.py [--catalog DIR] [--split train|validation|bench] [--component NAME] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from envs.catalog import load_catalog
from harness.components import LIBRARY
from roles.failure_analyst import reference_steps
from state.paths import CATALOG


async def measure(catalog: Path, splits: set[str]) -> dict:
    counts: dict[str, Counter] = {name: Counter() for name in LIBRARY}
    pairs: dict[str, dict[str, list[str]]] = {name: {"feasible": [], "twin": []} for name in LIBRARY}
    total, tools = 0, {}
    for pair_id, entry in sorted(load_catalog(catalog).items()):
        if entry.pair.split not in splits:
            continue
        total += 1
        for name, sides in (await reference_steps(entry, tools)).items():
            for side, label in (("act", "feasible"), ("abstain", "twin")):
                value = sides[side]
                counts[name][label if value else f"{label} undecided" if value is None else "-"] += 1
                if value:
                    pairs[name][label].append(pair_id)
            counts[name]["told apart"] += sides["abstain"] is True and sides["act"] is False
    return {"catalog": str(catalog), "splits": sorted(splits), "pairs": total,
            "components": {name: {"feasible": c["feasible"], "twin": c["twin"], "told_apart": c["told apart"],
                                  "undecided": c["feasible undecided"] + c["twin undecided"], "stepped_into": pairs[name]}
                           for name, c in counts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default=str(CATALOG))
    parser.add_argument("--split", action="append", choices=["train", "validation", "bench"],
                        help="the pairs' split, repeatable (default: train and validation)")
    parser.add_argument("--component", choices=list(LIBRARY), help="also list the pairs this component steps into")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(Path(args.catalog), set(args.split or ["train", "validation"])))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    n = result["pairs"]
    table = Table(title=f"components stepping into the reference solutions of {n} pairs ({', '.join(result['splits'])})")
    table.add_column("component", no_wrap=True)
    for column in ("feasible side", "twin", "told apart", "undecided"):
        table.add_column(column, justify="right")
    for name, row in result["components"].items():
        table.add_row(name, f"{row['feasible']}/{n}", f"{row['twin']}/{n}", f"{row['told_apart']}/{n}", str(row["undecided"]))
    console = Console()
    console.print(table)
    if args.component:
        for label, ids in result["components"][args.component]["stepped_into"].items():
            console.print(f"{args.component} steps into the {label} side of: {', '.join(ids) or 'none'}", highlight=False)


if __name__ == "__main__":
    main()
