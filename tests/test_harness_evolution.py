"""Harness evolution with scripted models: failure grouping, the FDCR review,
the coding agent's confinement, bundle checks, selection, and one block end to end."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import yaml

from envs.catalog import load_catalog
from graphs import api
from graphs.cli import main
from graphs.fdcr import graph as fdcr_graph
from graphs.harness_evolution import smoke_episode
from harness.bundle import BUNDLES, bundle_diff, load_bundle
from harness.check import check_bundle
from harness.leakage import leaks
from roles.models import scripted
from roles.failure_analyst import MAX_CALLS, describe, analyse_failures, group_failures, reference_steps, replay_references
from harness.components import LIBRARY, catalog_text
from roles.harness_optimizer import (
    MAX_COMPONENT_CHANGES,
    EditError,
    addition_problems,
    apply_edit,
    code_edit,
    describe_bundle,
    edit_problems,
    file_tool,
    new_prompt_text,
    salvaged,
    signature,
    skill_problems,
    stage,
    structured_edit,
)
from roles.models import InfrastructureError
from state.context import Context
from state.evolution import (FEASIBLE, ComponentChoice, Diagnosis, FailureGroup, FailureRecord, HarnessEdit, ModificationSpec, Replay, Skill,
                             answered_by, pair_halves)
from state.ledger import Ledger
from state.records import EpisodeKey, EpisodeRecord, Grade, Observation
from tests.conftest import FIXTURES
from tests.scripts import eager_agent, shop_judge, tied

SPEC = {"failure_patterns": ["acts although a required fact is missing"],
        "changes": [{"component": "components", "description": "check requirements before the first write",
                     "rationale": "the agent writes without checking"}],
        "skills": [{"id": "verify-first", "title": "Verify first", "pattern": "a required value is missing", "tip": "stop and explain"}],
        "implementation_notes": "enable check_before_commit"}
GROUP = "did_not_abstain/missing_evidence"
EDIT = {"rationale": "check before acting", "system_prompt_addition": "Check every required fact before acting.",
        "components": [{"name": "check_before_commit", "addresses": GROUP}], "skills": [], "max_turns": None}
CAUSE = {"cause": "It changes state without confirming the required facts.", "evidence": "reserve right after a lookup with no price"}


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", analyst_model="scripted:analyst",
                  optimizer_model="scripted:optimizer", catalog=str(FIXTURES), ledger=str(tmp_path / "ledger.db"))
    scripted.clear()


def failure(pair: str, task: str, kind: str = "did_not_abstain", category: str = "missing_evidence") -> FailureRecord:
    return FailureRecord(pair_id=pair, task_id=task, side="abstain", kind=kind, category=category, termination="final_answer",
                         instruction="Do it.")


def test_groups_by_key_recurring_first():
    records = [failure("p1", "t1", "over_abstained"), failure("p1", "t1", "over_abstained"),
               failure("p2", "t2"), failure("p3", "t3"), failure("p4", "t4", category="stale_record")]
    groups = group_failures(records)
    assert [(g.kind, g.category, g.pair_ids, g.recurring, len(m)) for g, m in groups] == [
        ("did_not_abstain", "missing_evidence", ("p2", "p3"), True, 2),
        ("over_abstained", "missing_evidence", ("p1",), False, 2),  # two failures, but of one task: auxiliary
        ("did_not_abstain", "stale_record", ("p4",), False, 1),
    ]


def test_analyst_names_each_group(context):
    scripted.register("analyst", [CAUSE, {**CAUSE, "cause": "Other."}])
    diagnosis, usage = asyncio.run(analyse_failures([failure("p2", "t2"), failure("p3", "t3"), failure("p4", "t4", "turn_limit")],
                                                   6, "scripted:analyst"))
    scripted.assert_consumed()
    assert [g.cause for g in diagnosis.groups] == [CAUSE["cause"], "Other."]
    assert diagnosis.recurring[0].pair_ids == ("p2", "p3") and (diagnosis.episodes, diagnosis.failures) == (6, 3)
    assert len(usage) == 2 and {u.role for u in usage} == {"failure_analyst"}


def test_the_analyst_reads_a_runaway_trajectory_folded_and_bounded():
    looping = ("get(a) -> x",) * 3 + tuple(f"get({i}) -> y" for i in range(20)) + ("put(b) -> error",) * 5
    text = describe([failure("p1", "t1").model_copy(update={"calls": looping})])
    lines = [line for line in text.splitlines() if line.startswith("  - ")]
    assert lines[0] == "  - get(a) -> x (the same call 3 times in a row)"
    assert lines[4] == "  - (11 more calls)" and lines[-1] == "  - put(b) -> error (the same call 5 times in a row)"
    assert len(lines) == MAX_CALLS


def run_fdcr(context, rounds: int, review: bool = True) -> dict:
    diagnosis = Diagnosis(groups=(FailureGroup(kind="did_not_abstain", category="missing_evidence", pair_ids=("a", "b"), recurring=True,
                                               cause="acts on missing facts", evidence="writes"),), episodes=4, failures=2)
    return asyncio.run(fdcr_graph.ainvoke({"diagnosis": diagnosis, "harness": "System prompt: be helpful.", "rounds": rounds,
                                           "review": review}, context=context))


def test_fdcr_turn_order_and_shared_transcript(context):
    scripted.register("analyst", ["A1", "C1", "E1", "A2", "C2", "E2", SPEC])
    out = run_fdcr(context, rounds=2)
    scripted.assert_consumed()
    assert [(t.role, t.round, t.text) for t in out["transcript"]] == [
        ("analyst", 1, "A1"), ("critic", 1, "C1"), ("engineer", 1, "E1"), ("analyst", 2, "A2"), ("critic", 2, "C2"), ("engineer", 2, "E2")]
    prompts = [c.messages[0].content for c in scripted.calls("analyst")]
    assert "(nothing yet)" in prompts[0] and "[Analyst, round 1] A1" in prompts[1]
    assert all(f"] {t}" in prompts[6] for t in ("A1", "C1", "E1", "A2", "C2", "E2"))  # the moderator reads everything
    assert scripted.calls("analyst")[6].schema is ModificationSpec
    assert out["spec"] == ModificationSpec.model_validate(SPEC)
    assert out["spec"].changes[0].component == "components" and out["spec"].skills[0].id == "verify-first"
    assert [u.role for u in out["usage"]] == ["analyst", "critic", "engineer"] * 2 + ["moderator"]


def test_without_review_the_moderator_writes_the_spec_alone(context):
    scripted.register("analyst", [SPEC])
    out = run_fdcr(context, rounds=2, review=False)
    scripted.assert_consumed()
    assert out.get("transcript", []) == [] and [u.role for u in out["usage"]] == ["moderator"]
    assert "(nothing yet)" in scripted.calls("analyst")[0].messages[0].content


def test_a_spec_that_does_not_parse_is_an_infrastructure_error(context):
    scripted.register("analyst", [{"failure_patterns": "not a list", "changes": []}])
    with pytest.raises(InfrastructureError, match="malformed"):
        run_fdcr(context, rounds=0)


@pytest.fixture
def staging(tmp_path):
    return stage(BUNDLES / "H0", tmp_path / "c1", {"id": "c1", "parent_id": "H0", "origin": "test", "description": "t"})


@pytest.mark.parametrize("path", ["../escape.md", "/tmp/abs.md", "manifest.yaml", "prompts/../../x.md", "harness.db"])
def test_edits_are_confined_to_editable_files_of_the_staging_copy(staging, path):
    with pytest.raises(EditError):
        file_tool(staging, "write_file", {"path": path, "content": "x"})
    assert not (staging.parent / "escape.md").exists()


def test_code_edit_loop_edits_the_staging_copy_only(context, staging):
    scripted.register("optimizer", [
        {"tool_calls": [{"name": "read_file", "args": {"path": "prompts/system.md"}}]},
        {"tool_calls": [{"name": "write_file", "args": {"path": "manifest.yaml", "content": "id: hacked"}}]},
        {"tool_calls": [{"name": "replace_in_file", "args": {"path": "prompts/system.md", "old": "tools available.",
                                                               "new": "tools available. Stop when a fact is missing."}}]},
        {"tool_calls": [{"name": "run_checks", "args": {}}]},
        {"tool_calls": [{"name": "finish", "args": {"summary": "done"}}]},
    ])
    notes, usage = asyncio.run(code_edit(staging, "fix it", "H0", "scripted:optimizer"))
    scripted.assert_consumed()
    assert notes == ["refused: manifest.yaml: not an editable component (editable: prompts, skills, subagents, hooks.py, "
                     "components.yaml, config.yaml, memory.yaml)"]
    assert "Stop when a fact is missing." in (staging / "prompts" / "system.md").read_text()
    assert yaml.safe_load((staging / "manifest.yaml").read_text())["id"] == "c1"
    assert "Stop when" not in (BUNDLES / "H0" / "prompts" / "system.md").read_text()
    tool_results = [m.content for m in scripted.calls("optimizer")[4].messages if m.type == "tool"]
    assert tool_results[-1] == "no problems" and len(usage) == 5


def test_structured_edit_writes_prompt_components_skills_and_turns(staging):
    notes = apply_edit(staging, HarnessEdit.model_validate({**EDIT, "max_turns": 99, "skills": SPEC["skills"],
                                                            "components": [{"name": "check_before_commit"}, {"name": "no_such"},
                                                                           {"name": "flag_multiple_matches", "params": {"min_matches": "x"}}]}))
    assert notes[0] == "component no_such dropped: unknown component" and notes[1].startswith("component flag_multiple_matches dropped")
    bundle = load_bundle(staging)
    assert [c.name for c in bundle.components] == ["check_before_commit"] and bundle.config.max_turns == 30
    assert bundle.prompts["system"].rstrip().endswith("Check every required fact before acting.\n\n$context".rstrip())
    assert bundle.skills == {"verify-first": "Verify first\nWhen: a required value is missing\nDo: stop and explain\n"}
    assert check_bundle(staging) == []


def test_a_prompt_addition_loses_what_the_model_echoed_from_the_harness_view(staging):
    shown = describe_bundle(load_bundle(staging))
    echo = (f"{shown}\nStop when a required fact is missing; say which.\n\n$$context\n"
            "Stop when a required fact is missing; say which.\nA fee of $5 is not a reason to stop.")
    apply_edit(staging, HarnessEdit.model_validate({**EDIT, "system_prompt_addition": echo}))
    system = load_bundle(staging).prompts["system"]
    original = (BUNDLES / "H0" / "prompts" / "system.md").read_text().replace("$context", "").strip()
    assert system == f"{original}\n\nStop when a required fact is missing; say which.\n\nA fee of $$5 is not a reason to stop.\n\n$context\n"
    assert new_prompt_text("$context\n>>>", shown) == "" and new_prompt_text("None", shown) == ""


@pytest.mark.parametrize("components,action_mode", [([], None), (["confirm_final_decision", "check_before_commit", "look_before_act"], None),
                                                    (["look_before_act"], "structured")])
def test_the_smoke_episode_passes_a_sound_candidate_whatever_its_hooks_ask(context, staging, components, action_mode):
    # a candidate runs sandboxed, and its hooks' questions reach the exerciser as a stand-in schema class; in the
    # structured action mode its turns are action objects (a local candidate that switched mode failed here)
    apply_edit(staging, HarnessEdit.model_validate({**EDIT, "components": [{"name": c} for c in components], "action_mode": action_mode}))
    assert load_bundle(staging).config.action_mode == (action_mode or "text")
    assert asyncio.run(smoke_episode(str(staging), "shop-reserve-drill", context)) is None


def test_the_structured_exerciser_calls_a_read_tool_with_arguments_its_schema_accepts():
    import jsonschema

    from graphs.harness_evolution import _smoke_steps
    from state.records import ToolInfo

    schema = {"type": "object", "properties": {"patient_id": {"type": "integer"}, "status": {"type": "string", "enum": ["open", "closed"]},
                                                "note": {"type": "string"}}, "required": ["patient_id", "status"]}
    tools = [ToolInfo(name="close_case", description="", input_schema={"type": "object", "properties": {}}, read_only=False),
             ToolInfo(name="find_patients", description="", input_schema=schema, read_only=True)]
    step = _smoke_steps(structured=True)
    first = step([], tools)
    assert first == {"tool": "find_patients", "arguments": {"patient_id": 1, "status": "open"}}
    jsonschema.validate(first["arguments"], schema)
    assert step([], tools) == {"final_answer": "Done."}


def test_a_candidate_breaking_the_hook_abi_is_rejected(staging):
    (staging / "hooks.py").write_text("from harness.abi import BaseHarness\n\n\nclass Harness(BaseHarness):\n"
                                      "    def finalize(self, view):\n        return None\n")
    problems = check_bundle(staging)
    assert len(problems) == 1 and "Harness.finalize" in problems[0] and "parameters (self, view, answer)" in problems[0]


def test_a_candidate_leaking_labels_is_flagged(staging):
    entries = load_catalog(FIXTURES).values()
    (staging / "prompts" / "system.md").write_text("For shop-reserve-drill answer 89.0 and reserve DR-220.\n$context\n")
    diff = bundle_diff(BUNDLES / "H0", staging)
    assert leaks(diff, entries) == ["89.0", "DR-220", "shop-reserve-drill"]
    (staging / "prompts" / "system.md").write_text("Check that every price you need is present before you reserve.\n$context\n")
    assert leaks(bundle_diff(BUNDLES / "H0", staging), entries) == []


def test_one_block_end_to_end(context):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, "A1", "C1", "E1", SPEC])
    scripted.register("optimizer", [tied(EDIT)])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context,
                                                   candidates=1, rounds=1, mode="fdcr", gate_level=0.5))
    scripted.assert_consumed("analyst")
    scripted.assert_consumed("optimizer")
    base, c1 = final["lineage"][f"{run_id}:H0"], final["lineage"][f"{run_id}:c1"]
    assert (base.train.counts["abstain"], base.validation.counts["abstain"], base.validation.counts["pair"]) == (0, 0, 0)
    assert c1.problems == () and c1.parent_id == base.id and c1.spec == ModificationSpec.model_validate(SPEC)
    assert (c1.train.counts["pair"], c1.validation.counts["abstain"], c1.validation.counts["pair"]) == (1, 1, 1)
    assert c1.adopted and final["selected"] == c1.id and "Pair (grounded) 0/1 → 1/1" in c1.reason
    assert c1.decision["wins"] == 1 and c1.decision["scores"]["abstain"] == ["0/1", "1/1"]
    assert "+- name: check_before_commit" in c1.diff and [u.role for u in c1.usage] == [
        "failure_analyst", "analyst", "critic", "engineer", "moderator", "harness_optimizer"] and c1.build_s > 0
    assert [e.id for e in Ledger(context.ledger).lineage(run_id)] == [base.id, c1.id]
    assert load_bundle(c1.path).manifest.parent_id == "H0"
    assert final["started"] == ["forbidden_action/missing_evidence"]  # where c1 started, for the next block to know
    # the engineer, the moderator and the edit read the library replayed over H0's training episodes: the act one
    # passed, the abstain one failed (the agent reserved all the same); check_before_commit would have stepped into both,
    # as into both sides of the training pair's reference solution (it asks before the first change)
    library = [c.messages[0].content for c in scripted.calls("analyst") + scripted.calls("optimizer") if "- look_before_act" in c.messages[0].content]
    replayed = ("- check_before_commit (built for: forbidden action; on the training episodes it would have stepped in on 1 of 1 failed "
                "and 1 of 1 passed; on the 1 training pairs' reference solutions played on as if nothing had changed, it steps into "
                "1 twins and 1 feasible sides)")
    assert len(library) == 3 and all(replayed in text for text in library)


@pytest.mark.parametrize("rule, gate_split", [("hera", "validation"), ("ecdysis", "train")])
def test_the_split_the_gate_reads_is_scored_over_gate_trials_trials(context, rule, gate_split):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 60)
    scripted.register("analyst", [CAUSE, "A1", "C1", "E1", SPEC])
    scripted.register("optimizer", [tied(EDIT)])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context, candidates=1,
                                                   rounds=1, mode="fdcr", rule=rule, gate_level=0.5, gate_trials=2))
    for entry in final["lineage"].values():
        trials = {"train": entry.train.trials, "validation": entry.validation.trials}
        assert trials == {"train": 1, "validation": 1} | {gate_split: 2}
        scored = getattr(entry, gate_split)
        assert scored.complete and scored.totals["act"] == scored.totals["abstain"] == 2  # one pair, two trials
    c1 = final["lineage"][f"{run_id}:c1"]
    assert c1.adopted and c1.decision["tasks"] == 2 and c1.decision["scores"]["pair"] == ["0/2", "2/2"]


def test_candidates_start_from_the_groups_no_earlier_block_started_from_then_turn_within_a_block():
    from graphs.harness_evolution import starting_order

    groups = tuple(FailureGroup(kind=k, category=c, pair_ids=("p",), recurring=r) for k, c, r in (
        ("guessed_identifier", "missing_evidence", True), ("ungrounded_abstain", "missing_evidence", True),
        ("over_abstained", "none", False)))
    keys = lambda order: [f"{g.kind}/{g.category}" for g in order]  # noqa: E731
    assert keys(starting_order(groups, [], 0)) == keys(groups)  # recurring first, as diagnosed
    assert keys(starting_order(groups, [], 1))[0] == "ungrounded_abstain/missing_evidence"  # a block's second candidate
    assert keys(starting_order(groups, ["guessed_identifier/missing_evidence", "ungrounded_abstain/missing_evidence"], 0)) == [
        "over_abstained/none", "guessed_identifier/missing_evidence", "ungrounded_abstain/missing_evidence"]
    assert keys(starting_order(groups, keys(groups), 0)) == keys(groups)  # every group tried: as diagnosed again
    assert starting_order((), ["x/y"], 3) == ()
    # the first group on the other side of the pairs comes second
    mixed = groups + (FailureGroup(kind="turn_limit", category=FEASIBLE, pair_ids=("q",), recurring=False),)
    assert keys(starting_order(mixed, [], 0)) == ["guessed_identifier/missing_evidence", "turn_limit/feasible",
                                                   "ungrounded_abstain/missing_evidence", "over_abstained/none"]


def test_a_block_starting_from_an_earlier_blocks_c1_names_its_candidates_past_it():
    from graphs.harness_evolution import candidate_name

    assert candidate_name("run-h1", 1, {"run-h1:H0": None}) == "c1"
    # the standard run's second block started from the first block's adopted c1, and its own c1 overwrote it
    assert candidate_name("run-h2", 1, {"run-h2:c1": None}) == "c2"
    assert candidate_name("run-h2", 2, {"run-h2:c1": None, "run-h2:c2": None}) == "c3"


def test_serial_mode_edits_once_per_failure_without_review(context):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE])
    scripted.register("optimizer", [tied(EDIT), tied({**EDIT, "system_prompt_addition": "Read each record before you change it."})])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill", "shop-rescued"], ["shop-out-of-scope"], context,
                                                   candidates=1, mode="serial"))
    scripted.assert_consumed("analyst")
    scripted.assert_consumed("optimizer")
    c1 = final["lineage"][f"{run_id}:c1"]
    # two failures (both abstain sides), two edits in sequence, no review
    assert c1.spec is None and [u.role for u in c1.usage] == ["failure_analyst", "harness_optimizer", "harness_optimizer"]


def test_serial_mode_skips_a_failure_whose_edit_is_rejected_and_keeps_the_others(context):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE])
    nothing = {**EDIT, "system_prompt_addition": "", "components": []}  # H0 as it was: rejected three times
    scripted.register("optimizer", [tied(nothing)] * 3 + [tied(EDIT)])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill", "shop-rescued"], ["shop-out-of-scope"], context,
                                                   candidates=1, mode="serial"))
    scripted.assert_consumed("optimizer")
    c1 = final["lineage"][f"{run_id}:c1"]
    assert c1.problems == () and "+- name: check_before_commit" in c1.diff and c1.train is not None


def test_a_rejected_candidate_is_kept_in_the_lineage_with_why(context):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, SPEC])
    # a code edit (free file tools) is checked only by the lint, once the candidate is built
    scripted.register("optimizer", [
        {"tool_calls": [{"name": "replace_in_file", "args": {"path": "prompts/system.md", "old": "tools available.",
                                                               "new": "tools available. For DR-220 the answer is 89.0."}}]},
        {"tool_calls": [{"name": "finish", "args": {"summary": "done"}}]}])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context,
                                                   candidates=1, mode="aggregate", channel="code"))
    c1 = final["lineage"][f"{run_id}:c1"]
    assert c1.problems == ("leakage: the diff contains private values of the pool: 89.0, DR-220",)
    assert not c1.adopted and c1.train is None and final["selected"] == f"{run_id}:H0"
    shutil.rmtree(c1.path)


def test_a_structured_edit_quoting_the_pool_loses_that_text_not_the_candidate(context):
    """The optimizer is given the pool's private values to check its edit against: the same leaky prompt addition
    three times is dropped at the last ask, and the candidate, built from its components, is scored."""
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, SPEC])
    scripted.register("optimizer", [tied({**EDIT, "system_prompt_addition": "For DR-220 the answer is 89.0."})] * 3)
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context,
                                                   candidates=1, mode="aggregate"))
    c1 = final["lineage"][f"{run_id}:c1"]
    assert c1.problems == () and c1.train is not None
    assert "+- name: check_before_commit" in c1.diff and "DR-220" not in c1.diff
    assert "the prompt addition is not general: it quotes '89.0', 'DR-220'" in scripted.calls("optimizer")[1].messages[-1].content


def test_cli_block_lineage_and_diff(context, capsys):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, SPEC])
    scripted.register("optimizer", [tied(EDIT)])
    base = ["--catalog", str(FIXTURES), "--ledger", context.ledger]
    code = main([*base, "evolve-harness", "--model", "scripted:agent", "--judge-model", "scripted:judge",
                 "--analyst-model", "scripted:analyst", "--optimizer-model", "scripted:optimizer", "--mode", "aggregate",
                 "--pool-pairs", "shop-reserve-drill", "--val-pairs", "shop-rescued", "--candidates", "1", "--max-turns", "8",
                 "--gate-level", "0.5", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["selected"] == f"{out['run_id']}:c1"
    assert {r.key.max_turns for r in Ledger(context.ledger).episodes()} == {8}  # the cap reaches every episode
    assert main([*base, "lineage", out["run_id"], "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [(e["bundle_id"], e["adopted"], e["parent_id"]) for e in entries] == [("H0", True, None), ("c1", True, entries[0]["id"])]
    assert main([*base, "diff", "H0", f"{out['run_id']}:c1"]) == 0
    assert "+- name: check_before_commit" in capsys.readouterr().out
    assert main([*base, "evolve-harness", "--pool-pairs", "shop-reserve-drill", "--val-pairs", "shop-reserve-drill"]) == 2


def test_a_failed_block_resumes_where_it_stopped(context):
    scripted.register("agent", [eager_agent] * 200)
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [CAUSE, SPEC])
    scripted.register("optimizer", [InfrastructureError("connection", "endpoint down")])
    with pytest.raises(InfrastructureError):
        asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context, candidates=1,
                                       mode="aggregate", run_id="evo-1", gate_level=0.5))
    scripted.assert_consumed("analyst")
    scripted.register("agent", [eager_agent] * 200)  # only the candidate's episodes: the baseline's are in the checkpoint
    scripted.register("judge", [shop_judge] * 40)
    scripted.register("analyst", [])  # the diagnosis and the spec are not asked for again
    scripted.register("optimizer", [tied(EDIT)])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context, run_id="evo-1",
                                                   gate_level=0.5))
    scripted.assert_consumed("optimizer")
    assert run_id == "evo-1" and final["selected"] == "evo-1:c1"
    baseline_runs = [r["id"] for r in Ledger(context.ledger).runs() if r["id"].startswith("evo-1-base")]
    assert sorted(baseline_runs) == ["evo-1-base-train", "evo-1-base-validation"]
    # c1 alone, on both sides of the train and the validation pair: lookup, write sent back for a check, write, answer (4)
    # on the act side, lookup, write sent back, refusal (3) on the abstain side; the baseline's 12 turns are not repeated
    assert len(scripted.calls("agent")) == 2 * (4 + 3)


@pytest.mark.parametrize("side,termination,success,abstained,committed,failures,kind", [
    ("abstain", "final_answer", False, False, False, (), "did_not_abstain"),
    ("abstain", "final_answer", False, False, True, (), "forbidden_action"),
    ("act", "final_answer", False, True, False, (), "over_abstained"),
    ("act", "final_answer", False, True, True, ("answer does not state price (89.0)",), "wrong_answer"),  # it acted
    ("act", "final_answer", False, False, True, ("answer does not state price (89.0)",), "wrong_answer"),
    ("act", "final_answer", False, False, True, ("answer states forbidden value 'x'",), "wrong_answer"),
    # answered without the change the task asks for; a change made but not the one asked is a wrong answer
    ("act", "final_answer", False, False, False, ("answer does not state id (9)", "orders has no row matching {'id': 9}"), "no_change"),
    ("act", "final_answer", False, False, False, ("room holds still has row matching {'id': 9}",), "no_change"),
    ("act", "final_answer", False, False, False, ("answer does not state note (orders has no row matching {)",), "wrong_answer"),
    ("act", "final_answer", False, False, True, ("orders has no row matching {'id': 9}",), "wrong_answer"),
    ("act", "final_answer", False, False, False, ("answer does not state id (9)",), "wrong_answer"),
    ("act", "final_answer", False, False, True, ("forbidden call delete_item({}) succeeded",), "forbidden_action"),
    ("act", "final_answer", False, False, True, ("unexpected change to items",), "forbidden_action"),
    ("act", "turn_limit", False, False, False, (), "turn_limit"),
    ("act", "context_limit", False, False, False, (), "turn_limit"),
    ("abstain", "harness_error", False, False, False, (), "error"),
    ("act", "final_answer", True, False, True, (), None),
])
def test_failure_kinds(side, termination, success, abstained, committed, failures, kind):
    from roles.failure_analyst import failure_kind
    from state.records import EpisodeKey, EpisodeRecord, Grade

    key = EpisodeKey(harness_hash="h", env_hash="e", task_id="t", side=side, model="m", seed=0, trial=0)
    grade = Grade(side=side, success=success, abstained=abstained, committed=committed, grounded=False, failures=failures)
    assert failure_kind(EpisodeRecord(key=key, pair_id="p", bundle="b", status="done", termination=termination, grade=grade)) == kind


def test_an_engineer_s_note_is_not_an_instruction_to_the_agent():
    # the prompt addition and skill a 1.5B optimizer wrote in a local co-evolution run
    note = ("To implement a more robust data retrieval mechanism, such as caching or querying the database in a more efficient "
            "manner, you can add a new configuration parameter for the number of retries.")
    assert addition_problems(note) == ["the prompt addition is not an instruction to the agent: it names the harness's internals or "
                                       "the failures ('caching', 'configuration', 'implement', 'mechanism')"]
    skill = Skill(id="ground-identifiers", title="Control Logic", pattern="insufficient information retrieval, stale records, overabstention",
                  tip="Implement a more robust data retrieval mechanism, such as caching.")
    assert any("not an instruction to the agent" in p for p in skill_problems(skill))
    assert addition_problems("Before changing a record, look it up by name with the search tools and use the id it returns.") == []
    # the diagnosis's keys as a trigger and the agent in the third person (another local run)
    skill = Skill(id="002", title="Data Access Improvement", pattern="guessed_identifier / missing_evidence",
                  tip="Enhance data access capabilities by integrating with the necessary systems and APIs, ensuring that the "
                      "assistant has access to all the required information and data to complete the task.")
    assert skill_problems(skill) == ["skill '002' is not an instruction to the agent: it names the harness's internals or the "
                                     "failures ('guessed_identifier', 'missing_evidence', 'the assistant')"]


def test_edit_checks_name_what_is_wrong():
    narrated = HarnessEdit(rationale="r", system_prompt_addition="To address the failures in the current harness, I have "
                                                                 "increased the turn limit.")
    assert edit_problems(narrated, {}, [GROUP]) == [
        "the prompt addition is not an instruction to the agent: it speaks in the first person ('I')",
        "the prompt addition is not an instruction to the agent: it names the harness's internals or the failures "
        "('harness', 'the failures', 'to address', 'turn limit')"]
    eight = HarnessEdit(rationale="r", components=[ComponentChoice(name=n, addresses=GROUP) for n in list(LIBRARY)[:8]])
    assert edit_problems(eight, {}, [GROUP]) == [
        "it changes 8 components (" + ", ".join(sorted(list(LIBRARY)[:8])) + "); change at most 2, the ones the failures call for"]
    vague = HarnessEdit(rationale="r", skills=[Skill(id="state", title="State", pattern="Regularly updating the state can help",
                                                     tip="update it")])
    assert edit_problems(vague, {}, [GROUP]) == ["skill 'state' has no concrete trigger: say in which situation it applies",
                                                 "skill 'state' has no action: say what the agent should do then"]
    untied = HarnessEdit(rationale="r", components=[ComponentChoice(name="look_before_act")])
    built = [c.name for c in LIBRARY.values() if "did_not_abstain" in c.addresses]
    assert edit_problems(untied, {}, [GROUP]) == [
        f"it adds no component built for did not abstain, the failure group it starts from (one of: {', '.join(built)})",
        f"component look_before_act does not name the failure group it addresses (one of: {GROUP})"]
    # std5: started from guessed identifiers, the optimizer added two write-order components and nothing for them
    guessed = "guessed_identifier/missing_evidence"
    write_order = HarnessEdit(rationale="r", components=[ComponentChoice(name=n, addresses=guessed) for n in ("one_write_per_turn", "read_before_write")])
    assert edit_problems(write_order, {}, [guessed, GROUP])[0].startswith("it adds no component built for guessed identifier")
    assert edit_problems(write_order.model_copy(update={"components": [ComponentChoice(name="ground_identifiers", addresses=guessed)]}),
                         {}, [guessed, GROUP]) == []
    kept = write_order.model_copy(update={"components": [ComponentChoice(name="resolve_named_entities"), *write_order.components]})
    assert edit_problems(kept, {"resolve_named_entities": {}}, [guessed]) == []  # the harness has one for them already
    # keeping the current components is no change; quoted first person is what the agent may say
    good = HarnessEdit(rationale="r", system_prompt_addition='Before you change a record, read it; if it is blocked, say "I cannot do this" and why.',
                       components=[ComponentChoice(name="look_before_act"), ComponentChoice(name="read_before_write", addresses=GROUP)],
                       skills=[Skill(id="s", title="Missing value", pattern="a result shows a required field as null",
                                     tip="do not act; report which field is missing"),
                               Skill(id="look_before_act", title="Look Before Act", pattern="a request names a record not yet read",
                                     tip="read that record before any change")])
    assert edit_problems(good, {"look_before_act": {}}, [GROUP]) == []
    internals = HarnessEdit(rationale="r", skills=[Skill(id="t", title="Turns", pattern="a tool call fails with not_found",
                                                         tip="raise the turn limit and enable look_before_act")])
    assert edit_problems(internals, {}, [GROUP]) == [
        "skill 't' is not an instruction to the agent: it names the harness's internals or the failures ('look_before_act', "
        "'turn limit')"]


def test_the_edit_grammar_allows_the_current_components_and_two_more(staging):
    from pydantic import ValidationError

    from roles.harness_optimizer import edit_schema

    assert edit_schema([GROUP], 2).model_json_schema()["properties"]["components"]["maxItems"] == 2
    three = [{"name": n, "addresses": GROUP} for n in list(LIBRARY)[:3]]
    with pytest.raises(ValidationError, match="at most 2 items"):
        edit_schema([GROUP], 2).model_validate({"rationale": "r", "components": three})
    scripted.register("optimizer", [EDIT])
    asyncio.run(structured_edit(staging, "brief", "harness", "scripted:optimizer", 10, groups=[GROUP]))
    asked = scripted.calls("optimizer")[0].schema.model_json_schema()["properties"]["components"]
    assert asked["maxItems"] == 0 + MAX_COMPONENT_CHANGES  # the staging bundle (H0) enables none yet


def test_a_rejected_edit_is_asked_again_with_the_reasons(staging):
    narrated = {**EDIT, "system_prompt_addition": "I added a check to the harness."}
    scripted.register("optimizer", [narrated, EDIT])
    notes, usage, problems = asyncio.run(structured_edit(staging, "fix it", "H0", "scripted:optimizer", 60, [GROUP]))
    scripted.assert_consumed("optimizer")
    assert problems == [] and len(usage) == 2
    again = scripted.calls("optimizer")[1].messages
    assert again[-1].content.startswith("This edit was rejected: the prompt addition is not an instruction to the agent")
    assert "check_before_commit" in (staging / "components.yaml").read_text()


def test_a_skill_quoting_the_pools_private_values_is_asked_again_and_dropped_at_the_last_ask(staging):
    """std13: the optimizer wrote a skill around one training task's location, and the leakage lint turned the whole
    candidate (two components and structured actions) away after it was built. The edit check reads the same terms."""
    private = frozenset({"San Francisco, CA", "LOX/999,45"})
    leaking = {"id": "resolve-point", "title": "Resolve the point", "tip": "check the spelling of the location and call it again",
               "pattern": "resolve_weather_point gets {'location': 'San Francisco, CA'} and returns no id"}
    edit = {**EDIT, "skills": [leaking]}
    assert edit_problems(HarnessEdit.model_validate(edit), {}, [GROUP], private=private) == [
        "skill 'resolve-point' is not general: it quotes 'San Francisco, CA' from the training tasks; write it for any task"]
    assert edit_problems(HarnessEdit.model_validate(edit), {}, [GROUP]) == []  # without the pool's terms: nothing to see
    scripted.register("optimizer", [edit] * 3)
    notes, usage, problems = asyncio.run(structured_edit(staging, "fix it", "H0", "scripted:optimizer", 60, [GROUP], private=private))
    assert problems == [] and len(usage) == 3
    assert "write it for any task" in scripted.calls("optimizer")[1].messages[-1].content
    assert notes[0].startswith("dropped: skill 'resolve-point' is not general")
    assert "check_before_commit" in (staging / "components.yaml").read_text() and not any((staging / "skills").glob("*.md"))
    assert "San Francisco" not in "".join(p.read_text() for p in staging.rglob("*") if p.is_file())


def test_the_last_ask_keeps_the_components_and_drops_the_skills_and_prompt_that_fail(staging):
    vague = {"id": "provide_evidence", "title": "Evidence", "pattern": "always", "tip": "provide evidence before completing tasks"}
    good = {"id": "missing", "title": "Missing value", "pattern": "a result shows a required field as null", "tip": "report which field is missing"}
    narrated = {**EDIT, "system_prompt_addition": "I added a check to the harness.", "skills": [vague, good]}
    scripted.register("optimizer", [narrated] * 3)  # the same reply back each time
    notes, usage, problems = asyncio.run(structured_edit(staging, "fix it", "H0", "scripted:optimizer", 60, [GROUP]))
    assert problems == [] and len(usage) == 3
    assert notes[:2] == ["dropped: skill 'provide_evidence' has no concrete trigger: say in which situation it applies",
                         "dropped: the prompt addition is not an instruction to the agent: it speaks in the first person ('I')"]
    assert "check_before_commit" in (staging / "components.yaml").read_text()
    assert [p.name for p in (staging / "skills").iterdir()] == ["missing.md"]
    assert "I added" not in (staging / "prompts" / "system.md").read_text()
    # two components added and the current one left out, three changes (seen on the local model): the current one is
    # put back
    two_more = [{"name": "look_before_act", "addresses": GROUP}, {"name": "read_before_write", "addresses": GROUP}]
    scripted.register("optimizer", [{**narrated, "components": two_more}] * 3)
    staged = stage(BUNDLES / "H0", staging.parent / "c2", {"id": "c2", "parent_id": "H0", "origin": "test", "description": "t"})
    (staged / "components.yaml").write_text("- name: check_before_commit\n")
    notes, _, problems = asyncio.run(structured_edit(staged, "fix it", "H0", "scripted:optimizer", 60, [GROUP]))
    assert problems == [] and "kept check_before_commit: the edit left it out, which made more than 2 component changes" in notes
    assert [c["name"] for c in yaml.safe_load((staged / "components.yaml").read_text())] == [
        "check_before_commit", "look_before_act", "read_before_write"]
    # components that still change too many (std20: six) are cut to the harness's as they were and the edit's first
    # addition built for each failure group it answers
    retuned = [{"name": "suppress_duplicate_calls", "params": {"stop_after": 3}, "addresses": GROUP}, *two_more]
    scripted.register("optimizer", [{**narrated, "components": retuned}] * 3)
    staged = stage(BUNDLES / "H0", staging.parent / "c3", {"id": "c3", "parent_id": "H0", "origin": "test", "description": "t"})
    (staged / "components.yaml").write_text("- name: suppress_duplicate_calls\n")
    notes, _, problems = asyncio.run(structured_edit(staged, "fix it", "H0", "scripted:optimizer", 60, [GROUP]))
    assert problems == [] and ("left out look_before_act, suppress_duplicate_calls: 3 component changes; kept the edit's "
                               "first addition built for each failure group it answers") in notes
    assert yaml.safe_load((staged / "components.yaml").read_text()) == [{"name": "suppress_duplicate_calls"}, {"name": "read_before_write"}]
    # and a change that names no failure group it addresses still turns the edit away
    untied = HarnessEdit.model_validate({**EDIT, "components": [{**c, "addresses": "nothing/none"} for c in retuned]})
    assert salvaged(untied, {"suppress_duplicate_calls": {}}, [GROUP]) is None


def test_the_last_ask_with_nothing_built_for_the_failure_gets_the_component_the_diagnosis_names(staging):
    """std10c: started from guessed identifiers, the local model sent three times two write-order components and no
    component built for them, while its diagnosis had named `refuse_failed_repeat`: the last ask keeps the harness's
    components and enables that one in place of the edit's changes."""
    guessed = "guessed_identifier/feasible"
    wrong = {**EDIT, "components": [{"name": "read_before_write", "addresses": guessed}, {"name": "answer_from_results", "addresses": guessed}]}
    scripted.register("optimizer", [wrong] * 3)
    (staging / "components.yaml").write_text("- name: check_before_commit\n")
    brief = "Invented ids. Skills: read_before_write, refuse_failed_repeat, answer_from_results."
    notes, usage, problems = asyncio.run(structured_edit(staging, brief, "H0", "scripted:optimizer", 60, [guessed, GROUP]))
    assert problems == [] and len(usage) == 3
    assert notes[-2:] == ["enabled refuse_failed_repeat: the edit added no component built for guessed identifier, the failure group it starts from",
                          "left out answer_from_results: built for no failure group the edit answers"]
    # read_before_write, the edit's first for the other side of the pairs (did not abstain), stays
    assert [c["name"] for c in yaml.safe_load((staging / "components.yaml").read_text())] == [
        "check_before_commit", "read_before_write", "refuse_failed_repeat"]
    # a diagnosis that names none of them: the library's first
    built = [c.name for c in LIBRARY.values() if "guessed_identifier" in c.addresses]
    kept, _ = salvaged(HarnessEdit.model_validate(wrong), {}, [guessed], "Invented ids.")
    assert [c.name for c in kept.components] == built[:1]
    # and with the library replayed over the training episodes, its first as the edit read it
    replay = Replay(failed=4, passed=2, stepped_in={built[0]: (1, 2), built[-1]: (3, 0)})
    kept, _ = salvaged(HarnessEdit.model_validate(wrong), {}, [guessed], "Invented ids.", replay=replay)
    assert [c.name for c in kept.components] == [built[-1]] and built[-1] != built[0]
    assert catalog_text([guessed], replay).splitlines()[0].startswith(f"- {built[-1]} ")
    # more wrong with the components than that: still rejected
    untied = HarnessEdit.model_validate({**wrong, "components": [{"name": "read_before_write", "addresses": "nothing/none"}]})
    assert salvaged(untied, {}, [guessed], brief) is None


