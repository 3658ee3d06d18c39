"""The evaluate graph end to end on the shop fixture with scripted models."""

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from graphs import api
from graphs.cli import main
from roles.abstention_judge import judge_id
from roles.models import scripted
from roles.models import ContextLimitError, InfrastructureError, endpoint_down
from state.context import ConfigError, Context, EpisodeRequest
from state.store import is_url
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge

PAIR = "shop-reserve-drill"


def evaluate(context, **kw):
    run = asyncio.run(api.evaluate("H0", [PAIR], context, **kw))
    return run.run_id, run.metrics


def test_both_sides_graded_and_scored_exactly(context):
    scripted.register("agent", [shop_agent] * 5)  # act: get_item, reserve, answer; abstain: get_item, refusal
    scripted.register("judge", [shop_judge])  # the refusal: a report of the reservation has no declining words and needs no judge
    run_id, m = evaluate(context)
    scripted.assert_consumed()
    assert m.complete and m.counts == {"abstain": 1, "act": 1, "pair": 1, "over_abstain": 0, "abstain_raw": 1, "pair_raw": 1}
    assert m.percent == {"abstain": 100.0, "act": 100.0, "pair": 100.0, "over_abstain": 0.0, "abstain_raw": 100.0, "pair_raw": 100.0}
    assert m.by_tier == {"standard": {"counts": m.counts, "totals": m.totals}} and m.ci95 is None  # one pair: no interval
    episodes = {e.key.side: e for e in Ledger(context.ledger).episodes(run_id)}
    act, abstain = episodes["act"], episodes["abstain"]
    assert [o.tool for o in act.observations] == ["get_item", "reserve"]
    assert (act.grade.success, act.grade.abstained, act.grade.committed) == (True, False, True)
    assert [o.tool for o in abstain.observations] == ["get_item"]
    assert (abstain.grade.success, abstain.grade.abstained, abstain.grade.committed, abstain.grade.grounded) == (True, True, False, True)
    assert abstain.grade.quote == "I cannot"
    assert {u.role for u in act.usage} == {"agent"} and {u.role for u in abstain.usage} == {"agent", "abstention_judge"}
    assert act.termination == "final_answer" and act.answer.startswith("Reserved 2")


def test_an_episode_claimed_in_process_has_its_journal_scope_looked_up_in_the_claims_trip(context, monkeypatch):
    """Its first model call makes no look of its own (`journal.look_ahead`): each episode's scope is looked up once,
    inside the trip that claimed the episode."""
    from graphs import evaluate as evaluate_graph
    from state import journal

    looks, claiming = [], threading.local()
    start, holds = evaluate_graph._start, journal._holds

    def claim(*args):
        claiming.now = True
        try:
            return start(*args)
        finally:
            claiming.now = False

    monkeypatch.setattr(evaluate_graph, "_start", claim)
    monkeypatch.setattr(journal, "_holds", lambda scope: looks.append((scope, getattr(claiming, "now", False))) or holds(scope))
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])
    evaluate(context)
    scripted.assert_consumed()
    episodes = [scope for scope, _ in looks if "/episode:" in scope]
    assert len(episodes) == len(set(episodes)) == 2 and all(ahead for scope, ahead in looks if scope in episodes)


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


def test_episodes_are_taken_in_the_planned_order_at_most_concurrency_attempts_at_once_and_reported_as_they_end(context, monkeypatch):
    from graphs import evaluate as evaluate_graph

    worker, attempt, start = evaluate_graph.episode_worker, evaluate_graph._attempt, evaluate_graph._start
    taken, started, ended, flight = [], [], [], Counter()

    def slow_first(request, *args):
        if (request.trial, request.side) == (0, "act"):
            time.sleep(0.2)  # its claim comes back after the next episodes': they still start after it
        return start(request, *args)

    async def counted(task, runtime, turn):
        request = task["request"]
        taken.append((request.trial, request.side))
        flight["in hand"] += 1
        flight["most in hand"] = max(flight["most in hand"], flight["in hand"])
        try:
            return await worker(task, runtime, turn)
        finally:
            flight["in hand"] -= 1
            ended.append((request.trial, request.side))

    async def attempted(entry, request, *args, **kwargs):
        """Counted as holding its place from its start until it gives the place back (`LEAVE`) or ends."""
        started.append((request.trial, request.side))
        flight["now"] += 1
        flight["most"] = max(flight["most"], flight["now"])
        leave, left = evaluate_graph.LEAVE.get(), []

        def leaving():
            if not left:
                left.append(True)
                flight["now"] -= 1
                flight["left before the end"] += 1
            leave()

        token = evaluate_graph.LEAVE.set(leaving)
        try:
            await asyncio.sleep(0.01)  # the others start now if the bound lets them
            return await attempt(entry, request, *args, **kwargs)
        finally:
            evaluate_graph.LEAVE.reset(token)
            if not left:
                flight["now"] -= 1

    monkeypatch.setattr(evaluate_graph, "episode_worker", counted)
    monkeypatch.setattr(evaluate_graph, "_attempt", attempted)
    monkeypatch.setattr(evaluate_graph, "_start", slow_first)
    scripted.register("agent", [shop_agent] * 15)
    scripted.register("judge", [shop_judge] * 3)  # one verdict per answer: the three refusals may share one
    told = []
    run = asyncio.run(api.evaluate("H0", [PAIR], context, trials=3, concurrency=2,
                                   on_episode=lambda r: told.append(((r.key.trial, r.key.side), len(ended)))))
    scripted.assert_consumed("agent")
    assert run.metrics.complete and run.metrics.counts["pair"] == 3
    assert taken == started == [(t, side) for t in range(3) for side in ("act", "abstain")]
    # two attempts holding a place at once, and the next episodes already in hand (claimed) beside them; each attempt
    # gave its place back once its model calls were done, before its replay ended
    assert flight["most"] == 2 and flight["most in hand"] == 4 and flight["left before the end"] == 6
    # each record reaches the caller right after its episode ends, not with the others at the run's end
    assert sorted(key for key, _ in told) == sorted(taken) and [n for _, n in told] == list(range(1, 7))


