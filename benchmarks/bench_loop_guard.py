"""What the loop guard (`roles.models.openai.loop_cut`) would have cut from recorded agent replies, without a model.

For every agent reply of a ledger's episodes (each once, however many runs reused it), the guard is replayed as the stream sees it (a look every `LOOP_CHECK_CHARS`
characters): whether it cuts, how many characters it cuts, and the seconds the reply took by the ledger. Estimated
seconds saved is each cut reply's recorded latency times its share of characters cut (generation dominates a long
reply's latency; the shorter prompts of the turns after a cut are not counted). The ledger keeps a reply's text
without its tool calls, so the guard sees somewhat less text here than in the stream. The guard's own cost is
measured in the same run: its total check time against the replies' recorded seconds.

    python benchmarks/bench_loop_guard.py [--ledger runs/hera.db] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from roles.models.openai import LOOP_CHECK_CHARS, loop_cut
from roles.models.tool_calls import text_of
from state.ledger import Ledger
from state.paths import RunPaths


def replay(text: str) -> int | None:
    """Where the guard would have cut `text`, looking as the stream does; None when it would not."""
    for seen in range(LOOP_CHECK_CHARS, len(text) + 1, LOOP_CHECK_CHARS):
        if (end := loop_cut(text[:seen])) is not None:
            return end
    return None


def measure(ledger: Path) -> dict:
    totals = {"replies": 0, "characters": 0, "seconds": 0.0, "cut": 0, "characters_cut": 0, "seconds_saved": 0.0,
              "check_seconds": 0.0}
    episodes, examples = set(), []
    for record in Ledger(ledger).episodes():
        replies = [text_of(m.get("data", {}).get("content") or "") for m in record.messages if m.get("type") == "ai"]
        latencies = [u.latency_s for u in record.usage if u.role == "agent"]
        if len(latencies) != len(replies):  # a turn without a reply (an infrastructure error): no latency to pair
            latencies = [0.0] * len(replies)
        for text, latency in zip(replies, latencies):
            started = time.perf_counter()
            end = replay(text)
            totals["check_seconds"] += time.perf_counter() - started
            totals["replies"] += 1
            totals["characters"] += len(text)
            totals["seconds"] += latency
            if end is None:
                continue
            totals["cut"] += 1
            totals["characters_cut"] += len(text) - end
            totals["seconds_saved"] += latency * (len(text) - end) / len(text)
            episodes.add(record.key.id)
            if len(examples) < 5:
                examples.append({"pair": record.pair_id, "side": record.key.side, "length": len(text),
                                 "kept": end, "passage": text[max(0, end - 80):end]})
    return {"ledger": str(ledger), **totals, "episodes_cut": len(episodes), "examples": examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", default=str(RunPaths.here().ledger), help="ledger file (default: the runs directory's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not Path(args.ledger).is_file():
        parser.error(f"no ledger at {args.ledger}")
    r = measure(Path(args.ledger))
    if args.json:
        print(json.dumps(r, indent=1))
        return
    table = Table(title=f"the loop guard replayed over {r['replies']} agent replies of {r['ledger']}")
    for column in ("", "replies", "characters", "seconds (ledger)"):
        table.add_column(column)
    table.add_row("all", str(r["replies"]), f"{r['characters']:,}", f"{r['seconds']:,.0f}")
    table.add_row(f"cut ({r['episodes_cut']} episodes)", str(r["cut"]), f"{r['characters_cut']:,} cut",
                  f"{r['seconds_saved']:,.0f} saved (estimated)")
    table.add_row("the guard's checks", "", "", f"{r['check_seconds']:.2f} "
                  f"({r['check_seconds'] / max(r['seconds'], 1e-9):.1e} of the replies' seconds)")
    Console().print(table)
    for e in r["examples"]:
        Console().print(f"{e['pair']}/{e['side']}: kept {e['kept']} of {e['length']}, "
                        f"ending …{e['passage']!r}", markup=False, highlight=False)


if __name__ == "__main__":
    main()