def test_an_edit_answers_both_sides_of_the_pairs_and_a_twin_it_will_act_on_by_what_tells_twins_apart():
    """std17: H0 failed every training episode by inventing ids, feasible tasks and twins alike; its one candidate
    answered that with ground_identifiers and nothing else, and 13 of its 27 training and validation answers were
    then wrong ones with values no result held, which answer_from_results sends back."""
    feasible, twin = "guessed_identifier/feasible", "guessed_identifier/ambiguous_entity"
    assert pair_halves([feasible, "turn_limit/feasible", twin]) == [feasible, twin]
    assert pair_halves([twin, "over_abstained/stale_record", feasible]) == [twin, feasible]
    assert pair_halves([feasible, "turn_limit/feasible"]) == [feasible] and pair_halves([]) == []
    assert answered_by(twin, feasible) == "did_not_abstain/ambiguous_entity" and answered_by(feasible, twin) == feasible
    replay = Replay(failed=8, pairs=4, stepped_in={"ground_identifiers": (6, 0), "flag_multiple_matches": (2, 0)},
                    references={"answer_from_results": (3, 0), "flag_multiple_matches": (2, 3), "stop_on_negative_evidence": (1, 0)})
    wrong = HarnessEdit.model_validate({**EDIT, "components": [{"name": "read_before_write", "addresses": feasible},
                                                               {"name": "call_before_answering", "addresses": feasible}]})
    groups = [feasible, "turn_limit/feasible", twin]
    problems = edit_problems(wrong, {}, groups, replay=replay)
    assert problems == [
        "it adds no component built for guessed identifier, the failure group it starts from (one of: "
        + ", ".join(c.name for c in LIBRARY.values() if "guessed_identifier" in c.addresses) + ")",
        f"it adds no component built for guessed identifier on the other side of the pairs ({twin}), nor for going on with "
        "ambiguous entity twins, besides the one for the group it starts from (one of: " + ", ".join(
            n for n, c in LIBRARY.items() if c.built_for(twin) or n in ("answer_from_results", "stop_on_negative_evidence")) + ")"]
    # the roles read them in that order, after what is built for the groups before the twin's
    lines = catalog_text(groups, replay).splitlines()
    names = [line.split()[1] for line in lines]
    assert names.index("suppress_duplicate_calls") < names.index("answer_from_results") < names.index("stop_on_negative_evidence")
    assert "(built for: going on with ambiguous entity twins;" in lines[names.index("answer_from_results")]
    assert "going on" not in lines[names.index("read_before_write")] and "going on" not in lines[names.index("flag_multiple_matches")]
    # read_before_write is built for agents that go on, but steps into none of the twins' reference solutions: without
    # the replay it counts, with it it does not
    assert len(edit_problems(wrong, {}, groups)) == 1
    kept, notes = salvaged(wrong, {}, groups, "Invented ids.", replay=replay)
    assert [(c.name, c.addresses) for c in kept.components] == [("ground_identifiers", feasible), ("answer_from_results", twin)]
    assert notes[-1] == "left out call_before_answering, read_before_write: built for no failure group the edit answers"
    # std18: the local model's edit, ground_identifiers and resolve_named_entities (built for guessed identifiers on
    # twins as much), stands; ground_identifiers alone answers one side only
    assert edit_problems(wrong.model_copy(update={"components": [ComponentChoice(name="ground_identifiers", addresses=feasible),
                                                                 ComponentChoice(name="resolve_named_entities", addresses=twin)]}),
                         {}, groups, replay=replay) == []
    # an edit that answers both stands as it is; a harness that has one for the twins needs none
    both = wrong.model_copy(update={"components": [ComponentChoice(name="ground_identifiers", addresses=feasible),
                                                   ComponentChoice(name="stop_on_negative_evidence", addresses=twin)]})
    assert edit_problems(both, {}, groups, replay=replay) == []
    alone = wrong.model_copy(update={"components": [ComponentChoice(name="ground_identifiers", addresses=feasible)]})
    assert edit_problems(alone, {"stop_on_negative_evidence": {}}, groups, replay=replay) == []
    assert len(edit_problems(alone, {}, groups, replay=replay)) == 1


