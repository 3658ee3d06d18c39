"""The generic control-logic components and their layering over a bundle's harness."""

import asyncio
import shutil

import pytest

from envs.spec import SpecError
from harness.abi import BaseHarness, EpisodeView, HarnessConfig, ToolRequest
from harness.bundle import BUNDLES, load_bundle
from harness.components import (
    CheckBeforeCommit,
    CheckRelatedAuthorization,
    ConfirmFinalDecision,
    FinalCheck,
    FlagMultipleMatches,
    LookBeforeAct,
    Stack,
    StopOnNegativeEvidence,
    SuppressDuplicateCalls,
)
from state.records import Observation, ToolInfo

READ = ToolInfo(name="get_permit", description="", input_schema={}, read_only=True)
WRITE = ToolInfo(name="issue_permit", description="", input_schema={}, read_only=False)


def view(*observations: Observation, ask=None) -> EpisodeView:
    return EpisodeView(instruction="Issue the permit.", context="", tools=[READ, WRITE], config=HarnessConfig(),
                       prompts={"system": "Be helpful.\n$context"}, skills={}, observations=list(observations), ask=ask)


def obs(output=None, ok=True, tool="get_permit", read_only=True, code=None, message="") -> Observation:
    return Observation(tool=tool, args={"id": "P-1"}, ok=ok, output=output, error_code=code, message=message, read_only=read_only)


WRITE_CALL = ToolRequest(id="c1", name="issue_permit", args={"id": "P-1"})
READ_CALL = ToolRequest(id="c2", name="get_permit", args={"id": "P-1"})


def test_look_before_act():
    c = LookBeforeAct()
    assert c.before_tool_call(view(), WRITE_CALL).action == "block"
    assert c.before_tool_call(view(), READ_CALL) is None
    assert c.before_tool_call(view(obs({"id": "P-1"})), WRITE_CALL) is None


def test_stop_on_negative_evidence_blocks_writes_only_after_such_evidence():
    c = StopOnNegativeEvidence()
    assert c.before_tool_call(view(obs({"status": "active"})), WRITE_CALL) is None
    revoked = view(obs({"status": "Revoked"}))
    decision = c.before_tool_call(revoked, WRITE_CALL)
    assert decision.action == "block" and "'revoked'" in decision.message and "get_permit" in decision.message
    assert c.before_tool_call(revoked, READ_CALL) is None
    failed = view(obs(ok=False, code="service_unavailable", message="down"))
    assert c.before_tool_call(failed, WRITE_CALL).action == "block"
    assert StopOnNegativeEvidence({"markers": ["frozen"]}).before_tool_call(revoked, WRITE_CALL) is None


def test_suppress_duplicate_calls():
    c = SuppressDuplicateCalls()
    earlier = obs({"id": "P-1", "status": "active"})
    decision = c.before_tool_call(view(earlier), READ_CALL)
    assert decision.action == "block" and earlier.text in decision.message
    assert c.before_tool_call(view(earlier), ToolRequest(id="c3", name="get_permit", args={"id": "P-2"})) is None


def test_suppress_duplicate_calls_tells_an_agent_stuck_in_a_loop_to_answer():
    c, v = SuppressDuplicateCalls({"stop_after": 2}), view(obs({"id": "P-1"}))
    messages = [c.before_tool_call(v, READ_CALL).message for _ in range(4)]
    assert all(m.startswith("Already called") for m in messages[:2])
    assert all("give your final answer now" in m for m in messages[2:])


def test_check_before_commit_replans_once():
    c, v = CheckBeforeCommit(), view(obs({"id": "P-1"}))
    assert c.before_tool_call(v, READ_CALL) is None
    assert c.before_tool_call(v, WRITE_CALL).action == "replan"
    assert c.before_tool_call(v, WRITE_CALL) is None