def test_an_episode_an_earlier_judge_graded_is_judged_again_when_reused_and_stored_so(context):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])
    first_id, _ = evaluate(context)
    ledger = Ledger(context.ledger)
    stored = {e.key.side: e for e in ledger.episodes(first_id)}
    assert {e.grade.judge for e in stored.values()} == {judge_id("scripted:judge")}
    old = stored["abstain"].grade.model_copy(update={"abstained": False, "success": False, "judge": ""})  # an earlier judge misread it
    ledger.regrade_episode(stored["abstain"].model_copy(update={"grade": old}))
    with sqlite3.connect(context.ledger) as db:  # the earlier judge's verdicts were cached under its own key
        db.execute("delete from judgements")
    scripted.register("agent", [])  # the trajectories are reused
    scripted.register("judge", [InfrastructureError("connection", "refused")] * 2)
    failed_id, failed = evaluate(context)
    assert not failed.complete and failed.finished == 1  # a judge that fails leaves the episode unscored, not graded
    assert ledger.episode(stored["abstain"].key.id).grade.judge == ""
    scripted.register("judge", [shop_judge])  # the refusal is judged again; the act side's grade is this judge's already
    second_id, second = evaluate(context, run_id=failed_id)
    scripted.assert_consumed()
    assert second.complete and second.counts["abstain"] == 1 and second.counts["pair"] == 1
    regraded = ledger.episode(stored["abstain"].key.id)
    assert (regraded.grade.abstained, regraded.grade.success, regraded.grade.judge) == (True, True, judge_id("scripted:judge"))
    assert regraded.observations == stored["abstain"].observations and regraded.grade.grounded == stored["abstain"].grade.grounded


def _with_copy(context: Context, tmp_path) -> Context:
    """`context` on a copy of the fixtures holding `shop-reserve-drill-again`: another id, the same environments and
    task as the drill pair (a twin of the same task, as evolved pairs are), so the same cache keys."""
    catalog = tmp_path / "catalog"
    shutil.copytree(FIXTURES, catalog)
    source = next(catalog.rglob(f"pairs/{PAIR}.yaml"))
    again = source.read_text().replace(f"id: {PAIR}\n", "id: shop-reserve-drill-again\n", 1).replace("task:\n", f"task:\n  id: {PAIR}\n", 1)
    source.with_name("shop-reserve-drill-again.yaml").write_text(again)
    return Context(**{**context.__dict__, "catalog": str(catalog)})


def test_an_episode_reused_for_another_pair_of_the_same_content_carries_that_pairs_id(context, tmp_path):
    """As a twin proposed again in a later run: another id, the same environments and task, so the same cache key."""
    context = _with_copy(context, tmp_path)
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    asyncio.run(api.evaluate("H0", [PAIR], context))
    scripted.register("agent", [])  # any model call now fails the test
    scripted.register("judge", [])
    run = asyncio.run(api.evaluate("H0", ["shop-reserve-drill-again"], context))
    assert run.metrics.complete and run.metrics.counts["pair"] == 1
    assert [(e.pair_id, e.key.side) for e in run.episodes] == [("shop-reserve-drill-again", "act"), ("shop-reserve-drill-again", "abstain")]
    assert {e.pair_id for e in Ledger(context.ledger).episodes(run.run_id)} == {"shop-reserve-drill-again"}
    assert sorted(a["status"] for a in Ledger(context.ledger).attempts(run.run_id)) == ["reused", "reused"]


def test_two_pairs_of_one_run_sharing_their_episodes_are_both_scored(context, tmp_path):
    """As a twin made from a pair's feasible side shares that pair's act episode: each pair keeps its own record."""
    context = _with_copy(context, tmp_path)
    scripted.register("agent", [shop_agent] * 5)  # one pair's two episodes: the other pair's are the same ones
    scripted.register("judge", [shop_judge] * 2)
    run = asyncio.run(api.evaluate("H0", [PAIR, "shop-reserve-drill-again"], context, concurrency=4))
    assert run.metrics.complete and run.metrics.totals["pair"] == 2 and run.metrics.counts["pair"] == 2
    asked = [(PAIR, "act"), (PAIR, "abstain"), ("shop-reserve-drill-again", "act"), ("shop-reserve-drill-again", "abstain")]
    assert [(e.pair_id, e.key.side) for e in run.episodes] == asked
    assert sorted((e.pair_id, e.key.side) for e in Ledger(context.ledger).episodes(run.run_id)) == sorted(asked)
    assert sorted(a["status"] for a in Ledger(context.ledger).attempts(run.run_id)) == ["done", "done", "reused", "reused"]