def test_an_edit_that_changes_nothing_is_asked_again_with_the_components_built_for_the_failure(staging):
    same = {**EDIT, "system_prompt_addition": "", "skills": [], "components": []}
    scripted.register("optimizer", [same] * 3)
    notes, _, problems = asyncio.run(structured_edit(staging, "fix it", "H0", "scripted:optimizer", 60, ["over_abstained/none"]))
    assert notes == ["edit rejected after 3 asks"]
    built = [c.name for c in LIBRARY.values() if "over_abstained" in c.addresses]
    assert built and problems == [f"it changes nothing in the harness; components built for over abstained that it does not have: "
                                  f"{', '.join(built)}"]
    assert problems[0] in scripted.calls("optimizer")[1].messages[-1].content


def test_an_edit_that_rebuilds_an_earlier_candidate_is_refused(staging, tmp_path):
    earlier = stage(staging, tmp_path / "earlier", {"id": "c0", "parent_id": "H0", "origin": "t", "description": "t"})
    apply_edit(earlier, HarnessEdit.model_validate(EDIT))
    scripted.register("optimizer", [EDIT] * 3)
    notes, usage, problems = asyncio.run(structured_edit(staging, "fix it", "H0", "scripted:optimizer", 60, [GROUP],
                                                         (signature(earlier),)))
    assert problems == ["it makes the same harness as an earlier candidate of this block; make a different edit"]
    assert notes == ["edit rejected after 3 asks"] and signature(staging) == signature(BUNDLES / "H0")  # left as it was