def test_flag_multiple_matches():
    c = FlagMultipleMatches()
    assert c.after_tool_result(view(), READ_CALL, obs([{"id": 1}, {"id": 2}])).startswith("Note: 2 records matched.")
    assert c.after_tool_result(view(), READ_CALL, obs({"matches": [{"id": 1}, {"id": 2}, {"id": 3}]})).startswith("Note: 3 records")
    assert c.after_tool_result(view(), READ_CALL, obs([{"id": 1}])) is None
    assert FlagMultipleMatches({"min_matches": 4}).after_tool_result(view(), READ_CALL, obs([1, 2, 3])) is None


def test_check_related_authorization():
    c = CheckRelatedAuthorization()
    note = c.after_tool_result(view(), READ_CALL, obs({"owner": {"name": "x", "authorization_status": "revoked"}, "consent": None}))
    assert note.startswith("Note: owner.authorization_status=revoked, consent=null.")
    assert c.after_tool_result(view(), READ_CALL, obs({"authorization_status": "active"})) is None


def test_confirm_final_decision_asks_once_and_abstains_on_no():
    asked = []

    async def ask(messages, schema):
        asked.append((messages[0].content, schema))
        return FinalCheck(can_complete=False, reason="the owner's authorisation was revoked")

    c = ConfirmFinalDecision()
    final = asyncio.run(c.finalize(view(obs({"status": "revoked"}), ask=ask), "Permit issued."))
    assert (final.action, final.text) == ("abstain", "I cannot complete this request: the owner's authorisation was revoked")
    assert asked[0][1] is FinalCheck and "Draft answer:\nPermit issued." in asked[0][0]
    committed = view(obs({"id": "P-1"}), obs({"ok": 1}, tool="issue_permit", read_only=False), ask=ask)
    assert asyncio.run(c.finalize(committed, "Permit issued.")) is None and len(asked) == 1


def test_stack_first_blocking_component_wins_and_notes_join():
    class Inner(BaseHarness):
        def after_tool_result(self, view, call, observation):
            return "inner note"

    stack = Stack(Inner(), [LookBeforeAct(), CheckBeforeCommit(), FlagMultipleMatches()])
    v = view()
    assert asyncio.run(stack.before_tool_call(v, WRITE_CALL)).message.startswith("Not run. Before changing anything")
    assert "checked_before_commit" not in v.memory
    note = asyncio.run(stack.after_tool_result(v, READ_CALL, obs([1, 2])))
    assert note.startswith("inner note\nNote: 2 records matched.")
    assert asyncio.run(stack.finalize(v, "ok")).action == "accept"


def test_bundle_components_and_skills_load(tmp_path):
    bundle_dir = tmp_path / "b"
    shutil.copytree(BUNDLES / "H0", bundle_dir)
    (bundle_dir / "components.yaml").write_text("- name: look_before_act\n- name: flag_multiple_matches\n  params: {min_matches: 3}\n")
    (bundle_dir / "skills").mkdir()
    (bundle_dir / "skills" / "verify.md").write_text("Verify first\nWhen: a fact is missing\nDo: say so\n")
    bundle = load_bundle(bundle_dir)
    harness = bundle.harness()
    assert isinstance(harness, Stack) and [type(c) for c in harness.components] == [LookBeforeAct, FlagMultipleMatches]
    assert harness.components[1].params.min_matches == 3
    v = view()
    v.skills = bundle.skills
    assert asyncio.run(harness.compose_instructions(v)) == "Be helpful.\n\nSkills:\n\nVerify first\nWhen: a fact is missing\nDo: say so"
    assert load_bundle("H0").hash != bundle.hash


@pytest.mark.parametrize("text,field", [
    ("- name: no_such_component\n", "[0].name"),
    ("- name: flag_multiple_matches\n  params: {min_matches: many}\n", "[0].params.min_matches"),
    ("- name: look_before_act\n  params: {surprise: 1}\n", "[0].params.surprise"),
    ("name: look_before_act\n", "(root)"),
])
def test_bad_components_file_names_file_and_field(tmp_path, text, field):
    bundle_dir = tmp_path / "b"
    shutil.copytree(BUNDLES / "H0", bundle_dir)
    (bundle_dir / "components.yaml").write_text(text)
    with pytest.raises(SpecError) as err:
        load_bundle(bundle_dir)
    assert str(bundle_dir / "components.yaml") in str(err.value) and field in str(err.value)
