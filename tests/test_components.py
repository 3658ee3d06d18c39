"""The generic control-logic components and their layering over a bundle's harness."""

import asyncio
import json
import shutil

import pytest

from envs.spec import SpecError
from harness.abi import BaseHarness, EpisodeView, Final, HarnessConfig, ToolRequest, action_schema
from harness.bundle import BUNDLES, load_bundle
from harness.components import (
    AnswerFromResults,
    CallBeforeAnswering,
    CheckChangeMade,
    Citation,
    CiteBlockingEvidence,
    FollowThrough,
    CheckBeforeCommit,
    CompactObservations,
    GroundIdentifiers,
    OneWritePerTurn,
    PointToAskedFields,
    ReadBeforeWrite,
    ReaskUnparsedCalls,
    RefuseFailedRepeat,
    ReportTheChange,
    ResolveNamedEntities,
    named_changes,
    request_terms,
    search_tools,
    unseen_values,
    CheckRelatedAuthorization,
    ConfirmFinalDecision,
    FinalCheck,
    FlagMultipleMatches,
    LOOKED_UP,
    indistinct,
    LookBeforeAct,
    Stack,
    StopOnIndistinctMatches,
    StopOnNegativeEvidence,
    SuppressDuplicateCalls,
    _read,
    _said,
    stepped_in,
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
    assert c.before_tool_call(view(obs({"id": "P-1", "status": "active"})), WRITE_CALL) is None
    revoked = view(obs({"id": "P-1", "status": "Revoked"}))
    decision = c.before_tool_call(revoked, WRITE_CALL)
    assert decision.action == "block" and "'revoked'" in decision.message and "get_permit" in decision.message
    assert c.before_tool_call(revoked, READ_CALL) is None
    failed = view(obs(ok=False, code="service_unavailable", message="down"))
    assert c.before_tool_call(failed, WRITE_CALL).action == "block"
    assert StopOnNegativeEvidence({"markers": ["frozen"]}).before_tool_call(revoked, WRITE_CALL) is None


def test_stop_on_negative_evidence_reads_only_the_records_the_change_relies_on():
    """Over the catalog's reference solutions outside the bench it blocked the right change on 13 of the 42 feasible
    tasks that make one: a former consent of the same patient revoked, an earlier salary superseded, "revoked_on":
    null in every signatory."""
    c = StopOnNegativeEvidence()
    release = ToolRequest(id="c1", name="issue_permit", args={"patient_id": "P-1", "consent_id": "CN-2"})
    former = {"patient_id": "P-1", "consents": [{"consent_id": "CN-1", "patient_id": "P-1", "status": "revoked"},
                                                {"consent_id": "CN-2", "patient_id": "P-1", "status": "active", "revoked_on": None}]}
    assert c.before_tool_call(view(obs(former)), release) is None
    assert c.before_tool_call(view(obs({"owner": "someone else", "status": "revoked"})), release) is None
    named = {"patient_id": "P-1", "consents": [{"consent_id": "CN-2", "patient_id": "P-1", "status": "revoked"}]}
    assert c.before_tool_call(view(obs(named)), release).action == "block"
    delegation = {"delegations": [{"delegate_id": "P-1", "note": "Revoked last week"}]}  # its value, under another name
    assert c.before_tool_call(view(obs(delegation)), release).action == "block"
    outage = {"periods": [{"date": "2026-08-01", "temperature_f": "unavailable"}]}  # a service or a value not there
    assert c.before_tool_call(view(obs(outage)), release).action == "block"


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


# ---- components for small models ----

FIND = ToolInfo(name="find_permits", description="Finds permits by the applicant's name. Returns permit_id, address, status.",
                input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, read_only=True)
GET = ToolInfo(name="get_permit", description="One permit by its id.",
               input_schema={"type": "object", "properties": {"permit_id": {"type": "string"}}, "required": ["permit_id"]}, read_only=True)
ISSUE = ToolInfo(name="issue_permit", description="Issues a permit.",
                 input_schema={"type": "object", "properties": {"permit_id": {"type": "string"}, "fee": {"type": "number"},
                                                                "kind": {"type": "string", "enum": ["A1", "B2"]}},
                               "required": ["permit_id"]}, read_only=False)


def small_view(*observations: Observation, instruction="Issue Ana Ruiz's permit.", lookup=None) -> EpisodeView:
    return EpisodeView(instruction=instruction, context="", tools=[FIND, GET, ISSUE], config=HarnessConfig(),
                       prompts={"system": "$context"}, skills={}, observations=list(observations), lookup=lookup)


def seen(tool, args, output=None, ok=True, code=None, source="agent", read_only=True) -> Observation:
    return Observation(tool=tool, args=args, ok=ok, output=output, error_code=code, message="no such permit" if code else "",
                       read_only=read_only, source=source)


def call(_tool, **args) -> ToolRequest:
    return ToolRequest(id="c", name=_tool, args=args)


def test_ground_identifiers_blocks_an_id_seen_nowhere_and_names_the_tools_that_find_it():
    c = GroundIdentifiers()
    guess = lambda v, request: asyncio.run(c.before_tool_call(v, request))  # noqa: E731
    decision = guess(small_view(), call("get_permit", permit_id="BP-2291"))
    assert decision.action == "block"
    assert decision.message == ("Not run: permit_id='BP-2291' appears nowhere in the request or in any result so far, so it "
                                "would be a guess. Find the real value first, with find_permits, get_permit. Search by what the "
                                "request names, for example find_permits(name='Ana Ruiz').")
    # a search already made is not suggested again
    none_found = seen("find_permits", {"name": "Ana Ruiz"}, [])
    assert guess(small_view(none_found), call("get_permit", permit_id="BP-2291")).message.endswith(
        "Find the real value first, with find_permits, get_permit.")
    found = seen("find_permits", {"name": "Ana Ruiz"}, [{"permit_id": "BP-2291"}], source="harness")
    assert guess(small_view(found), call("get_permit", permit_id="bp-2291")) is None  # first seen in a result
    assert guess(small_view(instruction="Issue permit BP-2291."), call("issue_permit", permit_id="BP-2291")) is None
    # not identifiers: names, enum values, amounts, dates; and an id that is only a prefix of one seen is still unseen
    assert guess(small_view(), call("find_permits", name="Ana Ruiz")) is None
    assert guess(small_view(found), call("issue_permit", permit_id="BP-2291", fee=120.5, kind="B2")) is None
    assert guess(small_view(found), call("get_permit", permit_id="BP-229")).action == "block"
    # an id a tool description gives as an example is no record; one it names otherwise is known
    described = small_view()
    described.tools = [GET.model_copy(update={"description": 'One permit by its id, such as "BP-9999"; the office is OFF-12.'}), ISSUE]
    assert guess(described, call("get_permit", permit_id="BP-9999")).action == "block"
    assert guess(described, call("get_permit", permit_id="OFF-12")) is None
    # an id a call found a record with is known; one a call found nothing with is still a guess
    got = seen("get_permit", {"permit_id": "BP-7"}, {"owner_consent": "revoked"})
    assert guess(small_view(got), call("issue_permit", permit_id="BP-7")) is None
    empty = seen("find_permits", {"name": "BP-8"}, [])
    assert guess(small_view(empty), call("issue_permit", permit_id="BP-8")).action == "block"


def test_ground_identifiers_makes_the_search_itself_from_the_second_guess():
    """std18: the local model, told which tools find an id, called get_order with the same invented id in 7 of 10 turns."""
    made = []

    async def lookup(tool, args):
        made.append((tool, args))
        found = [{"permit_id": "BP-7", "status": "open"}] if args == {"name": "Ana Ruiz"} else []
        v.observations.append(seen(tool, args, found, source="harness"))
        return v.observations[-1]

    v, c = small_view(lookup=lookup), GroundIdentifiers()
    first = asyncio.run(c.before_tool_call(v, call("get_permit", permit_id="BP-1")))
    assert made == [] and first.message.endswith("for example find_permits(name='Ana Ruiz').")
    second = asyncio.run(c.before_tool_call(v, call("get_permit", permit_id="BP-1")))
    assert made == [("find_permits", {"name": "Ana Ruiz"})]
    assert second.action == "block" and second.message.endswith(
        'I searched for you: find_permits(name=\'Ana Ruiz\') returned: [{"permit_id": "BP-7", "status": "open"}]\nUse the ids it shows.')
    assert asyncio.run(c.before_tool_call(v, call("get_permit", permit_id="BP-7"))) is None  # now seen
    # nothing left to search: the message alone; and never with search_from 0
    third = asyncio.run(c.before_tool_call(v, call("get_permit", permit_id="BP-2")))
    assert made == [("find_permits", {"name": "Ana Ruiz"})] and third.message.endswith("with find_permits, get_permit.")
    v2 = small_view(lookup=lookup)
    never = GroundIdentifiers({"search_from": 0})
    for _ in range(3):
        asyncio.run(never.before_tool_call(v2, call("get_permit", permit_id="BP-1")))
    assert len(made) == 1


def test_one_write_per_turn():
    c, v = OneWritePerTurn(), small_view()
    assert c.before_tool_call(v, call("issue_permit", permit_id="A")) is None
    assert c.before_tool_call(v, call("get_permit", permit_id="A")) is None
    assert c.before_tool_call(v, call("issue_permit", permit_id="B")).action == "block"
    v.turn += 1
    assert c.before_tool_call(v, call("issue_permit", permit_id="B")) is None


def test_refuse_failed_repeat_only_for_the_call_that_just_failed():
    c = RefuseFailedRepeat()
    failed = seen("get_permit", {"permit_id": "X-1"}, ok=False, code="not_found")
    decision = c.before_tool_call(small_view(failed), call("get_permit", permit_id="X-1"))
    assert decision.action == "block" and "(not_found: no such permit)" in decision.message and "find_permits" in decision.message
    assert c.before_tool_call(small_view(failed), call("get_permit", permit_id="X-2")) is None
    other = seen("find_permits", {"name": "Ana"}, ok=False, code="bad_request")
    assert c.before_tool_call(small_view(failed, other), call("get_permit", permit_id="X-1")) is None  # after a different failure


def test_compact_observations_shows_the_first_rows_and_keeps_nulls():
    c = CompactObservations({"min_chars": 10, "rows": 2})
    rows = [{"permit_id": f"P-{i}", "note": "", "tags": [], "fee": None} for i in range(5)]
    shown = c.present(small_view(), call("find_permits", name="x"), seen("find_permits", {"name": "x"}, rows))
    assert json.loads(shown) == [{"permit_id": "P-0", "fee": None}, {"permit_id": "P-1", "fee": None},
                                 "... 3 more; narrow the search to see them"]
    assert c.present(small_view(), call("get_permit"), seen("get_permit", {}, {"permit_id": "P-0"})) is None  # nothing to cut
    assert CompactObservations().present(small_view(), call("find_permits"), seen("find_permits", {}, rows)) is None  # short


def test_resolve_named_entities_looks_up_names_and_reads_the_records_found():
    made = []

    async def lookup(tool, args):
        made.append((tool, args))
        if tool == "find_permits" and args == {"name": "Ana Ruiz"}:
            return seen(tool, args, [{"permit_id": "BP-7", "status": "open"}], source="harness")
        if tool == "get_permit":
            return seen(tool, args, {"permit_id": "BP-7", "owner_consent": "revoked"}, source="harness")
        return seen(tool, args, [], source="harness")

    async def recorded(tool, args):  # as the runtime does, the view keeps every lookup
        v.observations.append(await lookup(tool, args))
        return v.observations[-1]

    v = small_view(instruction="Please issue Ana Ruiz's permit for the Oak Street deck.", lookup=recorded)
    asyncio.run(ResolveNamedEntities().initialize(v))
    assert made == [("find_permits", {"name": "Ana Ruiz"}), ("find_permits", {"name": "Oak Street"}),
                    ("get_permit", {"permit_id": "BP-7"})]
    assert v.instruction.startswith("Please issue Ana Ruiz's permit for the Oak Street deck.\n\n(Looked up before you started")
    assert '- get_permit({"permit_id": "BP-7"}) -> {"permit_id": "BP-7", "owner_consent": "revoked"}' in v.instruction
    assert "Oak Street\"}) ->" not in v.instruction  # empty results are not shown
    assert [o.args for o in _read(v)] == [{"name": "Ana Ruiz"}, {"permit_id": "BP-7"}]  # nor counted as read
    assert request_terms("Dr. Castellanos asked us to raise the cap on her Renaissance art section; email 'Lab A' at 9:30.") == [
        "Lab A", "Castellanos", "Renaissance"]


def test_resolve_named_entities_shows_the_records_holding_most_of_the_request_and_reads_those_first():
    tool = lambda name, field: ToolInfo(name=name, description="", read_only=True, input_schema={  # noqa: E731
        "type": "object", "properties": {field: {"type": "string"}}, "required": [field]})
    patient = {"patient_id": "PT-1", "name": "Tou Nguyen", "city": "Clovis",
               "prescriptions": [{"rx_id": "RX-1", "drug": "atorvastatin"}, {"rx_id": "RX-2", "drug": "hydrochlorothiazide"}]}
    namesake = {"patient_id": "PT-4", "name": "Tou Nguyen-Vang", "city": "Fresno"}
    neighbour = {"patient_id": "PT-9", "name": "Ann Lee", "city": "Clovis"}
    results = {("find_patients", "Tou Nguyen"): [patient, namesake], ("find_patients", "Clovis"): [patient, neighbour]}

    async def lookup(name, args):
        output = results.get((name, args.get("name")), {next(iter(args)): next(iter(args.values())), "read": True})
        v.observations.append(seen(name, args, output if name.startswith("get") else output or [], source="harness"))
        return v.observations[-1]

    v = EpisodeView(instruction="Tou Nguyen is at our Clovis store to refill his hydrochlorothiazide.", context="",
                    tools=[tool("find_patients", "name"), tool("get_patient", "patient_id"), tool("get_prescription", "rx_id")],
                    config=HarnessConfig(), prompts={}, skills={}, lookup=lookup)
    asyncio.run(ResolveNamedEntities({"max_details": 2}).initialize(v))
    # the patient holds four of the request's words, the prescription it names one, the others fewer than half of four
    assert [(o.tool, o.args) for o in v.observations[2:]] == [("get_patient", {"patient_id": "PT-1"}),
                                                              ("get_prescription", {"rx_id": "RX-2"})]
    added = v.instruction.split(LOOKED_UP)[1]
    assert "PT-1" in added and "PT-4" not in added and "PT-9" not in added
    assert '(1 more found hold fewer of the request\'s words)' in added  # the namesake, left out of the first search
    assert 'find_patients({"name": "Clovis"})' not in added  # it found nothing else worth showing
    assert [o.args for o in _read(v)] == [{"name": "Tou Nguyen"}, {"patient_id": "PT-1"}, {"rx_id": "RX-2"}]


def test_resolve_named_entities_reads_the_records_a_found_record_lists_by_id():
    tool = lambda name, field: ToolInfo(name=name, description="", read_only=True, input_schema={  # noqa: E731
        "type": "object", "properties": {field: {"type": "string"}}, "required": [field]})
    customer = {"customer_id": "C-1", "full_name": "Quentin Dunmore", "order_ids": ["CS-1", "CS-2"]}

    async def lookup(name, args):
        if name == "lookup_customer":
            output = [customer] if args == {"query": "Quentin Dunmore"} else []
        else:
            output = {**args, "carrier": "UPS"}
        v.observations.append(seen(name, args, output, source="harness"))
        return v.observations[-1]

    v = EpisodeView(instruction="On what day was Quentin Dunmore's jacket delivered? Can you tell me?", context="",
                    tools=[tool("lookup_customer", "query"), tool("get_order", "order_id")], config=HarnessConfig(), prompts={},
                    skills={}, lookup=lookup)
    asyncio.run(ResolveNamedEntities({"max_details": 3}).initialize(v))
    assert [(o.tool, o.args) for o in v.observations if o.tool == "get_order"] == [("get_order", {"order_id": "CS-1"}),
                                                                                   ("get_order", {"order_id": "CS-2"})]
    assert '- get_order({"order_id": "CS-2"}) -> {"order_id": "CS-2", "carrier": "UPS"}' in v.instruction


def test_request_terms_drop_sentence_openers_and_split_two_names_joined_by_and():
    assert request_terms("We'd like to use Cascade Comfort Heating & Air. Before I call them, check their CCB-7 licence.") == [
        "CCB-7", "Cascade Comfort Heating & Air"]
    assert request_terms("Amara Osei and Lucas Brandt signed with Whitmore & Hale. Tell me when Lena Hoffmann's VPN ends.") == [
        "Amara Osei", "Lucas Brandt", "Whitmore & Hale", "Lena Hoffmann", "VPN"]
    # times, ordinals and quantities are no record a search finds; a key that starts with digits is
    assert request_terms("Book Jordan Ellis on a flight after 7pm on the 20th for the 90-day pilot, ticket 4521-B.") == [
        "4521-B", "Jordan Ellis"]


def test_search_tools_take_names_addresses_and_locations_but_not_a_tool_that_needs_more():
    schema = lambda props, required=(): {"properties": {k: {"type": "string"} for k in props}, "required": list(required)}  # noqa: E731
    permits = ToolInfo(name="search_permits", description="", read_only=True, input_schema=schema(["applicant_name", "address", "status"]))
    weather = ToolInfo(name="resolve_point", description="", read_only=True, input_schema=schema(["location"], ["location"]))
    slots = ToolInfo(name="list_slots", description="", read_only=True, input_schema=schema(["name", "date"], ["name", "date"]))
    view = EpisodeView(instruction="", context="", tools=[permits, weather, slots], config=HarnessConfig(), prompts={}, skills={})
    assert [(t.name, arg) for t, arg in search_tools(view)] == [
        ("search_permits", "applicant_name"), ("search_permits", "address"), ("resolve_point", "location")]


def test_read_before_write_reads_the_record_first_and_then_lets_the_write_through():
    made = []

    async def lookup(tool, args):
        made.append((tool, args))
        return seen(tool, args, {"permit_id": "BP-7", "status": "open"}, source="harness")

    c, v = ReadBeforeWrite(), small_view(lookup=lookup)
    decision = asyncio.run(c.before_tool_call(v, call("issue_permit", permit_id="BP-7")))
    assert decision.action == "block" and made == [("get_permit", {"permit_id": "BP-7"})]
    assert 'get_permit(permit_id=\'BP-7\') returned: {"permit_id": "BP-7", "status": "open"}' in decision.message
    v.observations.append(seen("get_permit", {"permit_id": "BP-7"}, {"status": "open"}, source="harness"))
    assert asyncio.run(c.before_tool_call(v, call("issue_permit", permit_id="BP-7"))) is None
    assert asyncio.run(c.before_tool_call(v, call("get_permit", permit_id="BP-8"))) is None  # reads pass


def test_reask_unparsed_calls_and_call_before_answering():
    c = ReaskUnparsedCalls()
    v = small_view()
    final = asyncio.run(c.finalize(v, "1. `find_permits`: {\"name\": \"Ana"))
    assert final.action == "revise" and final.text.startswith("Your reply mentions find_permits but holds no call")
    assert asyncio.run(c.finalize(v, "The permit is issued.")) is None
    # with structured actions an answer cannot hold a call; one that breaks off at an opening bracket is asked again
    structured = small_view()
    structured.config = HarnessConfig(action_mode="structured")
    assert asyncio.run(c.finalize(structured, "1. `find_permits`: {\"name\": \"Ana")) is None
    final = asyncio.run(c.finalize(structured, "I called find_permits({"))
    assert final.action == "revise" and final.text.startswith("Your answer breaks off at 'I called find_permits({'")
    assert asyncio.run(c.finalize(structured, "The result was: [{")).action == "revise"
    assert asyncio.run(c.finalize(structured, "The result was: [{")) is None  # at most max_asks (2) times
    assert asyncio.run(ReaskUnparsedCalls().finalize(structured, "Permit BP-7 (fee 120) is issued.")) is None
    once = CallBeforeAnswering()
    assert asyncio.run(once.finalize(v, "Done.")).action == "revise"
    assert asyncio.run(once.finalize(v, "Done.")) is None  # once only
    v2 = small_view()
    v2.calls = 1  # a call was asked for, even if the harness blocked it
    assert asyncio.run(CallBeforeAnswering().finalize(v2, "Done.")) is None


def test_check_change_made_asks_once_when_nothing_was_changed():
    c, v = CheckChangeMade(), small_view(seen("get_permit", {"permit_id": "BP-7"}, {"status": "open"}))
    final = asyncio.run(c.finalize(v, "Issued."))
    assert final.action == "revise" and final.text.startswith("Nothing has been changed yet: no call of a tool that makes changes (issue_permit)")
    assert asyncio.run(c.finalize(v, "Issued.")) is None
    done = small_view(seen("issue_permit", {"permit_id": "BP-7"}, {"ok": True}, read_only=False))
    assert asyncio.run(CheckChangeMade().finalize(done, "Issued.")) is None
    question = small_view(seen("get_permit", {"permit_id": "BP-7"}, {"status": "open"}), instruction="When does Ana Ruiz's permit expire?")
    assert asyncio.run(CheckChangeMade().finalize(question, "On 2026-05-01.")) is None


def test_unseen_values_are_the_answers_numbers_dates_and_ids_no_source_holds():
    result = '{"salary": 86900, "letter_id": "LTR-00123", "date": "2026-03-30", "term": "2026FA"}'
    assert unseen_values("Salary 86,900.00 EUR, letter LTR-00123 of March 30, 2026, for Fall 2026.", [result]) == []
    assert unseen_values("It ends on 2026-09-30; 2 days and 12 days left.", ['{"end": "2026-06-30"}']) == ["2026-09-30", "12"]
    assert unseen_values("Grant ag-25292 approved.", ['{"grant_id": "AG-24480"}']) == ["ag-25292"]
    assert unseen_values("Approved as you asked for E-1052.", ["Approve E-1052's request."]) == []  # the request counts


def test_unseen_values_find_times_ranges_and_decimals_the_results_hold_in_another_form():
    """Half of the catalog's feasible reference answers (49 of 99) were sent back for a time taken out of a timestamp, a
    range of two results' values, a count with its unit or a price's trailing zero."""
    result = ('{"door": "D17", "starts_at": "2026-05-24T13:30:00", "ends_at": "2026-05-24T15:00:00", "wind_min_mph": 5, "wind_max_mph": 15, '
              '"price": 3.5, "total": 748.8, "warranty_months": 24}')
    answer = "Door D17 on May 24 from 13:30-15:00 (or 13:30 to 15:00); wind 5-15 mph; $3.50 a unit, 748.80 in all; a 24-month warranty."
    assert unseen_values(answer, [result]) == []
    assert unseen_values("From 13:45-15:00, wind 5-25 mph, $3.05; ends 2026-05-25.", [result]) == ["13:45-15:00", "5-25", "3.05", "2026-05-25"]
    assert unseen_values("Snapshot of 2026-03-16.", ["{}", "The snapshot was taken on March 16, 2026."]) == []


def test_answer_from_results_sends_an_invented_value_back_once():
    v = small_view(seen("get_permit", {"permit_id": "BP-7"}, {"permit_id": "BP-7", "fee": 120}))
    final = asyncio.run(AnswerFromResults().finalize(v, "Permit BP-7 is issued; fee 120, receipt RC-5531."))
    assert final.action == "revise" and final.text.startswith("Your answer gives RC-5531, which no tool result shows")
    assert asyncio.run(AnswerFromResults().finalize(v, "Permit BP-7 is issued; fee 120, receipt RC-5531.")) is None  # once
    assert asyncio.run(AnswerFromResults().finalize(small_view(seen("get_permit", {}, {"fee": 120})), "The fee is 120.")) is None


ASKS = ("Chloe Kowalski has asked about raising her overdraft limit, and the lending team wants the verified monthly "
        "income we hold for her and the name of her employer. What are they?")


def customer(**fields) -> Observation:
    return seen("get_customer", {"customer_id": "C-100162"}, {"customer_id": "C-100162", "name": "Chloe Kowalski",
                                                           "employer": "University of Sheffield", "verified_monthly_income": 3530.25,
                                                           "accounts": [{"account_id": "HV-2", "status": "active"}]} | fields)


def test_point_to_asked_fields_answers_a_claim_that_what_the_results_hold_is_not_there_once():
    """std16's bench: the customer record the harness had put in front of the agent held both values the request
    asked for, and the agent answered that the bank holds neither."""
    absent = "The lending team does not hold any verified monthly income or name of the employer for Chloe Kowalski."
    v = small_view(customer(), instruction=ASKS)
    final = asyncio.run(PointToAskedFields().finalize(v, absent))
    assert final.action == "revise"
    assert "get_customer: employer = University of Sheffield; get_customer: verified_monthly_income = 3530.25)" in final.text
    assert "Chloe Kowalski" not in final.text and "HV-2" not in final.text  # what the request gives, and fields it does not name
    assert asyncio.run(PointToAskedFields().finalize(v, absent)) is None  # once
    assert asyncio.run(stepped_in(PointToAskedFields(), small_view(instruction=ASKS), [customer()], absent)) is True  # no model asked
    for answer in ("Her employer is the University of Sheffield.", "She earns £3,530.25 a month.",  # a value given
                   "Chloe works at a university and earns well."):  # nothing said to be missing
        assert asyncio.run(PointToAskedFields().finalize(small_view(customer(), instruction=ASKS), answer)) is None
    twins = (customer(verified_monthly_income=None),  # the field the twin empties: the results show it missing
             customer(employer=""))
    for twin in twins:
        assert asyncio.run(PointToAskedFields().finalize(small_view(twin, instruction=ASKS), absent)) is None
    two = seen("get_customer", {"customer_id": "C-2"}, {"customer_id": "C-2", "employer": "Acme", "verified_monthly_income": 3530.25})
    assert asyncio.run(PointToAskedFields().finalize(small_view(customer(), two, instruction=ASKS), absent)) is None  # which one?
    failed = seen("get_customer", {"customer_id": "C-100162"}, ok=False, code="not_found")
    assert asyncio.run(PointToAskedFields().finalize(small_view(failed, instruction=ASKS), absent)) is None


def test_a_value_is_said_in_its_own_words_its_tokens_or_a_dates_parts():
    assert _said("University of Sheffield", "She works at the university of Sheffield.")
    assert _said(3530.25, "£3,530.25 a month") and _said(104.0, "an eGFR of 104 mL/min")
    assert _said("2026-03-07", "collected on March 7, 2026") and _said("2026-03-07T10:00:00", "on the 7th of Mar 2026")
    assert not _said("2026-03-07", "collected on March 8, 2026") and not _said("12", "in 2012")
    assert not _said("2026-13-07", "on 7 13 2026")  # no month 13


def test_cite_blocking_evidence_accepts_a_refusal_only_with_a_quote_from_a_result():
    replies = []

    async def ask(messages, schema):
        return replies.pop(0)

    def refusal_view():
        v = small_view(seen("get_permit", {"permit_id": "BP-7"}, {"owner_consent": "revoked on 2026-03-12"}))
        v.ask = ask
        return v

    replies.append(Citation(blocked=True, quote="owner_consent: Revoked on 2026-03-12"))
    assert asyncio.run(CiteBlockingEvidence().finalize(refusal_view(), "I cannot: consent was revoked.")) is None
    replies.append(Citation(blocked=True, quote="the permit is expired"))  # said nowhere
    v = refusal_view()
    final = asyncio.run(CiteBlockingEvidence().finalize(v, "I cannot: the permit expired."))
    assert final.action == "revise" and "make it now with the right tool (issue_permit)" in final.text
    assert asyncio.run(CiteBlockingEvidence().finalize(v, "I cannot.")) is None and replies == []  # asked once
    done = small_view(seen("issue_permit", {"permit_id": "BP-7"}, {"ok": True}, read_only=False))
    done.ask = ask
    assert asyncio.run(CiteBlockingEvidence().finalize(done, "Issued.")) is None  # a change was made: nothing to ask


def test_follow_through_keeps_a_quoted_refusal_and_hands_over_the_call_otherwise():
    replies, asked = [], []

    async def ask(messages, schema):
        asked.append(schema)
        reply = replies.pop(0)
        return schema.model_validate(reply)

    def answered(instruction="Issue Ana Ruiz's permit."):
        v = small_view(seen("get_permit", {"permit_id": "BP-7"}, {"owner_consent": "revoked on 2026-03-12"}), instruction=instruction)
        v.ask = ask
        return v

    # "Issue" names the write tool issue_permit: the request asks for a change, without asking the model
    replies += [{"blocked": True, "quote": "owner_consent revoked on 2026-03-12"}]
    assert asyncio.run(FollowThrough().finalize(answered(), "I cannot: consent was revoked.")) == Final(action="accept")
    assert [schema.__name__ for schema in asked] == ["Citation"]
    # a quote from a lookup the harness made and never showed the agent is no evidence
    unshown = answered()
    unshown.observations.append(seen("find_permits", {"name": "Oak Street"}, ok=False, code="not_found", source="harness"))
    unshown.memory["unshown"] = [1]
    replies += [{"blocked": True, "quote": "no such permit"}, {"final_answer": "It is open."}]
    assert asyncio.run(FollowThrough().finalize(unshown, "I cannot: no such permit.")) is None and replies == []
    replies += [{"blocked": False, "quote": ""}, {"tool": "issue_permit", "arguments": {"permit_id": "BP-7"}}]
    v = answered()
    final = asyncio.run(FollowThrough().finalize(v, "The permit can be issued."))
    assert final.action == "revise" and 'issue_permit({"permit_id": "BP-7"}). Make it now' in final.text
    assert asked[-1].model_json_schema() == action_schema([ISSUE])  # the proposal is constrained to the write tools
    assert asyncio.run(FollowThrough().finalize(v, "Issued.")) is None  # not again before the agent calls a tool
    # after a call, once more, and a guessed id is not handed over: the agent is told which tools find it
    v.observations.append(seen("find_permits", {"name": "Ana Ruiz"}, [{"permit_id": "BP-7"}]))
    replies += [{"blocked": False, "quote": ""}, {"tool": "issue_permit", "arguments": {"permit_id": "BP-99"}}]
    final = asyncio.run(FollowThrough().finalize(v, "It can be issued."))
    assert final.action == "revise" and "asks for issue_permit, which needs permit_id: no result so far gives it. Look it up " \
                                         "with find_permits, get_permit, then make the call" in final.text
    v.observations.append(seen("get_permit", {"permit_id": "BP-7"}, {"permit_id": "BP-7"}))
    assert asyncio.run(FollowThrough().finalize(v, "Issued.")) is None and replies == []  # `times` (2) used up
    replies += [{"blocked": False, "quote": ""}, {"final_answer": "It is open."}]
    assert asyncio.run(FollowThrough().finalize(answered(), "It is open.")) is None  # no call proposed: the answer stands
    # words that do not tell: the model is asked, and a question is not turned into a change
    for instruction in ("What became of Ana Ruiz's application?", "Ana Ruiz wants her permit. Sort it out."):
        replies.append({"asks_for": "information only"})
        asked.clear()
        assert asyncio.run(FollowThrough().finalize(answered(instruction), "Its owner consent was revoked on 2026-03-12.")) is None
        assert [schema.__name__ for schema in asked] == ["Intent"] and replies == []
    asked.clear()  # a request that asks politely only for reports is a question: nothing to ask the model
    assert asyncio.run(FollowThrough().finalize(answered("Can you tell me if Ana Ruiz's permit is open?"), "It is.")) is None
    assert asked == []
    replies += [{"asks_for": "a change"}, {"blocked": False, "quote": ""}, {"tool": "issue_permit", "arguments": {"permit_id": "BP-7"}}]
    assert asyncio.run(FollowThrough().finalize(answered("Ana Ruiz wants her permit. Sort it out."), "Noted.")).action == "revise"


def test_a_request_asks_for_a_change_in_the_words_of_a_write_tool_or_a_polite_verb_that_is_not_a_report():
    leave = [ToolInfo(name="get_leave", description="", input_schema={}, read_only=True),
             ToolInfo(name="list_leave_requests", description="", input_schema={}, read_only=True),
             ToolInfo(name="decide_leave_request", description="", input_schema={}, read_only=False),
             ToolInfo(name="enroll_student", description="", input_schema={}, read_only=False)]
    assert named_changes("Please enrol him in BUSN-2010 and tell me his id.", leave) == ["enrol"]
    assert named_changes("Emre's request is waiting for a decision; please approve it.", leave) == ["approve"]
    # "leave" and "request" are words of read-only tools too, and "tell" asks for a report
    assert named_changes("How many days of leave does Greta have left? What about her request? Can you tell me?", leave) == []
    assert named_changes("Could you book her on the 9am flight?", leave) == ["book"]
    assert named_changes("Which flight is she on? Can you check for her?", leave) == []
    assert named_changes("Update the file.", []) == []


def test_indistinct_records_are_named_as_searched_and_alike_in_the_requests_words():
    ana = {"applicant_name": "Ana Ruiz", "address": "4 Elm St", "status": "pending"}
    twins = [{"permit_id": "P-1", **ana}, {"permit_id": "P-2", **ana}]
    request = "Issue Ana Ruiz's permit for 4 Elm St."
    assert indistinct(request, seen("find_permits", {"name": "ana  ruiz"}, twins)) == ["P-1", "P-2"]
    other_street = [twins[0], {**twins[1], "address": "9 Oak Ave"}]  # the request's words single out P-1
    assert indistinct(request, seen("find_permits", {"name": "Ana Ruiz"}, other_street)) == []
    assert indistinct("Issue Ana Ruiz's permit.", seen("find_permits", {"name": "Ana Ruiz"}, other_street)) == ["P-1", "P-2"]
    namesake = [twins[0], {**twins[1], "applicant_name": "Ana Ruiz Gomez"}]  # not named as searched
    assert indistinct(request, seen("find_permits", {"name": "Ana Ruiz"}, namesake)) == []
    assert indistinct(request, seen("find_permits", {"name": "Ana Ruiz"}, twins[:1])) == []
    assert indistinct(request, seen("find_permits", {"name": "Ana Ruiz"}, twins, ok=False, code="down")) == []


def test_stop_on_indistinct_matches_blocks_changes_and_says_the_request_does_not_tell_which():
    ana = {"applicant_name": "Ana Ruiz", "status": "pending"}
    found = seen("find_permits", {"name": "Ana Ruiz"}, [{"permit_id": "P-1", **ana}, {"permit_id": "P-2", **ana}], source="harness")
    c, v = StopOnIndistinctMatches(), small_view(found)
    blocked = c.before_tool_call(v, call("issue_permit", permit_id="P-1"))
    assert blocked.action == "block" and "P-1, P-2" in blocked.message
    assert c.before_tool_call(v, call("get_permit", permit_id="P-1")) is None  # reading on is fine
    final = asyncio.run(c.finalize(v, "Issued permit P-1."))
    assert final.action == "abstain" and "find_permits" in final.text and "P-1, P-2" in final.text
    assert asyncio.run(c.finalize(v, "Two permits match Ana Ruiz: P-1 and P-2. Which one?")) is None  # it names them all
    v.memory["unshown"] = [0]  # a lookup the agent was never shown decides nothing
    assert asyncio.run(c.finalize(v, "Issued permit P-1.")) is None
    one = small_view(seen("find_permits", {"name": "Ana Ruiz"}, [{"permit_id": "P-1", **ana}]))
    assert asyncio.run(c.finalize(one, "Issued permit P-1.")) is None
    changed = small_view(found, seen("issue_permit", {"permit_id": "P-1"}, {"ok": True}, read_only=False))
    assert asyncio.run(c.finalize(changed, "Issued permit P-1.")) is None  # what was done is reported, not denied


def test_report_the_change_asks_once_for_an_answer_with_what_the_change_returned():
    made = seen("issue_permit", {"permit_id": "BP-7"}, {"permit_id": "BP-7", "receipt_id": "RC-0042", "fee": 120}, read_only=False)
    c, v = ReportTheChange(), small_view(made)
    final = asyncio.run(c.finalize(v, "The permit BP-7 has been issued."))
    assert final.action == "revise" and '"receipt_id": "RC-0042"' in final.text
    again = asyncio.run(c.finalize(v, "Issued."))  # asked once; then the result goes with the answer
    assert again.action == "replace" and again.text == ('Issued.\n\nissue_permit returned: {"permit_id": "BP-7", '
                                                        '"receipt_id": "RC-0042", "fee": 120}')
    assert asyncio.run(ReportTheChange({"append_result": False}).finalize(v, "Issued.")) is None
    assert asyncio.run(ReportTheChange().finalize(small_view(made), "Issued BP-7, receipt RC-0042.")) is None
    assert asyncio.run(ReportTheChange().finalize(small_view(), "Nothing to do.")) is None  # no change made


def test_a_component_replayed_over_a_recorded_episode_says_whether_it_would_have_stepped_in():
    """What the replay of the library (`roles.failure_analyst.replay_library`) counts, from the record alone."""
    ana = {"applicant_name": "Ana Ruiz", "status": "pending"}
    twins = seen("find_permits", {"name": "Ana Ruiz"}, [{"permit_id": "P-1", **ana}, {"permit_id": "P-2", **ana}])
    read = seen("get_permit", {"permit_id": "P-1"}, {"permit_id": "P-1", **ana})

    def replay(component, *observations, answer="Permit P-1 is pending.") -> bool | None:
        return asyncio.run(stepped_in(component, small_view(), list(observations), answer))

    assert replay(StopOnIndistinctMatches(), twins, read) is True  # an answer about one of two namesakes
    assert replay(StopOnIndistinctMatches(), read) is False
    assert replay(StopOnIndistinctMatches(), twins, read, answer="Two permits match: P-1 and P-2.") is False
    # a change blocked on the way: the first call it would not have let through counts
    issued = seen("issue_permit", {"permit_id": "P-1"}, {"ok": True}, read_only=False)
    assert replay(StopOnIndistinctMatches(), twins, issued, answer="Issued.") is True
    assert replay(LookBeforeAct(), issued, answer="Issued.") is True
    assert replay(LookBeforeAct(), read, issued, answer="Issued.") is False
    assert replay(FlagMultipleMatches(), twins) is True  # a note added to a result
    assert replay(CompactObservations(), seen("find_permits", {"name": "Ana"}, [{"permit_id": f"P-{i}", **ana} for i in range(40)])) is True
    # one that asks the model or looks a record up cannot be told from the record
    assert replay(ConfirmFinalDecision(), read) is None
    assert replay(ResolveNamedEntities(), read) is None
    # the harness's own lookups are no calls of the agent's
    assert replay(SuppressDuplicateCalls(), seen("get_permit", {"permit_id": "P-1"}, {}, source="harness"), read) is True
    assert replay(CallBeforeAnswering(), seen("find_permits", {"name": "Ana Ruiz"}, [], source="harness")) is True