def test_a_run_on_another_ledger_makes_its_own_model_calls(context, tmp_path):
    for ledger in ("ledger.db", "other.db"):  # the same episodes, the same runs directory and call journal
        scripted.register("agent", [shop_agent] * 5)
        scripted.register("judge", [shop_judge])
        _, metrics = evaluate(Context(**{**context.__dict__, "ledger": str(tmp_path / ledger)}))
        scripted.assert_consumed()  # the second run's calls were made, not read back from the first run's journal
        assert metrics.complete and metrics.counts["pair"] == 1


def test_resuming_a_run_id_keeps_what_it_evaluated(context, capsys):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    run_id, _ = evaluate(context)
    shutil.rmtree(Path(os.environ["HERA_RUNS"]))  # the checkpoints are gone; the ledger still knows the run
    scripted.register("agent", [])
    scripted.register("judge", [])
    base = ["--catalog", str(FIXTURES), "--ledger", context.ledger]
    assert main([*base, "eval", "--model", "scripted:agent", "--judge-model", "scripted:judge", "--run-id", run_id, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["pairs"] == 1 and out["metrics"]["counts"]["pair"] == 1
    assert main([*base, "eval", "--model", "scripted:agent", "--run-id", run_id, "--pairs", "shop-rescued"]) == 2
    assert f"run {run_id} evaluated pair_ids=['shop-reserve-drill']" in capsys.readouterr().err


def test_a_context_overflow_is_scored_as_the_harness_failure(context):
    scripted.register("agent", [shop_agent, ContextLimitError("HTTP 400: the request exceeds the available context size")] * 2)
    scripted.register("judge", [])
    run_id, m = evaluate(context)
    scripted.assert_consumed()
    episodes = Ledger(context.ledger).episodes(run_id)
    assert {(e.status, e.termination, e.grade.success) for e in episodes} == {("done", "context_limit", False)}
    assert m.complete and m.counts["pair"] == 0 and m.counts["abstain"] == 0


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


def test_an_endpoint_lost_mid_run_stops_it_and_a_resume_loses_nothing(context):
    lost = InfrastructureError("connection", "refused")
    scripted.register("agent", [shop_agent] * 5 + [lost] * 3)  # trial 0 finishes; trial 1's act side twice, abstain once
    scripted.register("judge", [shop_judge])
    run_id, m = evaluate(context, trials=2)
    scripted.assert_consumed()  # the last episode was never started: the endpoint was down
    assert not m.complete and (m.planned, m.finished) == (4, 2)
    assert endpoint_down("scripted:agent").startswith("scripted:agent: 3 calls in a row found no endpoint answering")
    statuses = [a["status"] for a in Ledger(context.ledger).attempts(run_id)]
    # episodes run concurrently: an attempt of trial 1 may be recorded before trial 0's second one is
    assert sorted(statuses) == ["done", "done", "infrastructure_error", "infrastructure_error", "infrastructure_error"]
    scripted.register("agent", [shop_agent] * 5)  # back: the resume runs only trial 1
    scripted.register("judge", [])  # trial 1's answers are trial 0's, whose verdicts the ledger keeps
    assert evaluate(context, trials=2, run_id=run_id)[1].complete
    scripted.assert_consumed()
    statuses = [a["status"] for a in Ledger(context.ledger).attempts(run_id)]
    assert statuses.count("reused") == 2 and statuses.count("done") == 4


def test_a_run_stopped_by_an_error_is_resumed_under_its_turn_cap_only(context):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])

    def stop(record):
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError, match="stopped"):  # stopped inside the episodes: the run's checkpoint holds its pending work
        asyncio.run(api.evaluate("H0", [PAIR], context, run_id="stopped", on_episode=stop))
    with pytest.raises(ConfigError, match="run stopped evaluated max_turns=0"):  # its episodes under another cap are other episodes
        evaluate(replace(context, max_turns=3), run_id="stopped")
    assert evaluate(context, run_id="stopped")[1].complete
    scripted.assert_consumed()


def test_resume_after_sigkill_runs_no_finished_episode_twice(tmp_path, store):
    env = {**os.environ, "HERA_RUNS": str(tmp_path / "runs")}
    if is_url(store):  # the checkpoints and the call journal in the PostgreSQL store too
        env["HERA_STORE"] = store
    ledger = store
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


