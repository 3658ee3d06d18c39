"""Where things live: the built-in catalog, and every file a run writes under one runs root (`$HERA_RUNS`, else
`runs/` in the working directory). `runs/README.md` says what each store holds."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CATALOG = Path(__file__).resolve().parent.parent / "envs" / "catalog"  # the built-in benchmark
# A run's or a pair's id names a file or folder (under the runs root, in a catalog): one name, never a path, `.` or `..`
# (nor a hidden file). A run id given is at most MAX_ID long, so that a sub-run's (the id and a suffix) still makes a
# file name.
# No control character either (a newline would forge a progress line), nor an undecodable byte: a surrogate in Python's
# text, which no UTF-8 record can hold (`ID_PATTERN` leaves those out for pydantic, which refuses them by itself and
# whose regex engine has none).
_ID = r"[^./\\\x00-\x1f\x7f{0}][^/\\\x00-\x1f\x7f{0}]*"
ID, ID_PATTERN, MAX_ID = re.compile(_ID.format(r"\ud800-\udfff")), _ID.format(""), 128
ID_RULE = "one file or folder name: no '/', '\\', control character or undecodable byte, not starting with '.'"


def run_id_problem(run_id: str) -> str | None:
    """Why `run_id` cannot name a run, or None."""
    if ID.fullmatch(run_id) and len(run_id) <= MAX_ID:
        return None
    return f"run id {run_id[:MAX_ID]!r}: {ID_RULE}, at most {MAX_ID} characters"


def runs_dir() -> Path:
    """Where run output goes: `$HERA_RUNS`, else `runs/` in the working directory."""
    return Path(os.environ.get("HERA_RUNS", "runs"))


@dataclass(frozen=True)
class RunPaths:
    """The stores and folders under one runs root."""

    root: Path

    @classmethod
    def here(cls) -> RunPaths:
        return cls(runs_dir())

    @property
    def ledger(self) -> Path:
        """Runs, episodes (the rollout cache), grades, judge verdicts, certifications, lineage, rounds, batches, claims."""
        return self.root / "hera.db"

    @property
    def checkpoints(self) -> Path:
        """LangGraph checkpoints of evaluation runs, one thread per run id."""
        return self.root / "checkpoints.db"

    @property
    def evolution(self) -> Path:
        """Checkpoints of harness-evolution, environment-evolution and construction runs."""
        return self.root / "evolution.db"

    @property
    def coevolution(self) -> Path:
        """Checkpoints of co-evolution runs (whose sub-runs checkpoint in `evolution` and `checkpoints`)."""
        return self.root / "coevolution.db"

    @property
    def calls(self) -> Path:
        """The call journal: model replies made inside checkpointed runs, re-read on resume."""
        return self.root / "calls.db"

    def bundles(self, run_id: str) -> Path:
        """Harness candidates a harness-evolution run wrote."""
        return self._run("bundles", run_id)

    def pool(self, run_id: str) -> Path:
        """The certified pairs an environment-evolution run made, as a catalog."""
        return self._run("pools", run_id)

    def coevolution_run(self, run_id: str) -> Path:
        """A co-evolution run's own catalog (its training and validation pairs, and the batches it admits)."""
        return self._run("coevolution", run_id)

    def report(self, run_id: str) -> Path:
        """`hera report`'s Markdown, HTML and figures for a run."""
        return self._run("reports", run_id)

    def _run(self, folder: str, run_id: str) -> Path:
        """A run's own folder; the entries (the CLI, each graph's input) refuse a bad run id first, by name."""
        if not ID.fullmatch(run_id):
            raise ValueError(f"run id {run_id!r}: not a folder's name")
        return self.root / folder / run_id
