"""Co-evolution with scripted models: round bookkeeping (the pool grows by a
batch a round, validation stays fixed, the bench split reaches no role), the
baselines' wiring, and resuming after a SIGKILL."""

import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
import yaml

from graphs import api, coevolution
from state.paths import RunPaths
from roles.models import scripted
from state.context import Context
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import accept_review as ACCEPT, eager_agent, shop_judge

PARENT = "shop-reserve-drill"
ROOT = Path(__file__).parent.parent
CAUSE = {"cause": "It changes state without confirming the required facts.", "evidence": "reserve right after a lookup with no price"}
SPEC = {"failure_patterns": ["acts although a required fact is missing"],
        "changes": [{"component": "prompts", "description": "ask for care", "rationale": "the agent writes without checking"}],
        "skills": [], "implementation_notes": ""}
# an edit that changes nothing the scripted agent reacts to: the candidate never beats its parent, so H0 stays
# the harness, keeps failing to abstain, and every round's batch is admitted
EDIT = {"rationale": "ask for care", "system_prompt_addition": "Be careful.", "components": [], "skills": [], "max_turns": None}
HELD_OUT = {"validation": "Validation task: reserve two cordless drills and tell me the unit price.",
            "bench": "Bench task: reserve two cordless drills and tell me the unit price."}


def make_catalog(root: Path) -> Path:
    """The shop fixture with one training pair and its copies as a validation and a bench pair (their own words)."""
    catalog = root / "catalog"
    shutil.copytree(FIXTURES / "shop", catalog / "shop")
    for path in (catalog / "shop" / "pairs").glob("*.yaml"):
        if path.stem != PARENT:
            path.unlink()
    pair = yaml.safe_load((catalog / "shop" / "pairs" / f"{PARENT}.yaml").read_text())
    for split, instruction in HELD_OUT.items():
        copy = {**pair, "id": f"{split}-drill", "split": split, "task": {**pair["task"], "instruction": instruction}}
        (catalog / "shop" / "pairs" / f"{split}-drill.yaml").write_text(yaml.safe_dump(copy, sort_keys=False))
    return catalog


def mutation() -> dict:
    return yaml.safe_load((FIXTURES / "shop" / "pairs" / f"{PARENT}.yaml").read_text())["mutation"]


def propose(messages, schema):
    if schema.__name__ == "DesignPlan":
        return {"targets": [{"parent": PARENT, "category": "missing_evidence", "idea": "hide the price"}]}
    if schema.__name__ == "MenuChoice":  # the menu's change that empties the price, as the fixture's own mutation does,
        # else (the task has twins enough of that category: `spread`) the first one offered
        lines = [line for line in messages[0].content.splitlines() if re.match(r"O\d+ \[", line)]
        line = next((line for line in lines if "] empty items[DR-220].price" in line), lines[0])
        return {"option": line.split()[0], "description": "the price is gone", "requirement": "the price must be stated"}
    return mutation()


def analyse(messages, schema):
    return CAUSE if schema.__name__ == "GroupCause" else SPEC


def register_models(wrap=lambda name, step: step) -> None:
    for name, step, n in (("agent", eager_agent, 400), ("judge", shop_judge, 100), ("proposer", propose, 20),
                          ("reviewer", ACCEPT, 40), ("analyst", analyse, 20), ("optimizer", EDIT, 10)):
        scripted.register(name, [wrap(name, step)] * n)


def models(catalog: Path, ledger: Path | str) -> Context:
    return Context(agent_model="scripted:agent", judge_model="scripted:judge", analyst_model="scripted:analyst",
                   optimizer_model="scripted:optimizer", proposer_model="scripted:proposer", reviewer_model="scripted:reviewer",
                   catalog=str(catalog), ledger=str(ledger))


SETTINGS = {"rounds": 2, "proposers": 1, "batch_size": 1, "budget": 1, "max_refinements": 0, "candidates": 1,
            "mode": "aggregate", "review_rounds": 1}


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield models(make_catalog(tmp_path), tmp_path / "ledger.db")
    scripted.clear()


