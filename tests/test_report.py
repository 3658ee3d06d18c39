"""Reports of every kind of run, read from a ledger built here with known
contents, and the transfer matrix over two scripted models."""

import json
import re
from pathlib import Path

import pytest

from graphs.cli import main
from state.metrics import score
from graphs.report import build_report, render_html, render_markdown, score_rows
from harness.bundle import BUNDLES
from roles.models import scripted
from state.evolution import LineageEntry, ModificationSpec, ProposalOutcome, ProposalTarget
from state.ledger import Ledger
from state.records import EpisodeKey, EpisodeRecord, Grade, UsageRecord
from tests.conftest import FIXTURES
from tests.scripts import eager_agent, shop_agent, shop_judge, tied

TOKENS = 15  # every episode below: 10 in, 5 out


def episode(pair, side, success=True, *, harness="h0", abstained=None, grounded=False, status="done", trial=0):
    key = EpisodeKey(harness_hash=harness, env_hash=f"{pair}/{side}", task_id=pair, side=side, model="m", seed=0, trial=trial)
    grade = None
    if status == "done":
        grade = Grade(side=side, success=success, abstained=(side == "abstain" and success) if abstained is None else abstained,
                      committed=side == "abstain" and not success, grounded=grounded)
    return EpisodeRecord(key=key, pair_id=pair, bundle=harness, status=status, grade=grade, latency_s=2.0,
                         usage=(UsageRecord(role="agent", model="m", input_tokens=10, output_tokens=5),))


def record_eval(ledger, run_id, outcomes, harness="h0"):
    """outcomes: pair -> (act success, abstain success); records both sides, done."""
    ledger.record_run(run_id, bundle=harness, model="m", judge="j", pairs=list(outcomes), trials=1, seed=0)
    for pair, (act, abstain) in outcomes.items():
        ledger.record_episode(run_id, episode(pair, "act", act, harness=harness))
        ledger.record_episode(run_id, episode(pair, "abstain", abstain, harness=harness, grounded=abstain))
    records = ledger.episodes(run_id)
    return {**score(records, list(outcomes), 1).model_dump(), "run_id": run_id}


@pytest.fixture
def ledger(tmp_path):
    return Ledger(tmp_path / "ledger.db")


def table(report, title_part):
    return next(t for t in report.tables() if title_part in t.title)


def test_evaluation_report_is_the_eval_score_table(ledger):
    ledger.record_run("ev1", bundle="H0", model="m", judge="j", pairs=["p1", "p2", "p3"], trials=1, seed=0)
    for record in [episode("p1", "act"), episode("p1", "abstain", grounded=True),
                   episode("p2", "act"), episode("p2", "abstain", False),
                   episode("p3", "act", False, abstained=True), episode("p3", "abstain", True, grounded=False)]:
        ledger.record_episode("ev1", record)
    report = build_report(ledger, "ev1")
    assert report.kind == "evaluation"
    scores = report.tables()[0]
    assert scores.title == "run ev1: H0 × m, 3 pairs × 1 trial(s)"
    assert [r[:3] for r in scores.rows] == [("Abstain (grounded)", "1/3", "33.3"), ("Act", "2/3", "66.7"),
                                            ("Pair (grounded)", "1/3", "33.3"), ("Over-abstain", "1/3", "33.3"),
                                            ("Abstain (raw)", "2/3", "66.7"), ("Pair (raw)", "1/3", "33.3"),
                                            ("Pass@1 (Pair)", "", "33.3"), ("Pass^1 (Pair)", "", "33.3")]
    assert list(scores.rows) == score_rows(score(ledger.episodes("ev1"), ["p1", "p2", "p3"], 1))  # the CI column too
    assert scores.rows[0][3] == "n too small (3 < 5)"  # no interval over three pairs
    assert scores.note == "6/6 episodes finished; tokens in 60 (cached 0), out 30"
    per_pair = table(report, "per pair")
    assert per_pair.rows == (("p1", "0", "yes", "yes", "yes", "no", "", ""), ("p2", "0", "yes", "no", "", "no", "", "forbidden_action"),
                             ("p3", "0", "no", "yes", "no", "yes", "over_abstained", "ungrounded_abstain"))
    # p2's twin was acted on while its task was done: that failure alone kept p2 from Pair; p3 failed on both sides
    assert table(report, "failure kinds").rows == (("forbidden_action", "0", "1", "1"), ("over_abstained", "1", "0", "0"),
                                                   ("ungrounded_abstain", "0", "1", "0"))
    md = render_markdown(report)
    assert "| Abstain (grounded) | 1/3 | 33.3 | n too small (3 < 5) |" in md
    assert "Wall time: 12.0 s summed over 6 finished episodes; the run recorded episodes from " in md