def test_two_candidates_of_a_block_never_carry_the_same_edit(context):
    scripted.register("agent", [eager_agent] * 400)
    scripted.register("judge", [shop_judge] * 80)
    scripted.register("analyst", [lambda m, schema: CAUSE if schema.__name__ == "GroupCause" else SPEC] * 12)
    words = {**EDIT, "components": []}  # a prompt the eager agent ignores: c1 still fails, so c2 is built from it
    other = {**EDIT, "system_prompt_addition": "", "components": [{"name": "look_before_act", "addresses": GROUP}]}
    scripted.register("optimizer", [tied(words), tied(words), tied(other)])
    run_id, final = asyncio.run(api.evolve_harness("H0", ["shop-reserve-drill"], ["shop-rescued"], context, candidates=2,
                                                   mode="aggregate"))
    scripted.assert_consumed("optimizer")
    c1, c2 = final["lineage"][f"{run_id}:c1"], final["lineage"][f"{run_id}:c2"]
    assert c1.problems == () and c2.problems == () and signature(Path(c1.path)) != signature(Path(c2.path))
    assert "neither validation Abstain (grounded) nor Pair (grounded) rose" in c1.reason and final["selected"] == f"{run_id}:H0"
    assert "needs at least 3" in final["lineage"][f"{run_id}:H0"].reason