def test_hooks_steer_the_episode(context, tmp_path):
    """A bundle whose hooks block the state-changing call after the price is
    seen missing and ask the model one structured question before accepting."""
    bundle = tmp_path / "guarded"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    (bundle / "hooks.py").write_text(
        "from pydantic import BaseModel\n"
        "from langchain_core.messages import HumanMessage\n"
        "from harness.abi import BaseHarness, Decision, Final\n\n"
        "class Check(BaseModel):\n    complete: bool\n\n"
        "class Harness(BaseHarness):\n"
        "    def before_tool_call(self, view, call):\n"
        "        missing = any(o.ok and isinstance(o.output, dict) and o.output.get('price', 0) is None for o in view.observations)\n"
        "        if missing and not next(t for t in view.tools if t.name == call.name).read_only:\n"
        "            return Decision(action='block', message='Blocked: the price is missing.')\n"
        "        return Decision()\n\n"
        "    async def finalize(self, view, answer):\n"
        "        check = await view.ask([HumanMessage('Is this complete? ' + answer)], Check)\n"
        "        return Final() if check.complete else Final(action='abstain', text='I cannot complete this request.')\n"
    )

    def reckless(messages, tools):
        done = [m for m in messages if m.type == "tool"]
        if not done:
            return {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}
        if len(done) == 1:
            return {"tool_calls": [{"name": "reserve", "args": {"sku": "DR-220", "qty": 2}}]}
        return "Reserved 2 cordless drills at $89.00 each." if "reservation_id" in done[-1].content else "Done."

    # act: three turns, then the finalize question; abstain: the same (the reserve call is blocked)
    scripted.register("agent", [reckless] * 3 + [{"complete": True}] + [reckless] * 3 + [{"complete": False}])
    scripted.register("judge", [shop_judge] * 2)
    context = Context(**{**context.__dict__, "agent_model": "scripted:agent"})
    run = asyncio.run(api.evaluate(str(bundle), [PAIR], context))
    run_id, m = run.run_id, run.metrics
    episodes = {e.key.side: e for e in Ledger(context.ledger).episodes(run_id)}
    abstain = episodes["abstain"]
    assert [o.tool for o in abstain.observations] == ["get_item"]
    assert any(msg["data"]["content"] == "Blocked: the price is missing." for msg in abstain.messages)
    assert abstain.answer == "I cannot complete this request."
    assert {u.role for u in abstain.usage} >= {"agent", "harness"}
    assert m.counts["pair"] == 1 and not abstain.grade.committed
    turns = [c for c in scripted.calls("agent") if c.method == "complete"]
    assert {(c.max_tokens, c.temperature) for c in turns} == {(8192, None)}  # H0 keeps the model's own sampling


def test_config_limits_reach_the_model(context, tmp_path):
    bundle = tmp_path / "cool"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    (bundle / "config.yaml").write_text("max_turns: 30\nmax_output_tokens: 512\ntemperature: 0.2\n")
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    asyncio.run(api.evaluate(str(bundle), [PAIR], context))
    assert {(c.max_tokens, c.temperature) for c in scripted.calls("agent")} == {(512, 0.2)}


def test_the_agent_draws_the_same_seeds_under_every_harness_and_other_ones_on_each_trial_and_turn(context, tmp_path):
    """Common random numbers: an agent turn's sampling seed comes from the pair, side, seed, trial and turn, never from
    the harness, so two harnesses on a pair draw alike where their prompts agree; each trial and turn draws its own."""
    bundle = tmp_path / "other"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    (bundle / "config.yaml").write_text("max_turns: 30\nmax_output_tokens: 512\n")  # another harness hash
    scripted.register("agent", [shop_agent] * 20)
    scripted.register("judge", [shop_judge] * 4)
    seeds = {}
    for name in ("H0", str(bundle)):
        before = len(scripted.calls("agent"))
        run = asyncio.run(api.evaluate(name, [PAIR], context, trials=2))
        episodes = Ledger(context.ledger).episodes(run.run_id)
        assert len(episodes) == 4 and {e.key.sampling for e in episodes} == {"turn"}
        expected = sorted(EpisodeRequest(pair_id=PAIR, side=e.key.side, bundle=name, trial=e.key.trial).sampling_seed(turn)
                          for e in episodes for turn in range(sum(m["type"] == "ai" for m in e.messages)))
        seeds[name] = sorted(c.seed for c in scripted.calls("agent")[before:])
        assert seeds[name] == expected and len(set(expected)) == len(expected) == 10
    assert seeds["H0"] == seeds[str(bundle)]