def test_rounds_grow_the_pool_by_a_batch_keep_validation_and_hide_the_bench(context, monkeypatch):
    register_models()
    tried, block = [], coevolution.run_harness_evolution

    async def spy(*args, **kwargs):
        tried.append(kwargs["tried"])
        return await block(*args, **kwargs)

    monkeypatch.setattr(coevolution, "run_harness_evolution", spy)
    run_id, final = asyncio.run(api.run_coevolution("H0", context, run_id="co-1", **SETTINGS))
    # the second block knows which failure group the first block's candidate started from
    assert tried == [[], ["forbidden_action/missing_evidence"]]
    rounds = Ledger(context.ledger).rounds(run_id)
    assert [r["round"] for r in rounds] == [1, 2]
    pools = [json.loads(r["pool"]) for r in rounds]
    assert [len(p) for p in pools] == [1 + 1, 1 + 2] and pools[0][0] == PARENT and pools[1][:2] == pools[0]
    batches = json.loads(rounds[-1]["batches"])
    assert list(batches) == ["initial", "round-1-1", "round-2-1"] and batches["initial"] == [PARENT]
    assert final["pool"] == pools[-1] and [r["round"] for r in final["results"]] == [1, 2, "bench"]
    # validation is the same pair every round; the bench pair is scored once, at the end, by the final harness
    for r in rounds:
        assert json.loads(Ledger(context.ledger).run(r["validation_run"])["pairs"]) == ["validation-drill"]
    assert rounds[-1]["bench_run"] == "co-1-bench"
    bench_runs = {e.pair_id: run for run in [r["id"] for r in Ledger(context.ledger).runs()] for e in Ledger(context.ledger).episodes(run)}
    assert bench_runs["bench-drill"] == "co-1-bench"
    # the run's own catalog, which every role reads, never held the bench pair
    assert not list((RunPaths.here().coevolution_run(run_id) / "catalog").glob("*/pairs/bench-drill.yaml"))
    prompts = "\n".join(m.content for name in ("proposer", "reviewer", "analyst", "optimizer")
                        for c in scripted.calls(name) for m in c.messages)
    assert "Reserve two cordless drills" in prompts
    for split, instruction in HELD_OUT.items():
        assert instruction not in prompts and f"{split}-drill" not in prompts
    # each round's harness: H0 was never beaten, and every candidate is in the lineage with why
    assert [r["harness"] for r in final["results"][:2]] == ["co-1-h1:H0", "co-1-h2:H0"]
    rejected = [e for e in final["lineage"].values() if e.parent_id]
    assert len(rejected) == 2 and all(not e.adopted and "neither validation Abstain (grounded) nor Pair (grounded) rose" in e.reason for e in rejected)
    # the thread shows each round's sub-runs and the nodes they ran, the same when a finished run is read again
    assert [(s["round"], s["graph"], s["run"]) for s in final["steps"]] == [
        (1, "env_evolution", "co-1-e1"), (1, "harness_evolution", "co-1-h1"), (2, "env_evolution", "co-1-e2"), (2, "harness_evolution", "co-1-h2")]
    assert all(s["nodes"][0] == "environment_designer" and "screener" in s["nodes"] for s in final["steps"][::2])
    assert all(s["nodes"][0] == "baseline" and s["nodes"][-1] == "selector" for s in final["steps"][1::2])
    assert asyncio.run(api.run_coevolution("H0", context, run_id="co-1", **SETTINGS))[1]["steps"] == final["steps"]


@pytest.mark.parametrize("env,growth,designs", [
    ("none", [1, 1], 0),        # harness-only evolution: the initial pool throughout
    ("augment", [2, 3], 2),     # a batch a round, designed without a diagnosis, admitted unscreened
    ("h0", [2, 3], 2),          # both batches designed in round 1 from H0's failures, released one a round
])
def test_baselines_grow_the_pool_as_configured(context, env, growth, designs):
    register_models()
    run_id, final = asyncio.run(api.run_coevolution("H0", context, env=env, bench=[], **SETTINGS))
    pools = [json.loads(r["pool"]) for r in Ledger(context.ledger).rounds(run_id)]
    assert [len(p) for p in pools] == growth
    plans = [c for c in scripted.calls("proposer") if c.schema.__name__ == "DesignPlan"]
    assert len(plans) == designs
    if env == "augment":
        assert all("0 failures in 0 episodes." in c.messages[0].content for c in plans)
        assert all(b["needed"] == 0 for r in range(1, 3) for b in Ledger(context.ledger).batches(f"{run_id}-e{r}"))
    if env == "h0":
        screens = Ledger(context.ledger).batches(f"{run_id}-e1")
        assert [b["admitted"] for b in screens] == [1, 1] and not Ledger(context.ledger).batches(f"{run_id}-e2")