def test_guessed_calls_are_failed_lookups_of_ids_seen_nowhere_before():
    from harness.components import guessed_calls, without_examples
    from state.records import Observation

    miss = Observation(tool="get_employee", args={"employee_id": "E-9985"}, ok=False, error_code="not_found", message="no such employee")
    empty = Observation(tool="find_orders", args={"order_id": "ORD-7"}, ok=True, output=[])
    found = Observation(tool="find_employees", args={"name": "Ana Diaz"}, ok=True, output=[{"employee_id": "E-1001"}])
    read = Observation(tool="get_employee", args={"employee_id": "E-1001"}, ok=False, error_code="not_found", message="down")
    assert guessed_calls("Give Ana Diaz a day off.", [miss, empty]) == ["get_employee(employee_id='E-9985')", "find_orders(order_id='ORD-7')"]
    assert guessed_calls("Give E-9985 a day off.", [miss]) == []  # the request named it
    assert guessed_calls("Give Ana Diaz a day off.", [found, read]) == []  # an earlier result showed it
    assert guessed_calls("Give Ana Diaz a day off.", [read.model_copy(update={"ok": True, "output": {"name": "Ana"}})]) == []  # it worked
    assert guessed_calls("Give Ana Diaz a day off.", [miss.model_copy(update={"source": "harness"})]) == []  # the harness's own lookup
    described = 'employee_id: an employee id such as "E-9985", for example E-1002.'
    assert guessed_calls(without_examples(described), [miss]) == ["get_employee(employee_id='E-9985')"]  # an example is no record
    assert without_examples(described).startswith("employee_id: an employee id ,") and "E-1002" not in without_examples(described)


