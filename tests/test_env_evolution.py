"""Environment evolution with scripted models: review, refinement bound,
certification, batch screening against τ, and the training-only boundary."""

import asyncio
import json

import pytest
import yaml

from envs.catalog import load_catalog, load_parent
from graphs import api
from state.paths import RunPaths
from roles.models import scripted
from roles.mutation_proposer import describe_parent
from state.context import Context
from state.evolution import Diagnosis, FailureGroup
from state.ledger import Ledger
from state.records import Mutation
from tests.conftest import FIXTURES
from tests.scripts import accept_review as ACCEPT, eager_agent, shop_agent, shop_judge

PARENT = "shop-reserve-drill"
DIAGNOSIS = Diagnosis(groups=(FailureGroup(kind="did_not_abstain", category="missing_evidence", pair_ids=("a", "b"), recurring=True,
                                           cause="acts although a required value is missing", evidence="writes"),), episodes=4, failures=2)


def fixture_mutation(pair_id: str) -> dict:
    return yaml.safe_load((FIXTURES / "shop" / "pairs" / f"{pair_id}.yaml").read_text())["mutation"]


PRICE_MISSING = fixture_mutation("shop-reserve-drill")   # certifies
RESCUABLE = fixture_mutation("shop-rescued")             # price_history still shows the price
INVALID = {**PRICE_MISSING, "state": [{"op": "set", "table": "no_such_table", "key": "x", "fields": {"a": 1}}]}


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", proposer_model="scripted:proposer",
                  reviewer_model="scripted:reviewer", proposals="free", catalog=str(FIXTURES), ledger=str(tmp_path / "ledger.db"))
    scripted.clear()


def plan(parent=PARENT, category="missing_evidence"):
    return {"targets": [{"parent": parent, "category": category, "idea": "hide the price"}]}


def evolve(context, **kw):
    settings = {"proposers": 1, "max_refinements": 2, "batch_size": 1, "tau": 0.4, "batches": 1, "budget": 1, **kw}
    return asyncio.run(api.evolve_envs([PARENT], DIAGNOSIS, context, **settings))


def test_certified_batch_admitted_when_the_harness_fails_to_abstain(context):
    scripted.register("proposer", [plan(), PRICE_MISSING])
    scripted.register("reviewer", [ACCEPT, ACCEPT])
    scripted.register("agent", [eager_agent] * 3)  # lookup, reserve, "Reserved …" on the infeasible side
    scripted.register("judge", [])  # the eager agent reports its reservation: nothing to judge
    run_id, final = evolve(context)
    scripted.assert_consumed()
    (outcome,) = final["outcomes"].values()
    assert outcome.status == "certified" and outcome.rounds == 1 and outcome.target.parent == PARENT
    assert outcome.pair_id.startswith(f"{PARENT}--missing-evidence-")
    assert all(c.split(":")[1].strip().startswith("pass") for c in outcome.checks) and len(outcome.checks) == 9
    (screening,) = final["screenings"]
    assert screening["failed_to_abstain"] == [outcome.pair_id] and screening["needed"] == 1 and screening["admitted"]
    assert final["admitted"] == [outcome.pair_id]
    ledger = Ledger(context.ledger)
    assert [p.status for p in ledger.proposals(run_id)] == ["certified"] and ledger.batches(run_id)[0]["admitted"] == 1
    written = load_catalog(RunPaths.here().pool(run_id))
    assert list(written) == [outcome.pair_id] and written[outcome.pair_id].pair.mutation == Mutation.model_validate(PRICE_MISSING)


def test_a_batch_below_tau_is_not_admitted(context):
    scripted.register("proposer", [plan(), PRICE_MISSING])
    scripted.register("reviewer", [ACCEPT, ACCEPT])
    scripted.register("agent", [shop_agent] * 2)  # lookup, then the refusal: the harness already abstains
    scripted.register("judge", [shop_judge])
    _, final = evolve(context)
    scripted.assert_consumed()
    assert final["screenings"][0]["failed_to_abstain"] == [] and not final["screenings"][0]["admitted"]
    assert final.get("admitted", []) == []


def test_an_alternative_route_is_rejected_then_refined(context):
    # round 1: the price is hidden from get_item but price_history still has it — the search rejects it
    # without asking the model; round 2: the price is gone everywhere, accepted and certified
    scripted.register("proposer", [plan(), RESCUABLE, PRICE_MISSING])
    scripted.register("reviewer", [{"accept": True, "reasons": "fine"}, ACCEPT, ACCEPT])
    scripted.register("agent", [eager_agent] * 3)
    scripted.register("judge", [])  # the eager agent reports its reservation: nothing to judge
    _, final = evolve(context)
    scripted.assert_consumed()
    (outcome,) = final["outcomes"].values()
    assert outcome.status == "certified" and outcome.rounds == 2
    assert outcome.reviews[0].startswith("round 1: rescue reviewer: alternative route: price_history(")
    feedback = scripted.calls("proposer")[2].messages[0].content
    assert "alternative route: price_history(" in feedback


def test_the_refinement_loop_is_bounded(context):
    scripted.register("proposer", [plan(), INVALID, INVALID, INVALID])
    scripted.register("reviewer", [])
    scripted.register("agent", [])
    _, final = evolve(context, max_refinements=2)
    scripted.assert_consumed()
    (outcome,) = final["outcomes"].values()
    assert outcome.status == "rejected" and outcome.rounds == 3
    assert [r.split(":")[0] for r in outcome.reviews] == ["round 1", "round 2", "round 3"]
    assert "no_such_table" in outcome.reason and final.get("screenings", []) == []


