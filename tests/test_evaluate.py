"""The evaluate graph end to end on the shop fixture with scripted models."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from graphs import api
from roles import scripted
from roles.models import InfrastructureError
from state.context import Context
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge

PAIR = "shop-reserve-drill"


@pytest.fixture
def context(tmp_path, monkeypatch):
    monkeypatch.setenv("HERA_RUNS", str(tmp_path / "runs"))
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES),
                  ledger=str(tmp_path / "ledger.db"), max_infra_retries=1)
    scripted.clear()


def evaluate(context, **kw):
    return asyncio.run(api.evaluate("H0", [PAIR], context, **kw))


def test_both_sides_graded_and_scored_exactly(context):
    scripted.register("agent", [shop_agent] * 5)  # act: get_item, reserve, answer; abstain: get_item, refusal
    scripted.register("judge", [shop_judge] * 2)
    run_id, m = evaluate(context)
    scripted.assert_consumed()
    assert m.complete and m.counts == {"abstain": 1, "act": 1, "pair": 1, "over_abstain": 0, "grounded": 1}
    assert m.percent == {"abstain": 100.0, "act": 100.0, "pair": 100.0, "over_abstain": 0.0, "grounded": 100.0}
    episodes = {e.key.side: e for e in Ledger(context.ledger).episodes(run_id)}
    act, abstain = episodes["act"], episodes["abstain"]
    assert [o.tool for o in act.observations] == ["get_item", "reserve"]
    assert (act.grade.success, act.grade.abstained, act.grade.committed) == (True, False, True)
    assert [o.tool for o in abstain.observations] == ["get_item"]
    assert (abstain.grade.success, abstain.grade.abstained, abstain.grade.committed, abstain.grade.grounded) == (True, True, False, True)
    assert abstain.grade.quote == "I cannot reserve the drills"
    assert {u.role for u in act.usage} == {"agent", "abstention_judge"}
    assert act.termination == "final_answer" and act.answer.startswith("Reserved 2")


def test_rerun_reuses_finished_episodes(context):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    first_id, first = evaluate(context)
    scripted.register("agent", [])  # any model call now fails the test
    scripted.register("judge", [])
    second_id, second = evaluate(context)
    assert second.counts == first.counts and second.percent == first.percent
    attempts = Ledger(context.ledger).attempts(second_id)
    assert sorted(a["status"] for a in attempts) == ["reused", "reused"]


def test_infrastructure_error_is_rerun_not_scored(context):
    scripted.register("agent", [InfrastructureError("server_error", "HTTP 500")] + [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    run_id, m = evaluate(context)
    assert m.complete and m.counts["pair"] == 1
    statuses = [a["status"] for a in Ledger(context.ledger).attempts(run_id)]
    assert statuses.count("infrastructure_error") == 1 and statuses.count("done") == 2


def test_unrecovered_infrastructure_error_leaves_an_incomplete_run(context):
    context = Context(**{**context.__dict__, "max_infra_retries": 0})
    scripted.register("agent", [InfrastructureError("timeout", "no reply")] + [shop_agent] * 2)
    scripted.register("judge", [shop_judge])
    run_id, m = evaluate(context)
    assert not m.complete and (m.planned, m.finished) == (2, 1)
    assert m.percent is None and m.counts["abstain"] == 1 and m.totals["act"] == 0
    errors = [a for a in Ledger(context.ledger).attempts(run_id) if a["status"] == "infrastructure_error"]
    assert len(errors) == 1 and "timeout" in errors[0]["error"]


def test_resume_after_sigkill_runs_no_finished_episode_twice(tmp_path):
    env = {**os.environ, "HERA_RUNS": str(tmp_path / "runs")}
    ledger = str(tmp_path / "ledger.db")
    cmd = [sys.executable, "-m", "tests.drivers.evaluate_shop", ledger, str(tmp_path / "log1"), "run-1"]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.2)
        done = [a for a in Ledger(ledger).attempts("run-1") if a["status"] == "done"]
        if len(done) >= 3:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished_before = {a["episode_id"] for a in Ledger(ledger).attempts("run-1") if a["status"] == "done"}
    assert 3 <= len(finished_before) < 12
    cmd[-2] = str(tmp_path / "log2")
    subprocess.run(cmd, env=env, check=True, timeout=120)
    attempts = Ledger(ledger).attempts("run-1")
    executed = [a["episode_id"] for a in attempts if a["status"] == "done"]
    assert len(executed) == len(set(executed)) == 12
    assert len(Ledger(ledger).episodes("run-1")) == 12
    started_after = len((tmp_path / "log2").read_text().splitlines())
    assert started_after <= 12 - len(finished_before) + 1  # at most the one episode cut off mid-run starts again