def test_a_give_up_after_guessed_ids_is_its_own_failure_kind():
    from roles.failure_analyst import failure_records
    from state.records import EpisodeKey, EpisodeRecord, Grade, Observation

    entries = load_catalog()
    pair = next(iter(entries))
    key = EpisodeKey(harness_hash="h", env_hash="e", task_id="t", side="act", model="m", seed=0, trial=0)
    guess = Observation(tool="get_record", args={"record_id": "ZQ-98765"}, ok=False, error_code="not_found", message="not found")
    refusal = Grade(side="act", success=False, abstained=True, committed=False, grounded=False)
    records = [EpisodeRecord(key=key, pair_id=pair, bundle="b", status="done", termination="final_answer", grade=refusal,
                             observations=observations) for observations in ((guess,), ())]
    guessed, plain = failure_records(records, entries)
    assert (guessed.kind, guessed.guesses) == ("guessed_identifier", ("get_record(record_id='ZQ-98765')",))
    assert plain.kind == "over_abstained" and plain.category == guessed.category == FEASIBLE
    assert "Calls on ids it had seen nowhere (guessed), which failed or found nothing: get_record(record_id='ZQ-98765')" in describe([guessed])


def test_failures_on_feasible_tasks_group_by_kind_whatever_their_twins_mutation():
    """Filed under the twin's mutation, over-abstentions on two pairs of different categories made two groups of one."""
    from roles.failure_analyst import failure_records
    from state.records import EpisodeKey, EpisodeRecord, Grade

    entries = load_catalog()
    by_category = {e.pair.mutation.category: p for p, e in entries.items()}
    pairs = list(by_category.values())[:2]
    assert len({entries[p].pair.mutation.category for p in pairs}) == 2

    def record(pair: str, side: str) -> EpisodeRecord:
        key = EpisodeKey(harness_hash="h", env_hash="e", task_id=entries[pair].pair.task.id, side=side, model="m", seed=0, trial=0)
        grade = Grade(side=side, success=False, abstained=side == "act", committed=side == "abstain", grounded=False)
        return EpisodeRecord(key=key, pair_id=pair, bundle="b", status="done", termination="final_answer", grade=grade)

    failures = failure_records([record(p, side) for p in pairs for side in ("act", "abstain")], entries)
    groups = [(g.kind, g.category, len(m), g.recurring) for g, m in group_failures(failures)]
    assert groups[0] == ("over_abstained", FEASIBLE, 2, True)
    assert sorted(groups[1:]) == sorted((f.kind, entries[f.pair_id].pair.mutation.category, 1, False) for f in failures if f.side == "abstain")