def test_every_block_scores_the_validation_pairs_over_the_gate_trials(context):
    register_models()
    run_id, _ = asyncio.run(api.run_coevolution("H0", context, env="none", bench=[], **SETTINGS, gate_trials=2))
    ledger = Ledger(context.ledger)
    rounds = ledger.rounds(run_id)
    assert len(rounds) == 2
    assert [(ledger.run(r["validation_run"])["trials"], ledger.run(r["train_run"])["trials"]) for r in rounds] == [(2, 1)] * 2


def journaled_roles(name: Path, store: str | None) -> Counter:
    if store:
        with psycopg.connect(store) as db:
            replies = db.execute("select reply from journal.calls").fetchall()
    else:
        with sqlite3.connect(name / "runs" / "calls.db") as db:
            replies = db.execute("select reply from calls").fetchall()
    return Counter(json.loads(reply)["usage"]["role"] for (reply,) in replies)


@pytest.mark.parametrize("role,nth,where", [
    ("agent", 6, "sqlite"),       # in the middle of an episode of round 1's diagnosis
    ("optimizer", 1, "sqlite"),   # inside round 1's harness-evolution block, after its coding agent answered
    ("optimizer", 1, "postgres"),  # the same with ledger, journal and checkpoints in PostgreSQL
])
def test_resume_after_sigkill_repeats_no_finished_episode_or_model_call(tmp_path, role, nth, where, request):
    catalog = make_catalog(tmp_path)
    stores = {name: request.getfixturevalue("postgres_databases")() if where == "postgres" else None for name in ("whole", "killed")}

    def driver(name: str) -> tuple[list[str], dict]:
        env = {**os.environ, "HERA_RUNS": str(tmp_path / name / "runs"), "PYTHONPATH": str(ROOT)}
        if stores[name]:
            env["HERA_STORE"] = stores[name]
        (tmp_path / name).mkdir(exist_ok=True)
        args = [str(catalog), stores[name] or str(tmp_path / name / "ledger.db"), str(tmp_path / name / "calls.log"), "co-kill"]
        return [sys.executable, "-m", "tests.drivers.coevolve_shop", *args], env

    # the reference: the same run, never interrupted
    cmd, env = driver("whole")
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=300)
    whole = Counter((tmp_path / "whole" / "calls.log").read_text().splitlines())

    cmd, env = driver("killed")
    log = tmp_path / "killed" / "calls.log"
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (log.read_text() if log.exists() else "").splitlines().count(role) < nth:
            time.sleep(0.005)
        assert first.poll() is None, "the driver finished before it could be killed"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    lines = log.read_text().splitlines()
    assert lines.count(role) >= nth and lines.count(role) < whole[role]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # finished calls (kept in the journal) by role: none skipped — the killed run's journal holds what the whole
    # run's does — and none made again after the resume (each is logged once more when it is); a call in flight
    # at the kill was not finished and is made after the resume. A kill between a journal write and its log line
    # leaves the log one short, never over.
    assert journaled_roles(tmp_path / "killed", stores["killed"]) == journaled_roles(tmp_path / "whole", stores["whole"])
    finished = Counter(line for line in log.read_text().splitlines() if line.startswith("done "))
    reference = Counter(line for line in (tmp_path / "whole" / "calls.log").read_text().splitlines() if line.startswith("done "))
    assert any(line.startswith("done ") for line in lines)
    assert finished <= reference and reference.total() - finished.total() <= 1, f"{dict(finished)} against {dict(reference)}"
    if stores["killed"]:  # nothing of the run went to SQLite files
        assert not list((tmp_path / "killed").rglob("*.db")) and not (tmp_path / "killed" / "ledger.db").exists()
    ledger = Ledger(stores["killed"] or tmp_path / "killed" / "ledger.db")
    assert [r["round"] for r in ledger.rounds("co-kill")] == [1, 2]
    executed = [a["episode_id"] for run in ledger.runs() for a in ledger.attempts(run["id"]) if a["status"] == "done"]
    assert len(executed) == len(set(executed)), "an episode that finished was run again"


