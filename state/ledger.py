"""The run ledger: one SQLite file under `runs/`, written through sqlite-utils.

It holds private records: certifications, graded episodes (the rollout cache,
keyed by harness hash, environment hash, task, side, model, seed and trial),
runs, and the abstention judge's cached verdicts. Nothing in it is ever
served to an agent.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from state.evolution import LineageEntry, ProposalOutcome
from state.records import Certification, EpisodeRecord, JudgeVerdict


def runs_dir() -> Path:
    """Where run output goes: `$HERA_RUNS`, else `runs/` in the working directory."""
    return Path(os.environ.get("HERA_RUNS", "runs"))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_open: dict[Path, tuple[sqlite_utils.Database, threading.Lock]] = {}
_open_lock = threading.Lock()


class Ledger:
    """A handle on the ledger file; handles on one file in one process share
    a connection and a lock."""

    def __init__(self, path: Path | str | None = None):
        self.path = (Path(path) if path else runs_dir() / "hera.db").resolve()
        with _open_lock:
            if self.path not in _open or not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
                # WAL with synchronous=NORMAL survives a killed process, which is the crash that matters here
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                _open[self.path] = (sqlite_utils.Database(conn), threading.Lock())
            self.db, self._lock = _open[self.path]

    def record_certification(self, cert: Certification) -> None:
        with self._lock:
            self.db["certifications"].upsert(
                {
                    "pair_id": cert.pair_id,
                    "feasible_hash": cert.feasible_hash,
                    "infeasible_hash": cert.infeasible_hash,
                    "passed": cert.passed,
                    "checks": json.dumps([c.model_dump() for c in cert.checks]),
                    "certified_at": _now(),
                },
                pk=("pair_id", "feasible_hash", "infeasible_hash"),
            )

    def certification(self, pair_id: str, feasible_hash: str, infeasible_hash: str) -> Certification | None:
        row = self._one("certifications", "pair_id = ? and feasible_hash = ? and infeasible_hash = ?", [pair_id, feasible_hash, infeasible_hash])
        if row is None:
            return None
        return Certification(pair_id=row["pair_id"], feasible_hash=row["feasible_hash"],
                             infeasible_hash=row["infeasible_hash"], checks=tuple(json.loads(row["checks"])))

    def record_episode(self, run_id: str, record: EpisodeRecord, reused: bool = False) -> None:
        """Finished episodes are stored once per key; every attempt (or reuse
        from the cache) is logged, and an infrastructure error never
        overwrites a finished episode."""
        row = {"id": record.key.id, "run_id": run_id, "pair_id": record.pair_id, "side": record.key.side,
               "bundle": record.bundle, "model": record.key.model, "trial": record.key.trial,
               "status": record.status, "record": record.model_dump_json(), "created_at": _now()}
        with self._lock:
            if record.status == "done":
                self._insert("episodes", row, pk="id", ignore=True)
            self._insert(
                "attempts",
                {"episode_id": record.key.id, "run_id": run_id, "pair_id": record.pair_id, "side": record.key.side,
                 "status": "reused" if reused else record.status, "error": record.error, "created_at": row["created_at"]},
                alter=True,
            )

    def episode(self, episode_id: str) -> EpisodeRecord | None:
        row = self._one("episodes", "id = ?", [episode_id])
        return EpisodeRecord.model_validate_json(row["record"]) if row else None

    def episodes(self, run_id: str | None = None) -> list[EpisodeRecord]:
        where, args = ("id in (select episode_id from attempts where run_id = ?)", [run_id]) if run_id else (None, None)
        return [EpisodeRecord.model_validate_json(r["record"]) for r in self._rows("episodes", where, args, order_by="rowid")]

    def attempts(self, run_id: str) -> list[dict]:
        return self._rows("attempts", "run_id = ?", [run_id], select="episode_id, status, error, created_at")

    def record_run(self, run_id: str, **fields) -> None:
        with self._lock:
            self.db["runs"].upsert({"id": run_id, "updated_at": _now(), **{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()}},
                                   pk="id", alter=True)

    def runs(self) -> list[dict]:
        return self._rows("runs", order_by="updated_at desc")

    def run(self, run_id: str) -> dict | None:
        return self._one("runs", "id = ?", [run_id])

    def judged(self, key: str) -> JudgeVerdict | None:
        row = self._one("judgements", "id = ?", [key])
        return JudgeVerdict.model_validate_json(row["verdict"]) if row else None

    def record_judgement(self, key: str, verdict: JudgeVerdict) -> None:
        with self._lock:
            self.db["judgements"].upsert({"id": key, "verdict": verdict.model_dump_json(), "created_at": _now()}, pk="id")

    def record_lineage(self, entry: LineageEntry) -> None:
        """Upserts one lineage entry (a candidate is recorded when staged and again when scored)."""
        with self._lock:
            self.db["lineage"].upsert({"id": entry.id, "run_id": entry.run_id, "parent_id": entry.parent_id, "adopted": entry.adopted,
                                       "entry": entry.model_dump_json(), "updated_at": _now()}, pk="id")

    def lineage(self, run_id: str | None = None) -> list[LineageEntry]:
        rows = self._rows("lineage", "run_id = ?" if run_id else None, [run_id] if run_id else None, order_by="rowid")
        return [LineageEntry.model_validate_json(r["entry"]) for r in rows]

    def record_proposal(self, run_id: str, outcome: ProposalOutcome) -> None:
        with self._lock:
            self.db["proposals"].upsert({"id": outcome.pair_id, "run_id": run_id, "parent": outcome.target.parent,
                                         "category": outcome.target.category, "status": outcome.status, "rounds": outcome.rounds,
                                         "outcome": outcome.model_dump_json(), "updated_at": _now()}, pk="id")

    def proposals(self, run_id: str) -> list[ProposalOutcome]:
        return [ProposalOutcome.model_validate_json(r["outcome"]) for r in self._rows("proposals", "run_id = ?", [run_id], order_by="rowid")]

    def record_batch(self, run_id: str, screening: dict) -> None:
        with self._lock:
            self.db["batches"].insert({"run_id": run_id, **{k: json.dumps(v) if isinstance(v, list) else v for k, v in screening.items()},
                                       "created_at": _now()}, alter=True)

    def batches(self, run_id: str) -> list[dict]:
        return self._rows("batches", "run_id = ?", [run_id], order_by="rowid")

    def record_round(self, run_id: str, round_: int, **fields) -> None:
        """One co-evolution round: its pool, admitted batches, sub-run ids and the harness it ended with."""
        with self._lock:
            self.db["rounds"].upsert({"id": f"{run_id}:{round_}", "run_id": run_id, "round": round_, "updated_at": _now(),
                                      **{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in fields.items()}},
                                     pk="id", alter=True)

    def rounds(self, run_id: str) -> list[dict]:
        return self._rows("rounds", "run_id = ?", [run_id], order_by="round")

    def _insert(self, table: str, row: dict, **how) -> None:
        """One plain INSERT, the per-episode path; sqlite-utils, which creates
        the table or (with `alter`) adds columns, only when that fails."""
        columns = ", ".join(f"[{c}]" for c in row)
        verb = "insert or ignore" if how.get("ignore") else "insert"
        try:
            self.db.conn.execute(f"{verb} into [{table}] ({columns}) values ({', '.join('?' * len(row))})", list(row.values()))
        except sqlite3.OperationalError:
            self.db[table].insert(row, **how)

    def _one(self, table: str, where: str, args: list) -> dict | None:
        with self._lock:  # the connection is shared by threads: one statement at a time
            try:
                cursor = self.db.conn.execute(f"select * from [{table}] where {where} limit 1", args)
            except sqlite3.OperationalError as exc:
                if str(exc).startswith("no such table"):
                    return None
                raise
            row = cursor.fetchone()
            return dict(zip([c[0] for c in cursor.description], row)) if row else None

    def _rows(self, table: str, where: str | None = None, args: list | None = None, **how) -> list[dict]:
        with self._lock:
            if table not in self.db.table_names():
                return []
            return list(self.db[table].rows_where(where, args, **how))
