"""The run ledger: one SQLite file under `runs/`, written through sqlite-utils.

It holds private records (certifications now; episodes and lineage as the
system grows). Nothing in it is ever served to an agent.
"""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from state.records import Certification

def runs_dir() -> Path:
    """Where run output goes: `$HERA_RUNS`, else `runs/` in the working directory."""
    return Path(os.environ.get("HERA_RUNS", "runs"))


class Ledger:
    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else runs_dir() / "hera.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(sqlite3.connect(self.path, timeout=30, check_same_thread=False))

    def record_certification(self, cert: Certification) -> None:
        self.db["certifications"].upsert(
            {
                "pair_id": cert.pair_id,
                "feasible_hash": cert.feasible_hash,
                "infeasible_hash": cert.infeasible_hash,
                "passed": cert.passed,
                "checks": json.dumps([c.model_dump() for c in cert.checks]),
                "certified_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            },
            pk=("pair_id", "feasible_hash", "infeasible_hash"),
        )

    def certification(self, pair_id: str, feasible_hash: str, infeasible_hash: str) -> Certification | None:
        if "certifications" not in self.db.table_names():
            return None
        rows = list(
            self.db["certifications"].rows_where(
                "pair_id = ? and feasible_hash = ? and infeasible_hash = ?", [pair_id, feasible_hash, infeasible_hash]
            )
        )
        if not rows:
            return None
        row = rows[0]
        return Certification(
            pair_id=row["pair_id"],
            feasible_hash=row["feasible_hash"],
            infeasible_hash=row["infeasible_hash"],
            checks=tuple(json.loads(row["checks"])),
        )
