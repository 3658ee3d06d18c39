"""Mutation menus: the facts of a reference path, the options derived from them, and the menu proposer in the
env_evolution graph with scripted models."""

import asyncio

import pytest
from pydantic import ValidationError

from envs.catalog import load_catalog
from envs.certify import certify
from envs.menu import MAX_OPTIONS, facts, menu
from graphs import api
from roles.models import scripted
from roles.mutation_proposer import choice_schema
from state.context import Context
from state.records import Mutation
from tests.conftest import FIXTURES
from tests.scripts import accept_review as ACCEPT, eager_agent
from tests.test_env_evolution import DIAGNOSIS, PARENT

CATALOG = load_catalog()
SHOP = load_catalog(FIXTURES)[PARENT]
# a pair per category that the menu derives; the built-in training pairs offer no
# conflicting_records or joint_constraints option (no entity recorded in two tables, no listed open option), so
# those two are shown on validation pairs
BY_CATEGORY = {
    "missing_evidence": "retail-jacket-delivery-date-missing",
    "broken_tool": "weather-sf-forecast-outage",
    "stale_record": "travel-london-return-passport-stale",
    "authorization_revoked": "retail-tent-refund-approval-revoked",
    "ambiguous_entity": "travel-sko-return-two-rosas",
    "conflicting_records": "hr-salary-letter-conflict",
    "joint_constraints": "courses-stat-section-joint",
    "cumulative_privacy": "retail-stove-warranty-disclosure",
}


def test_the_facts_are_the_values_the_reference_reads_before_its_first_write_and_relies_on():
    # list_items shows three items; get_item shows DR-220's name, price and stock; reserve writes.
    # The name is neither passed on nor stated, so it is no fact; the price is stated as "$89.00".
    got = [(f.call, f.tool, f.table, f.key, f.field, f.value) for f in facts(SHOP.env, SHOP.pair)]
    assert got == [(0, "list_items", "items", "DR-220", "sku", "DR-220"),
                   (1, "get_item", "items", "DR-220", "price", 89.0),
                   (1, "get_item", "items", "DR-220", "stock", 2)]


def test_each_option_of_the_shop_menu_is_derived_whole_and_certifies():
    options = menu(SHOP.env, SHOP.pair)
    assert [(o.id, o.category, o.operation) for o in options] == [
        ("O1", "broken_tool", "fail_tool"), ("O2", "missing_evidence", "delete_row"),
        ("O3", "missing_evidence", "clear_field"), ("O4", "missing_evidence", "redact_field"),
        ("O5", "missing_evidence", "redact_field")]
    broken = options[0].mutation
    assert broken.tools[0].tool == "get_item" and broken.tools[0].when == {"sku": "DR-220"}
    # price_history still shows the price, so failing get_item is certified with the stock as its witness
    assert broken.witness == ({"sku": "DR-220", "stock": 2},) and broken.scope.tools == ("get_item",)
    assert broken.evidence.tool == "get_item" and broken.evidence.contains == "upstream_unavailable"
    delete = options[1].mutation
    assert delete.state[0].op == "delete" and delete.scope.rows == {"items": ("DR-220",)} and delete.evidence.contains == "not_found"
    assert options[2].mutation.evidence.contains == '"price": null'
    for option in options:
        assert certify(SHOP.pair.model_copy(update={"mutation": option.mutation}), SHOP.env).passed, option.line()


@pytest.mark.parametrize("category", sorted(BY_CATEGORY))
def test_each_derived_category_certifies_on_a_catalog_pair(category):
    entry = CATALOG[BY_CATEGORY[category]]
    assert entry.pair.split == ("validation" if category in ("conflicting_records", "joint_constraints") else "train")
    options = [o for o in menu(entry.env, entry.pair) if o.category == category]
    assert options, f"no {category} option for {entry.pair.id}"
    mutation = options[0].mutation
    cert = certify(entry.pair.model_copy(update={"mutation": mutation}), entry.env)
    assert cert.passed, [c for c in cert.checks if not c.passed]
    assert mutation.evidence.contains and mutation.witness and (mutation.scope.rows or mutation.scope.tools)
    assert 0 < len(menu(entry.env, entry.pair)) <= MAX_OPTIONS


def test_a_disclosure_is_widened_by_a_category_the_request_does_not_share_and_a_status_never():
    entry = CATALOG["retail-stove-warranty-disclosure"]  # the claim shares name and phone; DSC-0082 shared the name
    widened = {op.key: op.fields for o in menu(entry.env, entry.pair) if o.category == "cumulative_privacy" for op in o.mutation.state}
    assert widened["DSC-0082"] == {"categories": "name,email"}
    clinic = CATALOG["clinic-registry-quasi-identifiers"]  # a consent's status "active" is read, and is no list of data
    assert not [o for o in menu(clinic.env, clinic.pair) if o.category == "cumulative_privacy"
                and any("status" in op.fields for op in o.mutation.state)]


def test_a_choice_outside_the_menu_is_refused_by_the_response_format():
    options = menu(SHOP.env, SHOP.pair)[:2]
    schema = choice_schema(options)
    assert schema.model_json_schema()["properties"]["option"]["enum"] == ["O1", "O2"]
    assert schema.model_validate({"option": "O2", "description": "d", "requirement": "r"}).option == "O2"
    with pytest.raises(ValidationError):
        schema.model_validate({"option": "O9", "description": "d", "requirement": "r"})


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", proposer_model="scripted:proposer",
                  reviewer_model="scripted:reviewer", catalog=str(FIXTURES), ledger=str(tmp_path / "ledger.db"))
    scripted.clear()