@pytest.mark.parametrize("proposals", ["free", "menu"])
def test_no_validation_or_bench_data_reaches_a_generation_role(tmp_path, proposals):
    catalog = load_catalog()
    # menus are computed by certifying their options: two training pairs whose menus take seconds, not a minute
    train = (sorted(p for p, e in catalog.items() if e.pair.split == "train")[:2] if proposals == "free"
             else ["retail-jacket-delivery-date-missing", "weather-sf-forecast-outage"])

    def propose(messages, schema):
        if schema.__name__ == "DesignPlan":
            return {"targets": [{"parent": p, "category": catalog[p].pair.mutation.category, "idea": "x"} for p in train]}
        if schema.__name__ == "MenuChoice":
            return {"option": schema.model_json_schema()["properties"]["option"]["enum"][0], "description": "d", "requirement": "r"}
        parent = next(p for p in train if catalog[p].pair.task.instruction.strip() in messages[0].content)
        return catalog[parent].pair.mutation.model_dump(mode="json")

    scripted.register("proposer", [propose] * 3)
    scripted.register("reviewer", [ACCEPT] * 4)
    context = Context(proposer_model="scripted:proposer", reviewer_model="scripted:reviewer", proposals=proposals, ledger=str(tmp_path / "l.db"))
    _, final = asyncio.run(api.evolve_envs(train, DIAGNOSIS, context, proposers=2, max_refinements=0, batch_size=5, budget=1))
    scripted.assert_consumed()
    assert sorted(o.status for o in final["outcomes"].values()) == ["certified", "certified"]
    prompts = "\n".join(m.content for name in ("proposer", "reviewer") for c in scripted.calls(name) for m in c.messages)
    held_out = [e for e in catalog.values() if e.pair.split != "train"]
    assert len(held_out) == 71  # validation 15 + 6 short, bench 30 + 20 short
    for e in held_out:
        for text in (e.pair.id, e.pair.task.instruction.strip(), e.pair.task.reference.answer.strip()):
            assert text not in prompts, f"{e.pair.split} data in a generation prompt: {text[:60]}"
    assert all(catalog[p].pair.task.instruction.strip() in prompts for p in train)
    scripted.clear()


def test_cli_funnel_and_diagnosis_file(context, tmp_path, capsys):
    from graphs.cli import main

    scripted.register("proposer", [plan(), PRICE_MISSING])
    scripted.register("reviewer", [ACCEPT, ACCEPT])
    scripted.register("agent", [eager_agent] * 3)
    scripted.register("judge", [shop_judge])
    diagnosis = tmp_path / "diagnosis.json"
    diagnosis.write_text(DIAGNOSIS.model_dump_json())
    args = ["--catalog", str(FIXTURES), "--ledger", context.ledger, "evolve-envs", "--diagnosis", str(diagnosis),
            "--model", "scripted:agent", "--judge-model", "scripted:judge", "--proposer-model", "scripted:proposer",
            "--reviewer-model", "scripted:reviewer", "--proposals", "free", "--parents", PARENT, "--proposers", "1", "--batch-size", "1",
            "--budget", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["funnel"] == {"proposals": 1, "passed_review": 1, "certified": 1, "admitted": 1}
    diagnosis.write_text('{"groups": "nope"}')
    assert main(args) == 2
    assert f"{diagnosis}: groups: Input should be a valid array" in " ".join(capsys.readouterr().err.split())
    args[args.index(str(diagnosis))] = "no-such-run"
    assert main(args) == 2 and "neither a file nor a run" in " ".join(capsys.readouterr().err.split())


def test_the_proposer_reads_the_parent_with_its_tools_signatures_and_the_rows_the_reference_touches():
    text = describe_parent(load_parent(PARENT, FIXTURES))
    assert "- get_item (read): Returns an item's name, price and stock. (sku: string)" in text
    assert "- reserve (write): Reserves units of an item for a customer. (sku: string, qty: integer)" in text
    assert '{"sku": "DR-220", "name": "Cordless drill", "price": 89.0, "stock": 2}' in text
    assert "Task (feasible here): Reserve two cordless drills" in text and "Answer: Reserved 2 cordless drills" in text


def test_a_plan_is_spread_over_the_categories_a_task_has_fewest_twins_of():
    from types import SimpleNamespace

    from graphs.env_evolution import spread

    def pair(id, task, category):
        return SimpleNamespace(id=id, task=SimpleNamespace(id=task), category=category)

    # task a: its own pair's twin and an evolved twin are missing_evidence; task b's pair is stale_record
    pool = [pair("a", "a", "missing_evidence"), pair("a--child", "a", "missing_evidence"), pair("b", "b", "stale_record")]
    offered = {"a": {"missing_evidence", "broken_tool", "stale_record"}, "a--child": {"missing_evidence", "broken_tool"},
               "b": {"missing_evidence", "stale_record"}}
    order = ["missing_evidence", "stale_record", "broken_tool", "ambiguous_entity"]
    plan = [("a", "missing_evidence", "hide x"), ("a--child", "missing_evidence", "hide y"), ("a", "stale_record", "age it"),
            ("b", "missing_evidence", "hide w"), ("b", "ambiguous_entity", "two of them"), ("b", "missing_evidence", "hide v")]
    assert spread(plan, pool, offered, order) == [
        ("a", "stale_record", ""),          # task a has two missing_evidence twins and none of the others: weakest first
        ("a--child", "broken_tool", ""),    # the child offers no stale_record, which the plan's first target now covers
        ("a", "stale_record", "age it"),    # as many twins as any category a offers: kept with its idea
        ("b", "missing_evidence", "hide w"),
        ("b", "missing_evidence", ""),      # not offered: of the categories b offers, one twin each, weakest first
        ("b", "missing_evidence", "hide v"),  # one twin more than stale_record, not two: kept
    ]
