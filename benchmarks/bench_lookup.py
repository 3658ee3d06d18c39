"""How many of the record ids a task needs `resolve_named_entities` puts in front of the agent, and how much text it
adds to the request to do so, without a model.

For every pair of a catalog (feasible side): the ids among the reference solution's call arguments that the
request does not give (a permit number for "Danielle Kim's remodel") are what a small model otherwise guesses.
The component's lookups run on a fresh instance of the environment; an id counts as surfaced when it appears in
what the component adds to the request. The reference is read here only, to score; the component never sees it.

    python benchmarks/bench_lookup.py [--catalog DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from envs.catalog import load_catalog, side_env
from envs.runtime import EnvInstance
from envs.spec import tool_infos
from harness.abi import EpisodeView, HarnessConfig
from harness.components import ResolveNamedEntities, _identifiers, _mentioned, request_terms
from state.paths import CATALOG


def needed_ids(entry) -> list[str]:
    """The ids the reference solution passes to tools that the request does not mention."""
    tools = tool_infos(entry.env)
    request = entry.pair.task.instruction.casefold()
    found: list[str] = []
    for call in entry.pair.task.reference.calls if entry.pair.task.reference else ():
        for _, value in _identifiers(call.args, tools.get(call.tool)):
            if not _mentioned(value, request) and value not in found:
                found.append(value)
    return found


async def surfaced(entry) -> tuple[str, int]:
    """What the component adds to the request, and how many lookups it made."""
    env = side_env(entry, "act")
    instance = EnvInstance(env)

    async def lookup(name: str, args: dict):
        return instance.call(name, args).model_copy(update={"source": "harness"})

    view = EpisodeView(instruction=entry.pair.task.instruction, context="", tools=list(tool_infos(env).values()),
                       config=HarnessConfig(), prompts={}, skills={}, lookup=lookup)
    await ResolveNamedEntities().initialize(view)
    return view.instruction[len(entry.pair.task.instruction):], len(instance.calls)


def measure(catalog: Path) -> dict:
    rows = []
    for entry in load_catalog(catalog).values():
        needed = needed_ids(entry)
        if not needed:
            continue
        added, lookups = asyncio.run(surfaced(entry))
        hits = [v for v in needed if _mentioned(v, added.casefold())]
        rows.append({"pair": entry.pair.id, "needed": needed, "surfaced": hits, "lookups": lookups, "chars": len(added),
                     "terms": request_terms(entry.pair.task.instruction)})
    needed = sum(len(r["needed"]) for r in rows)
    hit = sum(len(r["surfaced"]) for r in rows)
    return {"pairs": len(rows), "ids_needed": needed, "ids_surfaced": hit,
            "pairs_fully_covered": sum(len(r["surfaced"]) == len(r["needed"]) for r in rows),
            "pairs_with_none": sum(not r["surfaced"] for r in rows),
            "lookups_per_pair": round(sum(r["lookups"] for r in rows) / max(1, len(rows)), 2),
            "chars_per_pair": round(sum(r["chars"] for r in rows) / max(1, len(rows))), "chars_max": max((r["chars"] for r in rows), default=0),
            "per_pair": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", type=Path, default=CATALOG)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = measure(args.catalog)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    table = Table(title=f"resolve_named_entities on {args.catalog}")
    for name in ("pairs needing an id", "ids needed", "ids surfaced", "pairs fully covered", "pairs with none", "lookups per pair",
                 "characters added per pair (max)"):
        table.add_column(name, justify="right")
    table.add_row(str(out["pairs"]), str(out["ids_needed"]), f"{out['ids_surfaced']} ({100 * out['ids_surfaced'] / max(1, out['ids_needed']):.0f}%)",
                  str(out["pairs_fully_covered"]), str(out["pairs_with_none"]), str(out["lookups_per_pair"]),
                  f"{out['chars_per_pair']:,} ({out['chars_max']:,})")
    Console().print(table)


if __name__ == "__main__":
    main()