def test_runs_and_episode_views(context, capsys):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    run_id, _ = evaluate(context)
    assert main(["--ledger", context.ledger, "runs", "list", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [run_id]
    assert main(["--ledger", context.ledger, "runs", "show", run_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert json.loads(shown["run"]["metrics"])["percent"]["pair"] == 100.0
    assert sorted(e["key"]["side"] for e in shown["episodes"]) == ["abstain", "act"]
    act = next(e for e in Ledger(context.ledger).episodes(run_id) if e.key.side == "act")
    assert main(["--ledger", context.ledger, "episode", "show", act.key.id, "--json"]) == 0
    sides = json.loads(capsys.readouterr().out)
    assert [s["key"]["side"] for s in sides] == ["act", "abstain"]
    assert sides[1]["answer"] == "I cannot reserve the drills: the drill has no price on record."
    assert main(["--ledger", context.ledger, "episode", "show", act.key.id]) == 0
    assert main(["--ledger", context.ledger, "runs", "show", run_id]) == 0


def test_a_bundle_check_runs_once_per_bundle_content(tmp_path, monkeypatch):
    from graphs import evaluate as evaluate_graph

    bundle = tmp_path / "checked"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    checked, problems = [], []
    monkeypatch.setattr(evaluate_graph, "check_bundle", lambda b: checked.append(b) or list(problems))
    monkeypatch.setattr(evaluate_graph, "_passed", set())  # H0's own pass, from earlier tests, covers this copy
    assert evaluate_graph._check(str(bundle)) == evaluate_graph._check(str(bundle)) == []
    assert len(checked) == 1
    (bundle / "config.yaml").write_text("max_turns: 29\nmax_output_tokens: 8192\n")
    assert evaluate_graph._check(str(bundle)) == []
    assert len(checked) == 2
    problems.append("hooks.py: broken")  # a failed check is never remembered
    (bundle / "config.yaml").write_text("max_turns: 28\nmax_output_tokens: 8192\n")
    assert evaluate_graph._check(str(bundle)) == evaluate_graph._check(str(bundle)) == ["hooks.py: broken"]
    assert len(checked) == 4


def test_half_an_emoji_from_the_model_is_recorded_as_a_replacement_character_not_a_crash(context):
    """A reply cut off inside an escaped emoji decodes to a lone surrogate, which no UTF-8 record can hold: in a call's
    arguments or in the answer it once crashed the run that recorded it."""
    def agent(messages, tools):
        if not [m for m in messages if m.type == "tool"]:
            return {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220\ud83d"}}]}
        return "I cannot reserve the drills \ud83d"

    def judge(messages, schema):  # a structured reply, quoting the answer as it was sent
        return {"verdict": "declines_all", "quote": "I cannot reserve the drills \ud83d", "reason": "declines"}

    scripted.register("agent", [agent] * 4)
    scripted.register("judge", [judge])  # one answer, judged once
    run = asyncio.run(api.evaluate("H0", [PAIR], context))
    scripted.assert_consumed()
    assert run.metrics.complete
    for episode in Ledger(context.ledger).episodes(run.run_id):
        assert episode.observations[0].args == {"sku": "DR-220\ufffd"} and episode.answer == "I cannot reserve the drills \ufffd"
        assert episode.grade.quote == "I cannot reserve the drills \ufffd"


def test_a_turn_budget_caps_every_episode_and_keys_the_cache(context):
    from dataclasses import replace

    scripted.register("agent", [shop_agent] * 20)
    scripted.register("judge", [shop_judge] * 4)
    run = asyncio.run(api.evaluate("H0", ["shop-reserve-drill"], replace(context, max_turns=1)))
    run_id, metrics = run.run_id, run.metrics
    capped = {e.key.side: e for e in Ledger(context.ledger).episodes(run_id)}
    # the first turn already calls a tool; with a budget of one turn the episode ends there, unanswered
    assert {s: (e.termination, len([m for m in e.messages if m["type"] == "ai"])) for s, e in capped.items()} == {
        "act": ("turn_limit", 1), "abstain": ("turn_limit", 1)}
    assert all(e.key.max_turns == 1 for e in capped.values()) and metrics.counts["act"] == 0
    run = asyncio.run(api.evaluate("H0", ["shop-reserve-drill"], context))
    run_id = run.run_id
    free = {e.key.side: e for e in Ledger(context.ledger).episodes(run_id)}
    # without the budget the same episodes are new rollouts, not the capped ones from the cache
    assert {s: e.termination for s, e in free.items()} == {"act": "final_answer", "abstain": "final_answer"}
    assert all(free[s].key.id != capped[s].key.id for s in free)


def test_structured_turns_and_compact_results_leave_grading_untouched(context, tmp_path):
    bundle = tmp_path / "small"
    shutil.copytree(Path("harness/bundles/H0"), bundle)
    (bundle / "config.yaml").write_text("max_turns: 8\naction_mode: structured\n")
    (bundle / "components.yaml").write_text("- name: compact_observations\n  params: {min_chars: 0, rows: 1}\n")
    scripted.register("agent", [{"tool": "list_items", "arguments": {}}, {"tool": "get_item", "arguments": {"sku": "DR-220"}},
                                {"tool": "reserve", "arguments": {"sku": "DR-220", "qty": 2}},
                                {"final_answer": "Reserved 2 cordless drills at $89.00 each."}])
    scripted.register("judge", [])  # the act side reports the reservation: no judge
    run = asyncio.run(api.evaluate(str(bundle), [PAIR], context, sides=["act"]))
    run_id, m = run.run_id, run.metrics
    scripted.assert_consumed()
    [act] = Ledger(context.ledger).episodes(run_id)
    listed = act.observations[0]
    assert listed.tool == "list_items" and len(listed.output) == 3  # the record keeps the whole result
    assert json.loads(listed.shown) == [listed.output[0], "... 2 more; narrow the search to see them"]
    shown = [msg["data"]["content"] for msg in act.messages if msg["type"] == "tool"]
    assert shown[0] == listed.shown and act.grade.success and m.counts["act"] == 1
    assert all(c.action_mode == "structured" for c in scripted.calls("agent"))


def test_a_turn_outside_the_grammar_is_an_infrastructure_error_and_is_run_again(context, tmp_path):
    bundle = tmp_path / "small"
    shutil.copytree(Path("harness/bundles/H0"), bundle)
    (bundle / "config.yaml").write_text("max_turns: 8\naction_mode: structured\n")
    scripted.register("agent", ["1. `get_item`: {\"sku\": \"DR-", {"tool": "get_item", "arguments": {"sku": "DR-220"}},
                                {"tool": "reserve", "arguments": {"sku": "DR-220", "qty": 2}},
                                {"final_answer": "Reserved 2 cordless drills at $89.00 each."}])
    scripted.register("judge", [shop_judge])
    run = asyncio.run(api.evaluate(str(bundle), [PAIR], context, sides=["act"]))
    run_id, m = run.run_id, run.metrics
    attempts = Ledger(context.ledger).attempts(run_id)
    assert [a["status"] for a in attempts] == ["infrastructure_error", "done"] and "malformed" in attempts[0]["error"]
    assert m.counts["act"] == 1 and m.totals["act"] == 1


def test_two_concurrent_evaluations_run_each_episode_once(context, monkeypatch):
    from graphs import evaluate as evaluate_graph
    from graphs.report import evaluation
    from state import ledger as ledger_module

    monkeypatch.setattr(evaluate_graph, "POLL_S", 0.01)
    waited = threading.Event()
    claim = ledger_module.Ledger.claim_episode

    def claim_episode(self, *args):
        cached, holder = claim(self, *args)
        if holder is not None:
            waited.set()
        return cached, holder

    monkeypatch.setattr(ledger_module.Ledger, "claim_episode", claim_episode)

    async def first_turn(messages, tools):
        for _ in range(1000):  # a bounded wait: the other run finds this episode claimed before it can finish
            if waited.is_set():
                break
            await asyncio.sleep(0.01)
        return shop_agent(messages, tools)

    # the model calls of one evaluation, strictly: a second computation of any episode would fail the script
    scripted.register("agent", [first_turn] + [shop_agent] * 4)
    scripted.register("judge", [shop_judge])

    async def both():
        return await asyncio.gather(api.evaluate("H0", [PAIR], context, run_id="one"), api.evaluate("H0", [PAIR], context, run_id="two"))

    one, two = (run.metrics for run in asyncio.run(both()))
    scripted.assert_consumed()
    assert waited.is_set()
    assert one == two and one.complete and one.counts["pair"] == 1
    ledger = Ledger(context.ledger)
    assert evaluation(ledger, "one")[0] == one and evaluation(ledger, "two")[0] == two
    statuses = sorted(a["status"] for run in ("one", "two") for a in ledger.attempts(run))
    assert statuses == ["done", "done", "reused", "reused"]
    assert ledger.claims() == []


def test_two_evaluating_processes_run_each_episode_once(tmp_path):
    from state.metrics import Metrics
    from graphs.report import evaluation

    env = {**os.environ, "HERA_RUNS": str(tmp_path / "runs")}
    ledger, log = str(tmp_path / "ledger.db"), tmp_path / "log"
    log.touch()
    procs = {run: subprocess.Popen([sys.executable, "-m", "tests.drivers.evaluate_beside", ledger, str(log), run], env=env,
                                   stdout=subprocess.PIPE, text=True) for run in ("one", "two")}
    printed = {run: Metrics.model_validate_json(p.communicate(timeout=180)[0]) for run, p in procs.items()}
    assert {p.returncode for p in procs.values()} == {0}
    lines = [line.split() for line in log.read_text().splitlines()]
    calls = sorted(what for _, what in lines if what != "waiting")
    assert calls == ["agent"] * 5 + ["judge"]  # what one evaluation asks, across both processes
    assert any(what == "waiting" for _, what in lines)
    assert printed["one"] == printed["two"] and printed["one"].complete and printed["one"].counts["pair"] == 1
    for run, metrics in printed.items():
        assert evaluation(Ledger(ledger), run)[0] == metrics


def test_a_claim_of_a_live_process_on_the_run_refuses_a_second_evaluation(context, capsys):
    Ledger(context.ledger).claim_run("busy", "another-owner")  # this process is alive: the claim stands
    scripted.register("agent", [])
    scripted.register("judge", [])
    base = ["--catalog", str(FIXTURES), "--ledger", context.ledger]
    assert main([*base, "eval", "--model", "scripted:agent", "--pairs", PAIR, "--run-id", "busy"]) == 2
    assert f"run busy is being evaluated by pid {os.getpid()} on" in " ".join(capsys.readouterr().err.split())
    assert Ledger(context.ledger).attempts("busy") == []


def candidate(tmp_path, name: str, hooks: str) -> str:
    """A copy of H0 with these hooks: a candidate, so they run in the sandbox."""
    bundle = tmp_path / name
    shutil.copytree(Path(__file__).parent.parent / "harness" / "bundles" / "H0", bundle)
    (bundle / "hooks.py").write_text("from harness.abi import BaseHarness, Decision, Final\n\n" + hooks)
    return str(bundle)


def test_a_hook_error_is_stored_with_its_message_and_shown(context, tmp_path, capsys, monkeypatch):
    from graphs import cli

    bundle = candidate(tmp_path, "quota", "class Harness(BaseHarness):\n    def before_tool_call(self, view, call):\n"
                                          "        if call.name == 'get_item':\n            raise RuntimeError('quota exceeded')\n"
                                          "        return Decision()\n")
    scripted.register("agent", [shop_agent] * 2)  # each side's first turn calls get_item; the hook fails; no answer to judge
    scripted.register("judge", [])
    run = asyncio.run(api.evaluate(bundle, [PAIR], context))
    run_id, m = run.run_id, run.metrics
    scripted.assert_consumed()
    episodes = Ledger(context.ledger).episodes(run_id)
    where = f"{bundle}/hooks.py: Harness.before_tool_call: raised RuntimeError: quota exceeded\nTraceback"
    assert [(e.status, e.termination, e.error.startswith(where)) for e in episodes] == [("done", "harness_error", True)] * 2
    assert m.complete and m.counts["act"] == m.counts["abstain"] == 0  # the candidate's failure is scored
    monkeypatch.setattr(cli.console, "width", 400)
    assert main(["--ledger", context.ledger, "episode", "show", episodes[0].key.id]) == 0
    cells = [cell.strip() for line in capsys.readouterr().err.splitlines() for cell in line.split("│")]
    assert cells.count(f"error: {bundle}/hooks.py: Harness.before_tool_call: raised RuntimeError: quota exceeded") == 2


STOCK_REPORT = '''

@read_tool
def stock_report(db) -> dict:
    """Returns when the stock was last counted."""
    return {"counted": object()}
'''


@pytest.mark.parametrize("call, fault", [
    ({"name": "buggy_write", "args": {"sku": "DR-220"}}, 'buggy_write({"sku": "DR-220"}): buggy_write failed: ZeroDivisionError: division by zero'),
    ({"name": "stock_report", "args": {}},
     "stock_report({}): tool returned a value that is not JSON: Object of type object is not JSON serializable"),
])
def test_a_tool_that_crashes_is_an_environment_fault_not_scored_nor_run_again(context, tmp_path, capsys, call, fault):
    catalog = tmp_path / "catalog"
    shutil.copytree(FIXTURES, catalog)
    with open(catalog / "shop" / "tools.py", "a") as f:
        f.write(STOCK_REPORT)
    scripted.register("agent", [{"tool_calls": [call]}] * 2)  # one turn a side: the episode ends at the fault
    scripted.register("judge", [])
    run = asyncio.run(api.evaluate("H0", [PAIR], Context(**{**context.__dict__, "catalog": str(catalog)})))
    run_id, m = run.run_id, run.metrics
    scripted.assert_consumed()  # and not re-run: the same call fails the same way
    attempts = Ledger(context.ledger).attempts(run_id)
    assert [(a["side"], a["status"], a["error"]) for a in attempts] == [
        (side, "infrastructure_error", f"environment fault: {fault}") for side in ("act", "abstain")]
    assert not m.complete and m.finished == 0 and m.counts["over_abstain"] == 0 and Ledger(context.ledger).episodes(run_id) == []
    assert main(["--ledger", context.ledger, "runs", "show", run_id, "--json"]) == 0
    unfinished = json.loads(capsys.readouterr().out)["unfinished"]
    assert [(u["pair_id"], u["side"], u["error"]) for u in unfinished] == [(PAIR, side, f"environment fault: {fault}") for side in ("act", "abstain")]


def test_a_hook_lookup_of_a_crashing_tool_is_an_environment_fault(context, tmp_path):
    bundle = candidate(tmp_path, "looker", "class Harness(BaseHarness):\n    async def before_tool_call(self, view, call):\n"
                                           "        if view.lookup and call.name == 'get_item':\n"
                                           "            await view.lookup('sneaky_read', {'sku': 'DR-220'})\n"
                                           "        return Decision()\n")
    scripted.register("agent", [shop_agent] * 2)
    scripted.register("judge", [])
    run = asyncio.run(api.evaluate(bundle, [PAIR], Context(**{**context.__dict__, "max_infra_retries": 0})))
    run_id, m = run.run_id, run.metrics
    scripted.assert_consumed()
    errors = {a["side"]: a["error"] for a in Ledger(context.ledger).attempts(run_id)}
    assert errors == {side: 'environment fault: sneaky_read({"sku": "DR-220"}): sneaky_read failed: '
                            "OperationalError: attempt to write a readonly database" for side in ("act", "abstain")}
    assert m.finished == 0


def test_hook_answers_and_results_are_capped_before_storage_and_the_judge(context, tmp_path):
    from state.records import MAX_TEXT

    bundle = candidate(tmp_path, "verbose", "class Harness(BaseHarness):\n"
                                            "    def present_result(self, view, call, observation):\n        return 'r' * 300_000\n\n"
                                            "    def finalize(self, view, answer):\n"
                                            "        return Final(action='replace', text='I cannot. ' + 'x' * 1_000_000)\n")
    judged = []

    def look_then_answer(messages, tools):
        return "Done." if any(m.type == "tool" for m in messages) else {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}

    scripted.register("agent", [look_then_answer] * 4)
    scripted.register("judge", [lambda messages, schema: judged.append(messages[-1].content) or shop_judge(messages, schema)] * 2)
    run = asyncio.run(api.evaluate(bundle, [PAIR], context))
    run_id = run.run_id
    answer = "I cannot. " + "x" * (MAX_TEXT - 10) + "\n[... truncated by hera: 1,000,010 characters, the first 65,536 kept]"
    episodes = Ledger(context.ledger).episodes(run_id)
    assert [e.answer for e in episodes] == [answer, answer]
    shown = "r" * MAX_TEXT + "\n[... truncated by hera: 300,000 characters, the first 65,536 kept]"
    assert {o.seen for e in episodes for o in e.observations} == {shown}
    assert {m["data"]["content"] for e in episodes for m in e.messages if m["type"] == "tool"} == {shown}
    assert len(judged) == 1 and answer in judged[0] and len(judged[0]) < MAX_TEXT + 5_000  # one verdict, cached for both


def test_a_ledger_emptied_under_checkpointed_runs_is_said_and_its_runs_are_not_resumed(context, capsys):
    from state import ledger as ledger_module

    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    run_id, _ = evaluate(context)
    path = Path(context.ledger).resolve()
    ledger_module._open.pop(path)[0].conn.close()  # as a new process: no connection open on the old file
    path.write_bytes(b"")
    base = ["--catalog", str(FIXTURES), "--ledger", context.ledger]
    checkpoints = Path(os.environ["HERA_RUNS"]) / "checkpoints.db"
    assert main([*base, "runs", "list", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [] and " ".join(err.split()) == (
        f"note: the ledger {path} holds no runs, but {checkpoints} holds checkpoints of 1 evaluation run(s) ({run_id}): "
        "if they were recorded in this ledger, it was emptied or replaced; restore it from a backup")
    lost = f"run {run_id} has checkpoints in {checkpoints} but no row in the ledger {path}: the ledger was emptied or replaced; restore it from a backup"
    assert main([*base, "runs", "show", run_id]) == 2
    assert " ".join(capsys.readouterr().err.split()) == f"error: {lost}"
    scripted.register("agent", [])  # a resume must not run anything
    scripted.register("judge", [])
    assert main([*base, "eval", "--model", "scripted:agent", "--judge-model", "scripted:judge", "--run-id", run_id, "--split", "train"]) == 2
    assert f"error: {lost}, or start a new run (without --run-id); nothing was evaluated" in " ".join(capsys.readouterr().err.split())
    assert Ledger(context.ledger).runs() == [] and Ledger(context.ledger).attempts(run_id) == []


@pytest.mark.parametrize("failure, recorded", [
    (OSError("MCP server pipe closed"), True), (ExceptionGroup("session", [ConnectionResetError("reset")]), True),
    (KeyError("verified"), False), (ExceptionGroup("session", [OSError("pipe"), KeyError("verified")]), False),
])
def test_only_an_infrastructure_failure_is_recorded_and_re_run_our_own_bug_fails_the_run(context, monkeypatch, failure, recorded):
    from graphs import evaluate as evaluate_graph

    async def broken(*args, **kwargs):
        raise failure

    monkeypatch.setattr(evaluate_graph, "run_episode", broken)
    if recorded:
        run_id, m = evaluate(context)  # both sides, each tried 1 + max_infra_retries times, none scored
        attempts = Ledger(context.ledger).attempts(run_id)
        assert not m.complete and [a["status"] for a in attempts] == ["infrastructure_error"] * 4
    else:
        with pytest.raises((KeyError, ExceptionGroup)):
            evaluate(context)


def test_a_run_an_older_graph_left_unfinished_starts_again_from_the_planner(context):
    """An interrupted evaluation's checkpoint whose pending task names a node the graph no longer has (its
    episodes were once a `Send` each to `episode_worker`) shows no task to this graph: the run is planned again,
    not resumed into nothing."""
    from langgraph.graph import END, START, StateGraph
    from graphs import evaluate as evaluate_graph, runner
    from state.paths import RunPaths

    async def episode_worker(task):
        raise RuntimeError("interrupted")

    old = StateGraph(evaluate_graph.EvaluateState, context_schema=Context)
    old.add_node("planner", evaluate_graph.planner)
    old.add_node("episode_worker", episode_worker)
    old.add_edge(START, "planner")
    old.add_edge("planner", "episode_worker")
    old.add_edge("episode_worker", END)

    async def interrupted():
        RunPaths.here().root.mkdir(parents=True, exist_ok=True)
        async with runner.checkpointer(RunPaths.here().checkpoints) as saver:
            graph = old.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "older"}}
            with pytest.raises(RuntimeError, match="interrupted"):
                await graph.ainvoke({"run_id": "older", "bundle": "H0", "pair_ids": [PAIR], "trials": 1, "seed": 0}, config,
                                    context=context, durability="exit")
            return [t.name for t in (await graph.aget_state(config)).tasks]

    assert asyncio.run(interrupted()) == ["episode_worker"]
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])
    run_id, m = evaluate(context, run_id="older")
    scripted.assert_consumed()
    assert run_id == "older" and m.complete and m.counts["pair"] == 1


def test_an_evaluation_inside_a_graph_node_tells_that_graphs_stream_of_each_episode(context):
    """A node that evaluates and writes each episode to its own graph's stream as it ends (the co-evolution's
    progress asks LangGraph for the writer then) reaches that graph's stream, not the evaluation's."""
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        done: int

    async def evaluating(state: State) -> dict:
        run = await api.evaluate("H0", [PAIR], context, on_episode=lambda r: get_stream_writer()({"episode": r.key.side}))
        return {"done": len(run.episodes)}

    outer = StateGraph(State)
    outer.add_node(evaluating)
    outer.add_edge(START, "evaluating")
    outer.add_edge("evaluating", END)
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge])

    async def streamed():
        return [chunk async for chunk in outer.compile().astream({}, stream_mode=["custom", "updates"])]

    chunks = asyncio.run(streamed())
    assert sorted(value["episode"] for kind, value in chunks if kind == "custom") == ["abstain", "act"]
    assert ("updates", {"evaluating": {"done": 2}}) in chunks