def any_role(messages, second):
    """One scripted model for every role, as `--model` gives one model to all of them."""
    if not isinstance(second, type):
        return eager_agent(messages, second)
    replies = {"GroupCause": CAUSE, "ModificationSpec": SPEC, "StructuredEdit": EDIT}
    if second.__name__ in ("Review", "RescueClaim", "Feasibility"):
        return ACCEPT(messages, second)
    if second.__name__ in replies:
        return replies[second.__name__]
    return propose(messages, second) if second.__name__ in ("DesignPlan", "Mutation", "MenuChoice") else shop_judge(messages, second)


def test_compare_runs_each_method_on_the_same_protocol_and_coevolve_writes_a_report(context, capsys):
    from graphs.cli import main

    scripted.register("all", [any_role] * 400)
    protocol = ["--model", "scripted:all", "--train", "1", "--validation", "1", "--bench", "1", "--rounds", "1",
                "--proposers", "1", "--batch-size", "1", "--budget", "1", "--candidates", "1", "--json"]
    base = ["--catalog", context.catalog, "--ledger", context.ledger]
    assert main([*base, "compare", "h0", "aggregated", *protocol]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    stages = [line.split("] ", 1)[1] for line in captured.err.splitlines() if line.startswith("[")]
    assert stages[-5:-2] == ["aggregated: next round", "aggregated: scoring the final harness on the bench", "aggregated: done"], stages
    results = {r["method"]: r for r in out["methods"]}
    assert list(results) == ["h0", "aggregated"]
    for name, r in results.items():
        # the eager agent completes the feasible side and never abstains, whichever harness
        assert (r["bench"]["counts"]["abstain"], r["bench"]["counts"]["act"], r["bench"]["counts"]["pair"]) == (0, 1, 0), name
        assert json.loads(Ledger(context.ledger).run(r["run_id"] if name == "h0" else f"{r['run_id']}-bench")["pairs"]) == ["bench-drill"]
        assert r["tokens"] > 0 and r["wall_s"] > 0, name
    assert results["h0"]["harness"] == "H0" and results["h0"]["difference"] is None and results["h0"]["adopted"] is None
    # against H0 on the one bench pair: no change, and no interval on one pair
    assert results["aggregated"]["difference"]["pair"] | {"ci95": None} == {"pairs": 1, "difference": 0.0, "ci95": None, "up": 0, "down": 0}
    assert results["aggregated"]["adopted"] in (0, 1)
    # the aggregated run's tokens are its block's model calls and every episode it scored, cache reuse included
    assert results["aggregated"]["tokens"] > results["h0"]["tokens"]
    html = Path(out["report"]["html"]).read_text()
    assert "Comparison" in html and "Δ Pair" in html and f"{out['run_id']}-aggregated" in html and "aggregated: Co-evolution dynamics (HERA Fig. 2)" in html
    assert main([*base, "compare", "h0", "aggregated", *protocol[:-1], "--run-id", out["run_id"]]) == 0  # resumed: read back
    text = capsys.readouterr().err
    assert "against h0, and cost" in text and "Δ Pair" in text and "aggregated" in text and "0/1" in text, text
    assert f"each method's run is {out['run_id']}-METHOD; report: " in text
    assert main([*base, "coevolve", "--config", "coevolution", *protocol]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["pool"]) == 2 and Path(out["report"]["html"]).is_file()
    html = Path(out["report"]["html"]).read_text()
    assert "<svg" in html and out["run_id"] in html
    assert main([*base, "coevolve", "--config", "coevolution", *protocol[:-1], "--run-id", out["run_id"]]) == 0  # resumed: done
    text = capsys.readouterr().err  # tables go where progress goes
    assert f"lineage of {out['run_id']}-h1" in text and "H0 adopted" in text and "c1 " in text
    assert main([*base, "compare", "nonsense", *protocol]) == 2
