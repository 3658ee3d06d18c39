"""How often `answer_from_results` would send an answer back, on recorded episodes, without a model.

For every finished episode of a ledger on a pair no bench run scored that ended with a final answer (each trajectory once, however many runs
reused it): the values of the answer (tokens with two digits or more: amounts, dates, ids) that appear neither in
the request nor in any tool result the agent saw. The component sends such an answer back once. Read by grade: on
episodes graded right a flag costs a turn (and may talk a right answer out of its value), on episodes graded wrong
it is a chance to mend them; whether a revision mends them takes the model (`hera eval`).

    python benchmarks/bench_answer_values.py [--ledger runs/hera.db] [--catalog DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from envs.catalog import entry_context, load_entry
from harness.components import unseen_values
from state.ledger import Ledger
from state.paths import CATALOG, RunPaths


def sources_of(record, catalog: Path) -> list[str] | None:
    """What the agent was told besides the results, as the component reads it: the pair's request and context, else
    the first human message recorded."""
    try:
        entry = load_entry(record.pair_id, catalog)
        return [entry.pair.task.instruction, entry_context(entry)]
    except (KeyError, FileNotFoundError):
        human = [m for m in record.messages if m.get("type") == "human"]
        return [human[0].get("data", {}).get("content", "")] if human else None


def outcome(record) -> str:
    grade = record.grade
    if record.key.side == "act":
        return "act: done" if grade.success else ("act: refused" if grade.abstained else "act: wrong or not done")
    return "abstain: abstained" if grade.abstained else "abstain: answered instead"


def measure(ledger: Path, catalog: Path) -> dict:
    """Over the episodes of every pair no bench run (`*-bench`) scored: the bench is for judging, not for design."""
    seen, rows = set(), Counter()
    examples: dict[str, list] = {}
    store = Ledger(ledger)
    bench = {e.pair_id for r in store.runs() if r["id"].endswith("-bench") for e in store.episodes(r["id"])}
    for record in store.episodes():
        if record.pair_id in bench or record.status != "done" or record.termination != "final_answer" or record.grade is None or record.key in seen:
            continue
        seen.add(record.key)
        sources = sources_of(record, catalog)
        if sources is None:
            continue
        unseen = unseen_values(record.answer or "", [*sources, *(o.seen for o in record.observations)])
        kind = outcome(record)
        rows[kind, bool(unseen)] += 1
        if unseen and len(examples.setdefault(kind, [])) < 3:
            examples[kind].append({"pair": record.pair_id, "unseen": unseen, "answer": (record.answer or "")[:160]})
    kinds = sorted({k for k, _ in rows})
    return {"ledger": str(ledger), "episodes": sum(rows.values()),
            "by_outcome": {k: {"flagged": rows[k, True], "episodes": rows[k, True] + rows[k, False]} for k in kinds},
            "examples": examples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", default=str(RunPaths.here().ledger), help="ledger file (default: the runs directory's)")
    parser.add_argument("--catalog", default=str(CATALOG))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not Path(args.ledger).is_file():
        parser.error(f"no ledger at {args.ledger}")
    result = measure(Path(args.ledger), Path(args.catalog))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    table = Table(title=f"answers answer_from_results would send back: {result['episodes']} recorded episodes of {result['ledger']}")
    for column in ("outcome (grade)", "flagged", "episodes"):
        table.add_column(column)
    for kind, row in result["by_outcome"].items():
        table.add_row(kind, f"{row['flagged']} ({100 * row['flagged'] / row['episodes']:.0f}%)", str(row["episodes"]))
    Console().print(table)
    for kind, shown in result["examples"].items():
        for e in shown:
            Console().print(f"[dim]{kind}[/] {e['pair']}: {', '.join(e['unseen'])} — {e['answer']}", markup=True, highlight=False)


if __name__ == "__main__":
    main()