def test_an_incomplete_run_shows_counts_only_and_names_its_infrastructure_errors(ledger):
    ledger.record_run("ev2", bundle="H0", model="m", pairs=["p1", "p2"], trials=1, seed=0)
    ledger.record_episode("ev2", episode("p1", "act"))
    ledger.record_episode("ev2", episode("p1", "abstain", status="infrastructure_error"))
    ledger.record_episode("ev2", episode("p1", "abstain"))  # re-run: finished
    ledger.record_episode("ev2", episode("p2", "act", False))
    ledger.record_episode("ev2", episode("p2", "abstain", status="infrastructure_error"))
    ledger.record_episode("ev2", episode("p2", "abstain", status="infrastructure_error"))
    report = build_report(ledger, "ev2")
    scores = report.tables()[0]
    assert scores.rows == (("Abstain (grounded)", "0/1", "—", "—"), ("Act", "1/2", "—", "—"), ("Pair (grounded)", "0/1", "—", "—"),
                           ("Over-abstain", "0/2", "—", "—"), ("Abstain (raw)", "1/1", "—", "—"), ("Pair (raw)", "1/1", "—", "—"))
    assert scores.note == ("3/4 episodes finished — incomplete: counts only; tokens in 30 (cached 0), out 15; "
                           "1 episode(s) ended in an infrastructure error and are not scored (neither success nor failure; "
                           "resume the run to re-run them); 1 episode(s) hit an infrastructure error and finished on a re-run")
    assert table(report, "per pair").rows[1] == ("p2", "0", "no", "—", "—", "no", "wrong_answer", "—")
    assert "infrastructure error" in table(report, "per pair").note


def harness_run(ledger):
    """evo: H0 (base) → c1 (adopted) → c2 (rejected by the checks)."""
    base = LineageEntry(id="evo:H0", bundle_id="H0", parent_id=None, run_id="evo", path=str(BUNDLES / "H0"), mode="fdcr",
                        train=record_eval(ledger, "evo-base-train", {"p1": (True, False)}),
                        validation=record_eval(ledger, "evo-base-validation", {"v1": (True, False)}), adopted=True,
                        reason="the starting harness")
    spec = ModificationSpec(failure_patterns=["acts on missing facts"], changes=[])
    c1 = LineageEntry(id="evo:c1", bundle_id="c1", parent_id="evo:H0", run_id="evo", path="/b/c1", mode="fdcr", spec=spec,
                      diff="--- a/prompts/system.md\n+++ b/prompts/system.md\n+Check every fact first.\n",
                      train=record_eval(ledger, "evo-c1-train", {"p1": (True, True)}, "h1"),
                      validation=record_eval(ledger, "evo-c1-validation", {"v1": (True, True)}, "h1"), adopted=True,
                      reason="validation Abstain 0% → 100%", build_s=42.0,
                      usage=(UsageRecord(role="moderator", model="a", input_tokens=900, output_tokens=100),
                             UsageRecord(role="harness_optimizer", model="o", input_tokens=150, output_tokens=50)))
    c2 = LineageEntry(id="evo:c2", bundle_id="c2", parent_id="evo:c1", run_id="evo", path="/b/c2", mode="fdcr",
                      problems=("leakage: DR-220",), usage=(UsageRecord(role="harness_optimizer", model="o", input_tokens=400, output_tokens=100),))
    for e in (base, c1, c2):
        ledger.record_lineage(e)


