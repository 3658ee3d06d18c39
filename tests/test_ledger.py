"""The ledger's claims (one writer per episode and per run) and a damaged ledger file, in SQLite and in PostgreSQL."""

import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from state import ledger as ledger_module
from state.ledger import LEASE_S, Ledger, LedgerError
from tests.test_report import episode


@pytest.fixture
def ledger(store):
    return Ledger(store)


def backdate(ledger: Ledger, key: str, **fields) -> None:
    sets = ", ".join(f"{k} = ?" for k in fields)
    ledger.db.execute(f"update claims set {sets} where id = ?", [*fields.values(), key])


def test_a_claim_is_held_then_released(ledger):
    assert ledger.claim_episode("e1", "run-a", "a") == (None, None)
    cached, holder = ledger.claim_episode("e1", "run-b", "b")
    assert cached is None
    assert (holder["owner"], holder["run_id"], holder["pid"], holder["host"]) == ("a", "run-a", os.getpid(), ledger_module.HOST)
    ledger.release_claim("episode:e1", "b")  # not b's: nothing happens
    assert [c["owner"] for c in ledger.claims()] == ["a"]
    ledger.release_claim("episode:e1", "a")
    assert ledger.claims() == []
    assert ledger.claim_episode("e1", "run-b", "b") == (None, None)


def test_the_last_attempts_record_lets_go_of_its_owners_claim_in_the_same_write(ledger):
    record = episode("p1", "act")
    assert ledger.claim_episode(record.key.id, "run-a", "a") == (None, None)
    ledger.record_episode("run-a", record, release=ledger_module.Claim(f"episode:{record.key.id}", "b"))  # not b's claim
    assert [c["owner"] for c in ledger.claims()] == ["a"] and ledger.episode(record.key.id) == record
    claim = ledger_module.Claim(f"episode:{record.key.id}", "a")
    ledger.record_episode("run-a", record, release=claim)
    assert ledger.claims() == [] and claim.released


def test_a_finished_episode_is_returned_not_claimed(ledger):
    record = episode("p1", "act")
    assert ledger.record_episode("run-a", record) == record
    assert ledger.claim_episode(record.key.id, "run-b", "b") == (record, None)
    assert ledger.claims() == []


def test_the_ledger_keeps_the_first_finished_record(ledger):
    first, second = episode("p1", "act", True), episode("p1", "act", False)
    assert first.key.id == second.key.id
    ledger.record_episode("run-a", first)
    assert ledger.record_episode("run-b", second) == first  # what run-b scores is what the ledger holds
    assert ledger.episodes("run-b") == [first]


def test_a_claim_of_a_process_that_is_gone_is_taken_over(ledger):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    ledger.claim_episode("e1", "run-a", "a")
    backdate(ledger, "episode:e1", pid=int(gone.stdout))
    assert ledger.claim_episode("e1", "run-b", "b") == (None, None)
    assert [(c["owner"], c["pid"]) for c in ledger.claims()] == [("b", os.getpid())]


def test_a_claim_not_renewed_within_the_lease_is_taken_over(ledger):
    ledger.claim_episode("e1", "run-a", "a")
    backdate(ledger, "episode:e1", host="elsewhere", renewed_at=time.time() - LEASE_S + 60)
    assert ledger.claim_episode("e1", "run-b", "b")[1]["owner"] == "a"  # another host's, renewed a minute ago: alive
    ledger.renew_claim("episode:e1", "a")
    backdate(ledger, "episode:e1", renewed_at=time.time() - LEASE_S - 1)
    assert ledger.claim_episode("e1", "run-b", "b") == (None, None)


def test_a_run_claim(ledger):
    assert ledger.claim_run("r1", "a") is None
    assert ledger.claim_run("r1", "b")["owner"] == "a"
    assert ledger.claim_run("r1", "a") is None  # its own claim
    assert ledger.claim_episode("r1", "r1", "b") == (None, None)  # runs and episodes are claimed apart


def test_a_run_holds_the_episodes_it_finished_or_reused_only(ledger):
    ledger.record_episode("run-a", episode("p1", "act", status="infrastructure_error"))
    ledger.record_episode("run-b", episode("p1", "act"))
    ledger.record_episode("run-c", episode("p1", "act"), reused=True)
    assert ledger.episodes("run-a") == []  # run-a never finished it: another run did
    assert ledger.episodes("run-b") == ledger.episodes("run-c") == [episode("p1", "act")]


def test_a_file_that_is_not_a_ledger_is_named(tmp_path):
    path = tmp_path / "hera.db"
    path.write_bytes(b"\x13garbage, not SQLite\x00" * 400)
    with pytest.raises(LedgerError) as caught:
        Ledger(path)
    assert str(caught.value) == (f"{path}: not a readable ledger (file is not a database); move it aside to start a new one "
                                 "(every recorded run and episode is then forgotten) or restore it from a backup")



def _make_tables_at_once(path: str, barrier, results) -> None:
    try:
        ledger = Ledger(path)
        barrier.wait()
        for i in range(4):  # new tables, and a column of its own in each: schema changes racing the other processes'
            ledger.db.upsert(f"t{i}", {"id": str(os.getpid()), f"c{os.getpid() % 3}": 1}, pk="id")
        results.put("ok")
    except Exception as exc:
        results.put(repr(exc))


def test_processes_making_the_same_tables_and_columns_at_once_all_write(tmp_path):
    """As episodes on an engine's workers do on a fresh ledger (seen failing with "database is locked" and
    "duplicate column name" before): every write lands."""
    context = multiprocessing.get_context("fork")
    outcomes = []
    for n in range(8):
        barrier, results = context.Barrier(4), context.Queue()
        workers = [context.Process(target=_make_tables_at_once, args=(str(tmp_path / f"l{n}.db"), barrier, results)) for _ in range(4)]
        for w in workers:
            w.start()
        outcomes += [results.get(timeout=60) for _ in workers]
        for w in workers:
            w.join()
        assert len(Ledger(tmp_path / f"l{n}.db").db.select("t3")) == 4
    assert outcomes == ["ok"] * 32
