"""The run ledger: one SQLite file under `runs/`, or the `ledger` schema of a PostgreSQL store (`state.store`).

It holds private records: certifications, graded episodes (the rollout cache,
keyed by harness hash, environment hash, task, side, model, seed and trial),
runs, and the abstention judge's cached verdicts. Nothing in it is ever
served to an agent. It also holds the claims that make one writer per episode
and per run across processes: a claim names its owner (a token, pid, host and
start time), is keyed `episode:<episode id>` or `run:<run id>` and is renewed
while the owner works; one whose process is gone from this host, or not renewed
for `LEASE_S`, is taken over.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import AsyncIterator

from state.evolution import LineageEntry, ProposalOutcome
from state.paths import RunPaths
from state.records import Certification, EpisodeRecord, JudgeVerdict
from state.store import SqliteTables, is_url, postgres_tables, store_url


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


LEASE_S = 120.0  # a claim not renewed for this long is taken over (its owner hangs, or ran on another host and is gone)
RENEW_S = 20.0  # how often a claim's owner renews it: several renewals fit in a lease, on a loaded machine too
HOST = socket.gethostname()
WAL_TRIES = 600  # switches to WAL tried, 50 ms apart: 30 s, the busy timeout

_open: dict[Path, tuple[SqliteTables, threading.Lock]] = {}
_open_lock = threading.Lock()


class LedgerError(RuntimeError):
    """The ledger file cannot be read, or has lost a run that other files still show."""


def _wal(conn: sqlite3.Connection) -> None:
    """Switches to WAL; two processes opening a new file at once make one switch fail at once with "database is
    locked", busy timeout or not (seen in a test of two evaluating processes), so it is tried again for a while."""
    for _ in range(WAL_TRIES - 1):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.05)
    conn.execute("PRAGMA journal_mode=WAL")


