"""Episodes on a Dask engine (`--engine local:2`): the same grades and metrics as in process, a worker killed
mid-episode costs a re-run and nothing is counted twice, a bad engine is a ConfigError."""

import asyncio
import os
import re
import signal
import sqlite3
import threading
import time
from functools import partial
from pathlib import Path

import pytest

from graphs import api, engine
from graphs.runner import Evaluation
from graphs.cli import main
from roles.models import scripted
from envs.catalog import load_entry
from state.context import ConfigError, Context, EpisodeRequest
from state.records import EpisodeKey, EpisodeRecord
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge

PAIR = "shop-reserve-drill"
ENGINE = "local:2"


@pytest.fixture(scope="module")
def cluster():
    yield engine.client(ENGINE)
    engine.close()


def calls(name: str) -> int:
    return len(scripted.calls(name))


def journaled() -> int:
    with sqlite3.connect(Path(os.environ["HERA_RUNS"]) / "calls.db") as db:
        return db.execute("select count(*) from calls").fetchone()[0]


def outcome(run: Evaluation) -> dict:
    return {e.key.side: (e.status, e.termination, e.answer, [o.tool for o in e.observations], e.grade, e.usage) for e in run.episodes}


def test_episodes_on_the_engine_are_graded_and_scored_as_in_process(cluster, context, tmp_path):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])  # the refusal: the report of the reservation needs no judge
    here = asyncio.run(api.evaluate("H0", [PAIR], context))
    scripted.assert_consumed()
    assert journaled() == 6  # every model call of the run, kept for a resume
    scripted.clear()  # a model call in this process would now fail the run
    cluster.register_plugin(scripted.worker_plugin(agent=[shop_agent] * 5, judge=[shop_judge]))
    remote = Context(**{**context.__dict__, "ledger": str(tmp_path / "engine.db"), "engine": ENGINE})
    there = asyncio.run(api.evaluate("H0", [PAIR], remote))
    assert there.metrics.model_dump() == here.metrics.model_dump() and there.metrics.counts["pair"] == 1
    assert outcome(there) == outcome(here)
    assert sum(cluster.run(calls, "agent").values()) == 5 and sum(cluster.run(calls, "judge").values()) == 1
    assert journaled() == 12  # the workers journaled theirs under the engine run's scopes, as in process
    attempts = Ledger(remote.ledger).attempts(there.run_id)
    assert sorted((a["side"], a["status"]) for a in attempts) == [("abstain", "done"), ("act", "done")]


def test_attempts_ready_together_go_to_the_cluster_in_an_even_share_for_each_worker(cluster, context, tmp_path, monkeypatch):
    """Dask's scheduler and messages cost a task about what a worker's episode costs: the attempts that are ready at
    the same time share tasks, one share for each of the cluster's worker processes (2 here, of 2 threads), and
    each comes back with its own record. A later evaluation on the same loop makes its share from its own attempts in
    flight, not from the last one's."""
    # A task leaves when `BATCH` attempts are ready, so each evaluation's attempts leave together however slowly a
    # loaded machine readies them; the timer that sends fewer is set past the test's end.
    monkeypatch.setattr(engine, "GATHER_S", 600)
    submitted, submit = [], cluster.submit
    monkeypatch.setattr(cluster, "submit", lambda fn, *args, **kw: submitted.append(len(args[1])) or submit(fn, *args, **kw))
    cluster.register_plugin(scripted.worker_plugin(agent=[shop_agent] * 25, judge=[shop_judge] * 10))
    small, large = (Context(**{**context.__dict__, "engine": ENGINE, "ledger": str(tmp_path / f"{name}.db")}) for name in ("small", "large"))

    async def both():
        monkeypatch.setattr(engine, "BATCH", 2)
        first = await api.evaluate("H0", [PAIR], small, trials=1, concurrency=2)  # 2 attempts in flight: tasks of 1
        sent = len(submitted)
        monkeypatch.setattr(engine, "BATCH", 8)
        return first, sent, await api.evaluate("H0", [PAIR], large, trials=4, concurrency=8)

    first, sent, run = asyncio.run(both())
    assert submitted[:sent] == [1, 1] and first.metrics.complete
    assert submitted[sent:] == [4, 4]  # 8 in flight over 2 workers
    assert run.metrics.complete and run.metrics.counts["pair"] == 4
    assert sorted((e.key.side, e.key.trial, e.status) for e in run.episodes) == [
        (side, trial, "done") for side in ("abstain", "act") for trial in range(4)]


async def fails_on_the_act_side(entry, request, key, ctx, ledger, episode_id, thread=None) -> EpisodeRecord:
    """An attempt with a bug on one side of the pair."""
    if request.side == "act":
        raise ValueError("a bug in the attempt")
    return EpisodeRecord(key=key, pair_id=request.pair_id, bundle=request.bundle, status="done", answer=episode_id)


def test_an_attempt_that_raises_fails_its_own_episode_not_the_others_of_its_task(cluster, context, monkeypatch):
    monkeypatch.setattr(engine, "GATHER_S", 0.5)  # both attempts ready together,
    monkeypatch.setitem(engine._workers, ENGINE, (float("inf"), 1))  # on one worker: one task
    remote = Context(**{**context.__dict__, "engine": ENGINE})
    entry = load_entry(PAIR, remote.catalog)

    async def both() -> list:
        requests = [EpisodeRequest(pair_id=PAIR, side=side, bundle="H0") for side in ("act", "abstain")]
        keys = [EpisodeKey(harness_hash="h", env_hash="e", task_id=PAIR, side=r.side, model="scripted:agent", seed=0, trial=0)
                for r in requests]
        return await asyncio.gather(*(engine.run_attempt(fails_on_the_act_side, entry, r, k, remote, None, f"attempt-{r.side}")
                                      for r, k in zip(requests, keys)), return_exceptions=True)

    act, abstain = asyncio.run(both())
    assert isinstance(act, ValueError) and str(act) == "a bug in the attempt"
    assert abstain.status == "done" and abstain.answer == "attempt-abstain" and abstain.key.side == "abstain"