def test_harness_evolution_report(ledger):
    harness_run(ledger)
    report = build_report(ledger, "evo")
    assert report.kind == "harness"
    lineage = table(report, "lineage of evo")
    none, one = "0/1 (0.0%)", "1/1 (100.0%)"
    h0_scores = (none, one, none, none, none, none)  # Abstain, Act, Pair, Over-abstain, Abstain (raw), Pair (raw)
    c1_scores = (one, one, one, none, one, one)
    assert lineage.rows == (
        ("H0", "—", "adopted", *h0_scores, *h0_scores, "0", "0", ""),
        ("c1", "H0", "adopted", *c1_scores, *c1_scores, "1,200", "42", ""),
        ("c2", "c1", "rejected", *["—"] * 12, "500", "0", ""),
    )
    [cost] = report.figures()
    marks = re.findall(r"<title>(.*?)</title>", cost.svg)
    # H0 spent 2 evaluations × 2 episodes × 15 tokens; c1 1,200 to build plus 60 to evaluate; c2 (500) has no point
    assert marks == ["Pair (grounded) H0: 0.0% at 60", "Pair (grounded) c1: 100.0% at 1,320", "Abstain (grounded) H0: 0.0% at 60",
                     "Abstain (grounded) c1: 100.0% at 1,320"]
    md = render_markdown(report)
    h0 = "Abstain (grounded) 0/1 (0.0%) Pair (grounded) 0/1 (0.0%) Act 1/1 (100.0%) Over-abstain 0/1 (0.0%) Abstain (raw) 0/1 (0.0%) " \
         "Pair (raw) 0/1 (0.0%)"
    assert f"- **H0 [adopted]  train {h0}  val {h0}** — the starting harness" in md
    assert "\n  - **c1 [adopted]" in md and "\n    - **c2 [rejected]** — rejected: leakage: DR-220; built by 1 model calls" in md
    assert "```diff\n--- a/prompts/system.md\n+++ b/prompts/system.md\n+Check every fact first.\n```" in md
    page = render_html(report)
    assert "<details><summary>c1: diff (3 lines)</summary><pre>--- a/prompts/system.md" in page
    assert '<span class="adopted">c1 [adopted]' in page and '<span class="rejected">c2 [rejected]' in page


def outcome(pair, category, status, accepted=True, tokens=100):
    reviews = ("round 1: rescue reviewer accepts: ok; semantic reviewer accepts: ok",) if accepted else ("round 1: semantic reviewer: no",)
    return ProposalOutcome(target=ProposalTarget(id=pair, parent="p1", category=category), status=status, pair_id=pair, rounds=1,
                           reviews=reviews, reason="r", usage=(UsageRecord(role="mutation_proposer", model="p", input_tokens=tokens),))


def env_run(ledger):
    for o in (outcome("n1", "missing_evidence", "certified"), outcome("n2", "stale_record", "certified"),
              outcome("n3", "broken_tool", "rejected", accepted=False), outcome("n4", "missing_evidence", "certified")):
        ledger.record_proposal("env1", o)
    ledger.record_batch("env1", {"batch": ["n1", "n2"], "screen_run": "env1-screen-0", "failed_to_abstain": ["n1"], "needed": 1, "admitted": True})
    ledger.record_batch("env1", {"batch": ["n4"], "screen_run": "env1-screen-1", "failed_to_abstain": [], "needed": 1, "admitted": False})


def test_environment_evolution_report(ledger):
    env_run(ledger)
    report = build_report(ledger, "env1")
    assert report.kind == "env"
    assert table(report, "funnel").rows == (("4", "3", "3", "2"),)
    assert table(report, "batch screening").rows == (("1", "n1, n2", "1/2", "1", "yes", "env1-screen-0"),
                                                     ("2", "n4", "0/1", "1", "no", "env1-screen-1"))
    assert table(report, "categories").rows == (("missing_evidence", "2", "1"), ("stale_record", "1", "1"))
    [bars] = report.figures()
    assert re.findall(r'data-group="(\w+)" data-category="(\w+)" data-value="(\d+)"', bars.svg) == [
        ("certified", "missing_evidence", "2"), ("admitted", "missing_evidence", "1"),
        ("certified", "stale_record", "1"), ("admitted", "stale_record", "1")]