class Ledger:
    """A handle on the ledger: a SQLite file, or the `ledger` schema of a PostgreSQL store (`path` a URL, or none
    given and `$HERA_STORE` set). Handles on one ledger in one process share a connection and a lock."""

    def __init__(self, path: Path | str | None = None):
        target = path or store_url()
        if is_url(target):
            self.db, self._lock = postgres_tables(str(target), "ledger")
            self.path = self.db.where  # the claims table is made by the first claim (renewals and releases follow one)
            return
        self.path = Path(target or RunPaths.here().ledger).resolve()
        with _open_lock:
            if self.path not in _open or not self.path.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
                _open[self.path] = (SqliteTables(self._connect(), str(self.path)), threading.Lock())
            self.db, self._lock = _open[self.path]

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        try:
            # WAL with synchronous=NORMAL survives a killed process, which is the crash that matters here
            _wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("create table if not exists claims (id text primary key, run_id text, owner text not null, "
                         "pid integer, host text, started_at text, renewed_at real)")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise LedgerError(f"{self.path}: not a readable ledger ({exc}); move it aside to start a new one "
                              "(every recorded run and episode is then forgotten) or restore it from a backup") from None
        return conn

    def record_certification(self, cert: Certification) -> None:
        with self._lock:
            self.db.upsert(
                "certifications", {
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

    def record_episode(self, run_id: str, record: EpisodeRecord, reused: bool = False, release: Claim | None = None) -> EpisodeRecord:
        """Finished episodes are stored once per key; every attempt (or reuse
        from the cache) is logged, and an infrastructure error never
        overwrites a finished episode. Returns the record the ledger holds
        for the key (another writer's, if it finished first), so that a run
        scores what the ledger holds. `release`: a claim `held` keeps, let go
        in the same transaction (the attempt was the last)."""
        row = {"id": record.key.id, "run_id": run_id, "pair_id": record.pair_id, "side": record.key.side,
               "bundle": record.bundle, "model": record.key.model, "trial": record.key.trial,
               "status": record.status, "record": record.model_dump_json(), "created_at": _now()}
        with self._lock, self.db.transaction(f"episode:{record.key.id}"):
            stored = record.status != "done" or reused or self.db.insert("episodes", row, ignore=True, pk="id")
            self.db.insert("attempts", {"episode_id": record.key.id, "run_id": run_id, "pair_id": record.pair_id, "side": record.key.side,
                                        "status": "reused" if reused else record.status, "error": record.error, "created_at": row["created_at"]})
            if release:
                self.db.execute("delete from claims where id = ? and owner = ?", [release.key, release.owner])
                release.released = True
        return record if stored else self.episode(record.key.id)

    def regrade_episode(self, record: EpisodeRecord) -> None:
        """Stores a finished episode's record in place of the one held under its key: the same trajectory, graded again."""
        with self._lock:
            self.db.execute("update episodes set record = ? where id = ? and status = 'done'", [record.model_dump_json(), record.key.id])

    def episode(self, episode_id: str) -> EpisodeRecord | None:
        row = self._one("episodes", "id = ?", [episode_id])
        return EpisodeRecord.model_validate_json(row["record"]) if row else None

    def episodes(self, run_id: str | None = None) -> list[EpisodeRecord]:
        """Finished episodes, or those a run finished or reused (not one it only failed and another run finished),
        once under each pair id the run gave it (a reused episode may be stored under another pair's; two pairs of
        one run may share one)."""
        if not run_id:
            return [EpisodeRecord.model_validate_json(r["record"]) for r in self._rows("episodes", order_by="rowid")]
        asked: dict[str, dict[str, None]] = {}  # episode id -> the pair ids it was asked under, in order
        for a in self._rows("attempts", "run_id = ? and status in ('done', 'reused')", [run_id], select="episode_id, pair_id", order_by="rowid"):
            asked.setdefault(a["episode_id"], {})[a["pair_id"]] = None
        rows = self._rows("episodes", "id in (select episode_id from attempts where run_id = ? and status in ('done', 'reused'))",
                          [run_id], order_by="rowid")
        records = [EpisodeRecord.model_validate_json(r["record"]) for r in rows]
        return [r if p == r.pair_id else r.model_copy(update={"pair_id": p}) for r in records for p in asked.get(r.key.id) or [r.pair_id]]

    def attempts(self, run_id: str) -> list[dict]:
        return self._rows("attempts", "run_id = ?", [run_id], select="episode_id, pair_id, side, status, error, created_at")

    def record_run(self, run_id: str, **fields) -> None:
        with self._lock:
            self.db.upsert("runs", {"id": run_id, "updated_at": _now(), **fields}, pk="id")

    def runs(self) -> list[dict]:
        return self._rows("runs", order_by="updated_at desc")

    def run(self, run_id: str) -> dict | None:
        return self._one("runs", "id = ?", [run_id])

    def judged(self, key: str) -> JudgeVerdict | None:
        row = self._one("judgements", "id = ?", [key])
        return JudgeVerdict.model_validate_json(row["verdict"]) if row else None

    def record_judgement(self, key: str, verdict: JudgeVerdict) -> None:
        with self._lock:
            self.db.upsert("judgements", {"id": key, "verdict": verdict.model_dump_json(), "created_at": _now()}, pk="id")

    def record_lineage(self, entry: LineageEntry) -> None:
        """Upserts one lineage entry (a candidate is recorded when staged and again when scored)."""
        with self._lock:
            self.db.upsert("lineage", {"id": entry.id, "run_id": entry.run_id, "parent_id": entry.parent_id, "adopted": entry.adopted,
                                       "entry": entry.model_dump_json(), "updated_at": _now()}, pk="id")

    def lineage(self, run_id: str | None = None) -> list[LineageEntry]:
        rows = self._rows("lineage", "run_id = ?" if run_id else None, [run_id] if run_id else None, order_by="rowid")
        return [LineageEntry.model_validate_json(r["entry"]) for r in rows]

    def record_proposal(self, run_id: str, outcome: ProposalOutcome) -> None:
        with self._lock:
            self.db.upsert("proposals", {"id": outcome.pair_id, "run_id": run_id, "parent": outcome.target.parent,
                                         "category": outcome.target.category, "status": outcome.status, "rounds": outcome.rounds,
                                         "outcome": outcome.model_dump_json(), "updated_at": _now()}, pk="id")

    def proposals(self, run_id: str) -> list[ProposalOutcome]:
        return [ProposalOutcome.model_validate_json(r["outcome"]) for r in self._rows("proposals", "run_id = ?", [run_id], order_by="rowid")]

    def record_batch(self, run_id: str, screening: dict) -> None:
        with self._lock:
            self.db.insert("batches", {"run_id": run_id, **screening, "created_at": _now()})

    def batches(self, run_id: str) -> list[dict]:
        return self._rows("batches", "run_id = ?", [run_id], order_by="rowid")

    def record_round(self, run_id: str, round_: int, **fields) -> None:
        """One co-evolution round: its pool, admitted batches, sub-run ids and the harness it ended with."""
        with self._lock:
            self.db.upsert("rounds", {"id": f"{run_id}:{round_}", "run_id": run_id, "round": round_, "updated_at": _now(), **fields},
                           pk="id")

    def rounds(self, run_id: str) -> list[dict]:
        return self._rows("rounds", "run_id = ?", [run_id], order_by="round")

    def claim_episode(self, episode_id: str, run_id: str, owner: str) -> tuple[EpisodeRecord | None, dict | None]:
        """In one write transaction: (the finished record, None) when the episode is in the ledger, (None, the
        holder's claim) while another owner that is alive holds it, else (None, None) and `owner` holds it now."""
        with self._lock, self.db.transaction(f"episode:{episode_id}"):
            row = self._select_one("episodes", "id = ?", [episode_id])
            if row is not None:
                return EpisodeRecord.model_validate_json(row["record"]), None
            return None, self._take(f"episode:{episode_id}", run_id, owner)

    def claim_run(self, run_id: str, owner: str) -> dict | None:
        """Claims a run for `owner`: None when it holds it now, else the claim of the live owner that does."""
        with self._lock, self.db.transaction(f"run:{run_id}"):
            return self._take(f"run:{run_id}", run_id, owner)

    def renew_claim(self, key: str, owner: str) -> None:
        with self._lock:
            self.db.execute("update claims set renewed_at = ? where id = ? and owner = ?", [time.time(), key, owner])

    def release_claim(self, key: str, owner: str) -> None:
        with self._lock:
            self.db.execute("delete from claims where id = ? and owner = ?", [key, owner])

    def claims(self) -> list[dict]:
        return self._rows("claims", order_by="rowid")

    def _take(self, key: str, run_id: str, owner: str) -> dict | None:
        claim = self._select_one("claims", "id = ?", [key])
        if claim is not None and claim["owner"] != owner and _alive(claim):
            return claim
        self.db.upsert("claims", {"id": key, "run_id": run_id, "owner": owner, "pid": os.getpid(), "host": HOST, "started_at": _now(),
                                  "renewed_at": time.time()}, pk="id")
        return None

    def _select_one(self, table: str, where: str, args: list) -> dict | None:
        """The first matching row (None without the table); the caller holds the lock."""
        rows = self.db.select(table, where, args, limit=1)
        return rows[0] if rows else None

    def _one(self, table: str, where: str, args: list) -> dict | None:
        with self._lock:  # the connection is shared by threads: one statement at a time
            return self._select_one(table, where, args)

    def _rows(self, table: str, where: str | None = None, args: list | None = None, **how) -> list[dict]:
        with self._lock:
            return self.db.select(table, where, args, **how)


def _alive(claim: dict) -> bool:
    """Whether a claim's owner may still be working: renewed within the lease and, on this host, its process running."""
    if time.time() - (claim["renewed_at"] or 0) > LEASE_S:
        return False
    if claim["host"] != HOST:
        return True
    try:
        os.kill(claim["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass
class Claim:
    """A claim `held` keeps; `released` once a write that ended the work let it go too (`Ledger.record_episode`)."""

    key: str
    owner: str
    released: bool = False


@asynccontextmanager
async def held(ledger: Ledger, key: str, owner: str) -> AsyncIterator[Claim]:
    """Renews `owner`'s claim on `key` every `RENEW_S` while the body runs, and releases it after (unless the body did)."""
    claim = Claim(key, owner)

    async def renew() -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await asyncio.to_thread(ledger.renew_claim, key, owner)

    renewal = asyncio.create_task(renew())
    try:
        yield claim
    finally:
        renewal.cancel()
        if not claim.released:
            await asyncio.to_thread(ledger.release_claim, key, owner)