def test_a_worker_runs_a_task_sent_with_other_settings_once_its_running_tasks_are_done(context, monkeypatch):
    """A worker has two threads, and a task sets the process's environment variables: tasks sent with the same
    settings run at once, one sent with others (another coordinator's) waits for the running ones to end."""
    monkeypatch.setenv("HERA_PROBE", "before")
    seen = []

    async def probe(entry, request, key, ctx, ledger, episode_id, thread=None) -> EpisodeRecord:
        first, start = os.environ["HERA_PROBE"], time.monotonic()
        await asyncio.sleep(0.3)
        seen.append((episode_id, first, os.environ["HERA_PROBE"], start, time.monotonic()))
        return EpisodeRecord(key=key, pair_id=request.pair_id, bundle=request.bundle, status="done", answer=episode_id)

    key = EpisodeKey(harness_hash="h", env_hash="e", task_id=PAIR, side="act", model="scripted:agent", seed=0, trial=0)
    settings = engine.coordinator()

    def together(*probe_values: str) -> list[tuple]:
        """Two tasks sent at once, each with HERA_PROBE set to its value: what each saw, by start."""
        seen.clear()
        threads = []
        for n, value in enumerate(probe_values):
            job = engine.Job(EpisodeRequest(pair_id=PAIR, side="act", bundle="H0"), key, context, f"{value}{n}", None, None)
            sent = {**settings, "env": {**settings["env"], "HERA_PROBE": value}}
            threads.append(threading.Thread(target=engine.attempts, args=(probe, [job], sent)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return sorted(seen, key=lambda s: s[3])

    first, second = together("a", "a")
    assert second[3] < first[4]  # the same settings: both ran at once
    first, second = together("a", "b")
    assert {first[:3], second[:3]} == {("a0", "a", "a"), ("b1", "b", "b")}  # each saw its own settings throughout
    assert second[3] >= first[4]  # the second waited for the first to end


def stalled_agent(messages, tools, marker: str):
    """The shop agent, except that the first call anywhere writes its process id to `marker` and stalls."""
    try:
        with open(marker, "x") as f:
            f.write(str(os.getpid()))
    except FileExistsError:
        return shop_agent(messages, tools)
    time.sleep(120)
    raise AssertionError("the stalled call outlived its worker")


def test_a_worker_killed_mid_episode_has_it_run_again_and_counted_once(cluster, context, tmp_path):
    marker = tmp_path / "stalled.pid"
    cluster.register_plugin(scripted.worker_plugin(agent=[partial(stalled_agent, marker=str(marker))] * 5, judge=[shop_judge] * 2))
    workers = set(cluster.run(os.getpid).values())
    remote = Context(**{**context.__dict__, "engine": ENGINE})

    async def kill_the_stalled_worker() -> int:
        while not (marker.exists() and marker.read_text()):
            await asyncio.sleep(0.05)
        pid = int(marker.read_text())
        os.kill(pid, signal.SIGKILL)
        return pid

    async def both():
        return await asyncio.gather(api.evaluate("H0", [PAIR], remote), kill_the_stalled_worker())

    run, killed = asyncio.run(both())
    assert killed in workers and killed not in cluster.run(os.getpid).values()
    assert run.metrics.complete and run.metrics.counts["pair"] == 1
    ledger = Ledger(remote.ledger)
    attempts = ledger.attempts(run.run_id)
    assert sorted((a["side"], a["status"]) for a in attempts) == [("abstain", "done"), ("act", "done")]
    assert sorted(e.key.side for e in ledger.episodes(run.run_id)) == ["abstain", "act"]


@pytest.mark.parametrize("value", ["local:0", "local:", "local:two", "foo", "tcp://scheduler", "tcp://host:99999", "http://host:8786"])
def test_an_engine_that_is_neither_local_n_nor_a_scheduler_address_is_a_config_error(value, context, capsys):
    with pytest.raises(ConfigError, match=re.escape(f"--engine (or HERA_ENGINE) {value!r}: expected local:N (N ≥ 1")):
        engine.parse_engine(value)
    assert engine.parse_engine("local:3") == 3 and engine.parse_engine("tcp://10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    base = ["--catalog", str(FIXTURES), "--ledger", context.ledger, "--engine", value]
    assert main([*base, "eval", "--model", "scripted:agent", "--judge-model", "scripted:judge", "--pairs", PAIR]) == 2
    assert f"error: --engine (or HERA_ENGINE) '{value}': expected local:N" in " ".join(capsys.readouterr().err.split())
    assert Ledger(context.ledger).runs() == []


def test_a_scheduler_that_does_not_answer_is_a_config_error(monkeypatch):
    monkeypatch.setattr(engine, "CONNECT_S", 1)
    with pytest.raises(ConfigError, match=re.escape("--engine tcp://127.0.0.1:1: no Dask scheduler answered at tcp://127.0.0.1:1 within 1 s")):
        engine.client("tcp://127.0.0.1:1")