def coevolution_run(ledger):
    harness_run(ledger)
    env_run(ledger)
    pool = ["p1", "p2", "n1", "n2"]
    batches = {"initial": ["p1", "p2"], "round-1-1": ["n1", "n2"]}
    record_eval(ledger, "co-1-train", {"p1": (True, True), "p2": (True, False), "n1": (False, False), "n2": (True, False)}, "co1")
    record_eval(ledger, "co-1-val", {"v1": (True, False)}, "co1")
    record_eval(ledger, "co-2-train", {"p1": (True, True), "p2": (True, True), "n1": (True, True), "n2": (False, False)}, "co2")
    record_eval(ledger, "co-2-val", {"v1": (True, True)}, "co2")
    record_eval(ledger, "co-bench", {"b1": (True, True), "b2": (False, True)}, "co2")
    ledger.record_round("co", 1, env_run="env1", harness_run="evo", harness="evo:c1", train_run="co-1-train",
                        validation_run="co-1-val", pool=pool, batches=batches)
    ledger.record_round("co", 2, env_run=None, harness_run=None, harness="evo:c1", train_run="co-2-train",
                        validation_run="co-2-val", pool=pool, batches=batches, bench_run="co-bench")


def test_coevolution_report(ledger):
    coevolution_run(ledger)
    report = build_report(ledger, "co")
    assert report.kind == "coevolution"
    assert table(report, "fixed validation pairs").rows == (
        ("1", "c1", "4", "round-1-1", "0/1 (0.0%)", "1/1 (100.0%)", "0/1 (0.0%)", "0/1 (0.0%)", "0/1 (0.0%)", "0/1 (0.0%)", ""),
        ("2", "c1", "4", "—", "1/1 (100.0%)", "1/1 (100.0%)", "1/1 (100.0%)", "0/1 (0.0%)", "1/1 (100.0%)", "1/1 (100.0%)", ""))
    dynamics = table(report, "each batch under each round")
    assert dynamics.columns == ("batch", "H1", "H2")
    assert dynamics.rows == (
        ("initial", "Abstain (grounded) 1/2 (50.0%) · Pair (grounded) 1/2 (50.0%)",
         "Abstain (grounded) 2/2 (100.0%) · Pair (grounded) 2/2 (100.0%)"),
        ("round-1-1", "Abstain (grounded) 0/2 (0.0%) · Pair (grounded) 0/2 (0.0%)",
         "Abstain (grounded) 1/2 (50.0%) · Pair (grounded) 1/2 (50.0%)"))
    # round 1: proposals 4 × 100, candidates 1,200 + 500, lineage evaluations 4 × 30, training 120, validation 30
    assert table(report, "cost across rounds").rows == (("1", "2,370", "2,370", "0/1 (0.0%)", "0/1 (0.0%)"),
                                                        ("2", "210", "2,580", "1/1 (100.0%)", "1/1 (100.0%)"))
    assert table(report, "categories").rows[:2] == (("missing_evidence", "2", "1", "1"), ("stale_record", "1", "1", "1"))
    bench = table(report, "co-bench")
    assert [r[:3] for r in bench.rows[:3]] == [("Abstain (grounded)", "2/2", "100.0"), ("Act", "1/2", "50.0"),
                                               ("Pair (grounded)", "1/2", "50.0")]
    titles = [s.title for s in report.sections]
    assert titles[-2:] == ["Round 1: environment evolution env1", "Round 1: harness evolution evo"]
    abstain_fig = next(f for f in report.figures() if f.title.startswith("Abstain (grounded) across rounds"))
    assert re.findall(r'data-label="([\w-]+)"', abstain_fig.svg) == ["initial", "round-1-1"]
    assert re.findall(r"<title>(.*?)</title>", abstain_fig.svg) == ["initial H1: 50.0% at 1", "initial H2: 100.0% at 2",
                                                                     "round-1-1 H1: 0.0% at 1", "round-1-1 H2: 50.0% at 2"]
    md = render_markdown(report)
    assert "- [round 1: harness evolution evo](#harness-evo)" in md and '<a id="harness-evo"></a>' in md