def test_the_catalog_puts_the_components_built_for_the_diagnosed_failures_first():
    lines = catalog_text(["guessed_identifier"]).splitlines()
    assert len(lines) == len(LIBRARY)
    built = [line.split(" ")[1] for line in lines if "(built for: guessed identifier)" in line]
    assert set(built) == {n for n, c in LIBRARY.items() if "guessed_identifier" in c.addresses} >= {"ground_identifiers", "resolve_named_entities"}
    assert [line.split(" ")[1] for line in lines[:len(built)]] == built
    assert "built for" not in catalog_text()


def test_the_verifiers_own_failures_tell_a_change_left_undone_from_a_wrong_answer():
    from envs.certify import perturbations
    from envs.spec import write_tools
    from envs.verify import committed, verify
    from roles.failure_analyst import failure_kind

    entry = load_catalog(FIXTURES)["shop-reserve-drill"]
    task, writes, kinds = entry.pair.task, write_tools(entry.env), {}
    key = EpisodeKey(harness_hash="h", env_hash="e", task_id="t", side="act", model="m", seed=0, trial=0)
    for name, outcome in perturbations(entry.env, task):
        grade = Grade(side="act", success=False, abstained=False, committed=bool(committed(task, outcome.calls, writes)),
                      grounded=False, failures=verify(task, outcome).failures)
        kinds[name] = failure_kind(EpisodeRecord(key=key, pair_id="p", bundle="b", status="done", termination="final_answer", grade=grade))
    assert kinds == {"answer without price": "wrong_answer", "answer with wrong price": "wrong_answer",
                     "writes left out": "no_change", "empty answer, no writes": "no_change"}


def test_an_answer_without_the_change_asked_for_points_the_catalog_at_the_components_that_send_the_agent_back():
    lines = catalog_text(["no_change/feasible"]).splitlines()
    built = [line.split(" ")[1] for line in lines if "(built for: no change)" in line]
    assert {"follow_through", "check_change_made"} <= set(built)
    assert [line.split(" ")[1] for line in lines[:len(built)]] == built


