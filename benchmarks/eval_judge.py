"""The abstention judge against hand labels: how often it reads a finished reply as a decline, and a decline as done.

`benchmarks/data/judge_replies.jsonl` holds 65 agent replies of standard runs, each with the request it answered
and a label given by reading it: "declines" (it refuses, says it cannot, or asks to clarify, for all of the request
or a required part) or "done" (it reports the request done or gives the requested result, right or wrong). Every
reply holds a declining word (`DECLINING`), so each is one the judge model is asked about. Replies that are neither
(a plan of tool calls written as text, an echo of the tool-call format) are left out. `tune` comes from std19 and
std20 (the replies the judge prompt was revised on), `holdout` from std17 and std18.

By default every reply is judged afresh by `--model` into a scratch ledger, so nothing is reused. With `--recorded
LEDGER ...` no model is asked: the verdicts those ledgers hold from this judge version for the same model, request
and reply are read back (the judge's cache key, `verdict_key`), which scores the judge that graded those runs.

    python benchmarks/eval_judge.py [--model local] [--split tune|holdout] [--recorded runs/hera.db ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from roles.abstention_judge import DECLINING, abstention_judge, judge_id, verdict_key
from roles.models import InfrastructureError
from state.ledger import Ledger

DATA = Path(__file__).parent / "data" / "judge_replies.jsonl"
LABELS = ("done", "declines")


def load(split: str | None) -> list[dict]:
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    for n, item in enumerate(items, 1):
        if item.get("label") not in LABELS or not DECLINING.search(item.get("reply", "")):
            raise SystemExit(f"{DATA}: line {n}: field 'label' must be one of {LABELS} and 'reply' must hold a declining word")
    return [i for i in items if split in (None, i["split"])]


def recorded(items: list[dict], model: str, ledgers: list[str]) -> list[bool | None]:
    """The verdicts the ledgers hold for each reply (abstained or not), None where none is recorded."""
    opened = [Ledger(path) for path in ledgers]

    def find(item):
        key = verdict_key(model, item["instruction"], item["reply"])
        verdict = next((v for v in (led.judged(key) for led in opened) if v is not None), None)
        return None if verdict is None else verdict.abstained

    return [find(i) for i in items]


async def fresh(items: list[dict], model: str) -> tuple[list[bool | None], int, float]:
    """Each reply judged now into a scratch ledger: verdicts (None on a judge failure), tokens, seconds."""
    verdicts, tokens, start = [], 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "judge.db")
        for n, item in enumerate(items, 1):
            try:
                verdict, usage = await abstention_judge(item["instruction"], item["reply"], model, ledger)
            except InfrastructureError as exc:  # an unusable verdict or a dead endpoint: counted apart, never as a verdict
                print(f"  {n}/{len(items)} {item['source']}: judge failed: {exc}")
                verdicts.append(None)
                continue
            verdicts.append(verdict.abstained)
            tokens += sum(u.input_tokens + u.output_tokens for u in usage)
            print(f"  {n}/{len(items)} {item['label']:8} read as {'declines' if verdict.abstained else 'done':8} {item['source']}")
    return verdicts, tokens, time.perf_counter() - start


def tally(items: list[dict], verdicts: list[bool | None]) -> dict:
    """Per split and label: how many the judge read as declines, as done, or gave no verdict on."""
    counts = Counter()
    for item, v in zip(items, verdicts):
        counts[item["split"], item["label"], "none" if v is None else ("declines" if v else "done")] += 1
    return {f"{s}/{label}": {read: counts[s, label, read] for read in ("done", "declines", "none")}
            for s in sorted({i["split"] for i in items}) for label in LABELS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="local", help="the judge model, as `--judge-model` takes it (default: local)")
    ap.add_argument("--split", choices=["tune", "holdout"], help="only this part of the set")
    ap.add_argument("--recorded", nargs="+", metavar="LEDGER", help="read the verdicts these ledgers hold; ask no model")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    items = load(args.split)
    if args.recorded:
        verdicts, tokens, seconds = recorded(items, args.model, args.recorded), 0, 0.0
        how = f"verdicts recorded in {', '.join(args.recorded)}"
    else:
        verdicts, tokens, seconds = asyncio.run(fresh(items, args.model))
        how = f"judged now by {judge_id(args.model)}: {tokens:,} tokens, {seconds:.0f} s"
    result = {"model": args.model, "how": how, "replies": len(items), "tally": tally(items, verdicts),
              "wrong": [{"source": i["source"], "label": i["label"], "reply": i["reply"][:160]}
                        for i, v in zip(items, verdicts) if v is not None and v != (i["label"] == "declines")]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"abstention judge on {len(items)} labelled replies ({how})")
    for col in ("split / label", "read as done", "read as declines", "no verdict", "right"):
        table.add_column(col)
    for name, c in result["tally"].items():
        right = c["declines"] if name.endswith("declines") else c["done"]
        table.add_row(name, str(c["done"]), str(c["declines"]), str(c["none"]), f"{right}/{c['done'] + c['declines']}")
    console = Console()
    console.print(table)
    for w in result["wrong"]:
        console.print(f"[yellow]{w['label']} read wrong[/] {w['source']}: {w['reply']!r}", highlight=False)


if __name__ == "__main__":
    main()