def choose(option: str):
    return {"option": option, "description": "the drill's price record is gone", "requirement": "the price must be stated"}


def test_the_graph_certifies_a_menu_choice_and_a_rejected_choice_is_not_offered_again(context):
    # the shop's menu has no ambiguous_entity option, and the pair's own twin is missing_evidence: the target becomes
    # the least covered category the menu offers, broken_tool
    plan = {"targets": [{"parent": PARENT, "category": "ambiguous_entity", "idea": "hide the price"}]}
    scripted.register("proposer", [plan, choose("O1"), choose("O3")])
    rejected = []

    def review(messages, schema):  # the semantic reviewer rejects round 1's choice; everything else is accepted
        if schema.__name__ == "Feasibility" and not rejected:
            rejected.append(True)
            return {"reasons": "a deleted item is not a missing price", "still_possible": True}
        return ACCEPT(messages, schema)

    scripted.register("reviewer", [review] * 4)
    scripted.register("agent", [eager_agent] * 3)
    scripted.register("judge", [])  # the eager agent reserves: no declining words to judge
    _, final = asyncio.run(api.evolve_envs([PARENT], DIAGNOSIS, context, proposers=1, max_refinements=1, batch_size=1, budget=1))
    scripted.assert_consumed()
    (outcome,) = final["outcomes"].values()
    assert outcome.status == "certified" and outcome.rounds == 2 and outcome.target.category == "broken_tool"
    assert "Idea: (your choice)" in scripted.calls("proposer")[1].messages[0].content  # the idea was for another category
    choices = [c for c in scripted.calls("proposer") if c.schema.__name__ == "MenuChoice"]
    # the wanted category's options only; O1 is gone after its rejection, and with none of that category left the
    # rest of the menu is offered
    options = [c.schema.model_json_schema()["properties"]["option"] for c in choices]
    enums = [o.get("enum") or [o["const"]] for o in options]
    assert enums == [["O1"], ["O2", "O3", "O4", "O5"]]
    assert "a deleted item is not a missing price" in choices[1].messages[0].content
    assert outcome.reviews[0].startswith("round 1: chose O1 [broken_tool]")
    mutation = Mutation.model_validate(outcome.mutation)
    assert mutation.state[0].op == "set" and mutation.state[0].fields == {"price": None}
    assert mutation.description == "the drill's price record is gone" and mutation.requirement == "the price must be stated"
    assert outcome.elapsed_s > 0 and {u.role for u in outcome.usage} == {"mutation_proposer", "semantic_reviewer", "rescue_reviewer"}


def test_a_claimed_rescue_route_is_run_and_rejects_only_when_it_shows_a_witness():
    from envs.mutation import apply_mutation
    from roles.rescue_reviewer import check_claim
    from state.evolution import RescueClaim
    from tests.test_env_evolution import RESCUABLE

    mutation = Mutation.model_validate(RESCUABLE)  # get_item hides the price; price_history still has it
    mutated = apply_mutation(SHOP.env, mutation).env

    def claim(tool, arguments, found=True):
        return check_claim(RescueClaim(reasons="r", route_found=found, tool=tool, arguments=arguments), mutation, mutated)

    real = claim("price_history", {"sku": "DR-220"})
    assert not real.accept and real.reasons.startswith('alternative route: price_history({"sku": "DR-220"}) still shows')
    invented = claim("get_item", {"sku": "DR-220"})
    assert invented.accept and "was run and shows no witness" in invented.reasons
    assert claim("reserve", {"sku": "DR-220", "qty": 2}).accept  # a write is no route, and is never run
    assert claim("", {}, found=False).accept


def test_costs_per_certified_pair():
    from graphs.report import proposal_costs
    from state.evolution import ProposalOutcome, ProposalTarget
    from state.records import UsageRecord

    def outcome(status, elapsed, *usage):
        return ProposalOutcome(target=ProposalTarget(id="t", parent=PARENT, category="missing_evidence"), status=status, pair_id="t",
                               usage=tuple(UsageRecord(role=r, model="m", input_tokens=i, output_tokens=o, latency_s=s) for r, i, o, s in usage),
                               elapsed_s=elapsed)

    rows = proposal_costs([outcome("certified", 300.0, ("mutation_proposer", 900, 100, 60.0), ("semantic_reviewer", 500, 100, 120.0)),
                           outcome("rejected", 600.0, ("mutation_proposer", 800, 200, 90.0))])
    assert rows == [
        {"role": "mutation_proposer", "calls": 2, "tokens": 2000, "minutes": 2.5},
        {"role": "semantic_reviewer", "calls": 1, "tokens": 600, "minutes": 2.0},
        {"role": "all roles", "calls": 3, "tokens": 2600, "minutes": 10.0},
        {"role": "per certified pair", "calls": 3.0, "tokens": 2600.0, "minutes": 10.0},
    ]
    assert proposal_costs([outcome("rejected", 60.0)])[-1] == {"role": "per certified pair", "calls": None, "tokens": None, "minutes": None}