def test_the_catalog_says_what_each_component_would_have_done_on_the_training_episodes():
    """Replayed over std15's adopted candidate's episodes, answer_from_results would have stepped into failures only and
    flag_multiple_matches into more passed episodes than failed ones: of the components built for one group, the one
    that steps into more failures than passed episodes comes first."""
    replay = Replay(failed=24, passed=10, stepped_in={"answer_from_results": (6, 0), "flag_multiple_matches": (5, 6),
                                                      "stop_on_indistinct_matches": (2, 1)},
                    undecided={"confirm_final_decision": 34, "follow_through": 21})
    lines = catalog_text(["did_not_abstain/ambiguous_entity"], replay).splitlines()
    names = [line.split(" ")[1] for line in lines]
    assert names.index("answer_from_results") < names.index("stop_on_indistinct_matches") < names.index("flag_multiple_matches")
    assert max(names.index(n) for n, c in LIBRARY.items() if c.built_for("did_not_abstain/ambiguous_entity")) < min(
        names.index(n) for n, c in LIBRARY.items() if not c.built_for("did_not_abstain/ambiguous_entity"))
    line = dict(zip(names, lines))
    assert line["flag_multiple_matches"].startswith("- flag_multiple_matches (built for: did not abstain, ambiguous entity twins; on "
                                                    "the training episodes it would have stepped in on 5 of 24 failed and 6 of 10 passed): ")
    assert "(built for: did not abstain; what it does on the training episodes turns on a model's answer or a lookup)" in line["confirm_final_decision"]
    assert "stepped in on 0 of 24 failed and 0 of 10 passed, 21 left to a model's answer or a lookup)" in line["follow_through"]
    assert catalog_text(["did_not_abstain/ambiguous_entity"], Replay()) == catalog_text(["did_not_abstain/ambiguous_entity"])


def test_the_catalog_says_what_each_component_does_on_the_training_pairs_reference_solutions():
    """A harness taught to act next answers the twins as if nothing had changed (std15: all 14 of the infeasible
    episodes its adopted candidate failed); the training pairs' reference solutions, replayed on the twins, show
    which components would stop that before any episode does."""
    replay = Replay(failed=4, passed=2, pairs=6, references={"stop_on_negative_evidence": (3, 0), "check_related_authorization": (1, 1),
                                                             "flag_multiple_matches": (4, 5)})
    lines = catalog_text(["did_not_abstain/broken_tool"], replay).splitlines()
    names = [line.split(" ")[1] for line in lines]
    line = dict(zip(names, lines))
    assert ("on the 6 training pairs' reference solutions played on as if nothing had changed, it steps into 3 twins and 0 "
            "feasible sides") in line["stop_on_negative_evidence"]
    assert "reference solutions" not in line["look_before_act"]  # it steps into none of them
    assert names.index("stop_on_negative_evidence") < names.index("check_before_commit") < names.index("flag_multiple_matches")
    assert "reference solutions" not in catalog_text(["did_not_abstain/broken_tool"], Replay(failed=4, passed=2))


def test_the_library_replayed_on_a_pairs_reference_solution_steps_into_its_twin():
    entry = load_catalog()["retail-late-delivery-gateway-down"]  # the payment gateway's status tool fails on the twin
    steps = asyncio.run(reference_steps(entry))
    assert steps["stop_on_negative_evidence"] == {"act": False, "abstain": True}
    assert steps["look_before_act"] == {"act": False, "abstain": False}
    assert steps["resolve_named_entities"] == {"act": None, "abstain": None}  # it looks records up itself
    replayed = asyncio.run(replay_references({entry.pair.id: entry}))
    assert replayed["pairs"] == 1 and replayed["references"]["stop_on_negative_evidence"] == (1, 0)
    assert "look_before_act" not in replayed["references"]


def test_a_diagnosis_with_its_replay_comes_back_from_a_checkpoint_whole():
    """A resumed block reads the diagnosis from its checkpoint: a type the serializer does not allow comes back empty."""
    from graphs.runner import SERDE

    diagnosis = Diagnosis(groups=(FailureGroup(kind="did_not_abstain", category="missing_evidence", pair_ids=("p",), recurring=False),),
                          replay=Replay(failed=3, passed=1, stepped_in={"answer_from_results": (2, 0)}, undecided={"follow_through": 1}))
    assert SERDE.loads_typed(SERDE.dumps_typed(diagnosis)) == diagnosis
    assert SERDE.loads_typed(SERDE.dumps_typed({"replay": diagnosis.replay}))["replay"] == diagnosis.replay


def test_the_library_replayed_over_graded_episodes_counts_failed_and_passed_ones_apart():
    from roles.failure_analyst import replay_library

    entries = load_catalog(FIXTURES)
    pair = "shop-reserve-drill"
    task = entries[pair].pair.task.id

    def record(side: str, success: bool, observations: list[Observation], answer: str, status: str = "done") -> EpisodeRecord:
        key = EpisodeKey(harness_hash="h", env_hash="e", task_id=task, side=side, model="m", seed=0, trial=0)
        grade = Grade(side=side, success=success, abstained=False, committed=not success, grounded=True)
        return EpisodeRecord(key=key, pair_id=pair, bundle="b", status=status, termination="final_answer", grade=grade,
                             observations=tuple(observations), answer=answer)

    read = Observation(tool="get_item", args={"sku": "DR-220"}, ok=True, output={"sku": "DR-220", "price": 89.0})
    reserved = Observation(tool="reserve", args={"sku": "DR-220", "qty": 2}, ok=True, output={"reservation_id": "R-1"}, read_only=False)
    records = [record("act", True, [read, reserved], "Reserved: R-1."),
               record("abstain", False, [reserved], "Reserved two drills at 45.50 each."),
               record("abstain", False, [], "", status="infrastructure_error")]  # not graded: not counted
    replay = asyncio.run(replay_library(records, entries))
    assert (replay.failed, replay.passed) == (1, 1)
    assert replay.stepped_in["look_before_act"] == (1, 0)  # the failed episode wrote before reading anything
    assert replay.stepped_in["check_before_commit"] == (1, 1)
    assert replay.stepped_in["answer_from_results"] == (1, 0)  # 45.50 is in no result
    assert "one_write_per_turn" not in replay.stepped_in and not replay.undecided


def test_a_component_is_built_for_the_twins_of_its_category_whatever_the_failure_kind():
    """std12's H0 refused the ambiguous twin of its training pool without evidence (ungrounded abstain), a kind
    stop_on_indistinct_matches does not address; the component is built for that twin's category all the same."""
    group = "ungrounded_abstain/ambiguous_entity"
    lines = catalog_text([group]).splitlines()
    built = {line.split(" ")[1] for line in lines if "(built for:" in line}
    assert built == {n for n, c in LIBRARY.items() if c.built_for(group)}
    assert {"stop_on_indistinct_matches", "flag_multiple_matches"} <= built
    assert "(built for: ambiguous entity twins" in next(line for line in lines if line.startswith("- stop_on_indistinct_matches "))
    assert all("(built for:" in line for line in lines[:len(built)])
    assert not LIBRARY["stop_on_indistinct_matches"].built_for("ungrounded_abstain/feasible")
    # the edit checks read the same: an edit for that group must add one of them
    untied = HarnessEdit(rationale="r", components=[ComponentChoice(name="look_before_act", addresses=group)])
    assert "stop_on_indistinct_matches" in edit_problems(untied, {}, [group])[0]
    assert edit_problems(untied.model_copy(update={"components": [ComponentChoice(name="stop_on_indistinct_matches", addresses=group)]}),
                         {}, [group]) == []