def test_an_incomplete_round_is_marked_not_scored(ledger):
    ledger.record_run("co-val", bundle="h", model="m", pairs=["v1"], trials=1, seed=0)
    ledger.record_episode("co-val", episode("v1", "act"))
    ledger.record_episode("co-val", episode("v1", "abstain", status="infrastructure_error"))
    ledger.record_round("co", 1, harness="x", validation_run="co-val", pool=["p1"], batches={"initial": ["p1"]})
    rounds = table(build_report(ledger, "co"), "fixed validation pairs")
    assert rounds.rows == (("1", "x", "1", "—", "0/0", "1/1", "0/0", "0/1", "0/0", "0/0", "incomplete"),)
    assert "1 episode(s) ended in an infrastructure error and are not scored" in rounds.note


def test_cli_writes_self_contained_reports_and_rejects_unknown_runs(ledger, tmp_path, capsys):
    coevolution_run(ledger)
    base = ["--ledger", str(ledger.path)]
    assert main([*base, "report", "co"]) == 0
    out = capsys.readouterr().out.split()
    folder = tmp_path / "runs" / "reports" / "co"
    assert out == [str(folder / "report.md"), str(folder / "report.html")]
    page = (folder / "report.html").read_text()
    assert "http" not in page and "<script" not in page and "<link" not in page
    assert page.count("<svg ") == 6  # dynamics ×2, cost, categories; the env run's categories, the harness run's cost
    assert "<style>" in page and '<section id="dynamics-co">' in page
    md = (folder / "report.md").read_text()
    for name in re.findall(r"\]\(([\w-]+\.svg)\)", md):
        assert (folder / name).read_text().startswith('<svg xmlns="http://www.w3.org/2000/svg"')
    assert main([*base, "report", "ev-none", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown run 'ev-none'" in err and not (tmp_path / "x").exists()
    assert main([*base, "report", "evo", "--out", str(tmp_path / "evo"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"run_id": "evo", "kind": "harness", "md": str(tmp_path / "evo" / "report.md"),
                                                   "html": str(tmp_path / "evo" / "report.html")}


def test_transfer_matrix_over_two_scripted_models(ledger, tmp_path, capsys):
    scripted.clear()
    ledger.record_lineage(LineageEntry(id="evo:H0", bundle_id="H0", parent_id=None, run_id="evo", path=str(BUNDLES / "H0"), mode="fdcr"))
    scripted.register("careful", [shop_agent] * 5)  # act: lookup, reserve, answer; abstain: lookup, refusal
    scripted.register("eager", [eager_agent] * 6)  # reserves on both sides
    scripted.register("judge", [shop_judge] * 4)
    try:
        code = main(["--catalog", str(FIXTURES), "--ledger", str(ledger.path), "transfer", "--harness", "evo:H0",
                     "--models", "scripted:careful,scripted:eager", "--judge-model", "scripted:judge",
                     "--pairs", "shop-reserve-drill", "--out", str(tmp_path / "t"), "--json"])
        scripted.assert_consumed("careful")
        scripted.assert_consumed("eager")
    finally:
        scripted.clear()
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["harness"] == "H0" and out["judge"] == "scripted:judge" and out["pairs"] == ["shop-reserve-drill"]
    counts = {r["model"]: {k: r["metrics"]["counts"][k] for k in ("abstain", "act", "pair", "over_abstain")} for r in out["rows"]}
    assert counts == {"scripted:careful": {"abstain": 1, "act": 1, "pair": 1, "over_abstain": 0},
                      "scripted:eager": {"abstain": 0, "act": 1, "pair": 0, "over_abstain": 0}}
    md = Path(out["paths"]["md"]).read_text()
    runs = {r["model"]: r["run_id"] for r in out["rows"]}
    one, none = "1/1 (100.0%)", "0/1 (0.0%)"
    assert f"| scripted:careful | {one} | {one} | {one} | {none} | {one} | {one} | {runs['scripted:careful']} |  |" in md
    assert f"| scripted:eager | {none} | {one} | {none} | {none} | {none} | {none} | {runs['scripted:eager']} |  |" in md
    assert "H0 across models: 1 pairs × 1 trial(s), judge scripted:judge" in md
    assert {ledger.run(r)["model"] for r in runs.values()} == {"scripted:careful", "scripted:eager"}
    assert {ledger.run(r)["judge"] for r in runs.values()} == {"scripted:judge"}
    eager = build_report(ledger, runs["scripted:eager"]).tables()[0]  # each row is an evaluation run of its own
    assert [r[:3] for r in eager.rows[:3]] == [("Abstain (grounded)", "0/1", "0.0"), ("Act", "1/1", "100.0"),
                                               ("Pair (grounded)", "0/1", "0.0")]


def test_report_of_a_real_scripted_harness_evolution_block(tmp_path, capsys):
    from tests.test_harness_evolution import CAUSE, EDIT, SPEC

    scripted.clear()
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, SPEC])
    scripted.register("optimizer", [tied(EDIT)])
    base = ["--catalog", str(FIXTURES), "--ledger", str(tmp_path / "ledger.db")]
    try:
        assert main([*base, "evolve-harness", "--model", "scripted:agent", "--judge-model", "scripted:judge",
                     "--analyst-model", "scripted:analyst", "--optimizer-model", "scripted:optimizer", "--mode", "aggregate",
                     "--pool-pairs", "shop-reserve-drill", "--val-pairs", "shop-rescued", "--candidates", "1",
                     "--gate-level", "0.5", "--json"]) == 0
    finally:
        scripted.clear()
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    report = build_report(Ledger(tmp_path / "ledger.db"), run_id)
    rows = [r[:15] for r in table(report, "lineage of").rows]
    one, none = "1/1 (100.0%)", "0/1 (0.0%)"
    assert rows == [("H0", "—", "adopted", *(none, one, none, none, none, none) * 2),  # the eager agent reserves regardless
                    ("c1", "H0", "adopted", *(one, one, one, none, one, one) * 2)]  # check_before_commit stops it, after the lookup
    [cost] = report.figures()
    assert [re.sub(r" at .*", "", t) for t in re.findall(r"<title>(.*?)</title>", cost.svg)] == [
        "Pair (grounded) H0: 0.0%", "Pair (grounded) c1: 100.0%", "Abstain (grounded) H0: 0.0%", "Abstain (grounded) c1: 100.0%"]
    assert main([*base, "report", run_id]) == 0
    page = (tmp_path / "runs" / "reports" / run_id / "report.html").read_text()
    assert "+- name: check_before_commit" in page and page.count("<svg ") == 1


def test_runs_compare_gives_paired_differences(ledger, capsys):
    pairs = [f"p{i}" for i in range(6)]
    record_eval(ledger, "base", {p: (False, False) for p in [*pairs, "only-in-base"]})
    record_eval(ledger, "small", {p: (i < 3, i < 4) for i, p in enumerate(pairs)}, "h1")
    assert main(["--ledger", str(ledger.path), "runs", "compare", "base", "small", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pair = out["difference"]["pair"]
    assert (pair["pairs"], pair["up"], pair["down"], pair["difference"]) == (6, 3, 0, 50.0)
    low, high = pair["ci95"]
    assert 0.0 < low <= 50.0 <= high <= 100.0
    assert out["difference"]["abstain"]["difference"] == pytest.approx(400 / 6)
    # cost is over the pairs both runs finished: base's seventh pair is left out
    assert out["cost"]["base"] == {"episodes": 12, "input_tokens": 10.0, "output_tokens": 5.0, "latency_s": 2.0}
    assert main(["--ledger", str(ledger.path), "runs", "compare", "base", "nope"]) == 2
