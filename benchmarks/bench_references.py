"""Every component of the library over the catalog's reference solutions, without a model.

For each pair outside the bench (the bench is for judging, not for design), the reference calls are replayed on both
sides and given the reference answer, and each component, with its default parameters, is asked whether it would
have stepped in (`harness.components.stepped_in`: blocked or held back a call, shown a result otherwise, or sent the
answer back). On the feasible side that is a right episode it touches: a block or a send-back there costs a finished
task. On the twin it is what it does to an agent that goes on as if nothing had changed, the failure a harness taught
to act makes next. A pair is told apart when it steps into the twin and not the feasible side. Components whose
choice turns on a model's answer or a lookup are counted as undecided.

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

from envs.catalog import entry_context, load_catalog, side_env
from envs.certify import replay
from envs.spec import tool_infos
from harness.abi import EpisodeView
from harness.bundle import HarnessConfig
from harness.components import LIBRARY, stepped_in
from state.paths import CATALOG


async def measure(catalog: Path, splits: set[str]) -> dict:
    counts: dict[str, Counter] = {name: Counter() for name in LIBRARY}
    pairs: dict[str, dict[str, list[str]]] = {name: {"feasible": [], "twin": []} for name in LIBRARY}
    total = 0
    for pair_id, entry in sorted(load_catalog(catalog).items()):
        if entry.pair.split not in splits:
            continue
        total += 1
        task = entry.pair.task
        stepped: dict[str, dict[str, bool | None]] = {name: {} for name in LIBRARY}
        for side, label in (("act", "feasible"), ("abstain", "twin")):
            env = side_env(entry, side)
            observations = list(replay(env, task.reference.calls, task.reference.answer).calls)
            tools = list(tool_infos(env).values())
            for name, cls in LIBRARY.items():
                view = EpisodeView(instruction=task.instruction.strip(), context=entry_context(entry), tools=tools,
                                   config=HarnessConfig(), prompts={}, skills={})
                stepped[name][label] = await stepped_in(cls(), view, observations, task.reference.answer)
        for name, sides in stepped.items():
            for label, value in sides.items():
                counts[name][label if value else f"{label} undecided" if value is None else "-"] += 1
                if value:
                    pairs[name][label].append(pair_id)
            counts[name]["told apart"] += sides["twin"] is True and sides["feasible"] is False
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
