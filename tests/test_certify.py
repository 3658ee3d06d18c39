"""Certification accepts a sound pair and rejects a rescuable or out-of-scope one."""

import pytest

from envs.catalog import load_catalog
from envs.certify import certify, control_ops, perturbations
from envs.mutation import apply_mutation, apply_ops, revert
from envs.runtime import EnvInstance
from envs.spec import SpecError
from envs.verify import committed, verify
from envs.certify import replay
from state.records import CallPattern, Evidence, Scope, StateOp
from tests.conftest import FIXTURES


ALL_CHECKS = ["feasible_replay", "verifier_rejects", "blocking_evidence", "no_rescue", "write_replay", "revert", "scope", "control", "interface"]


@pytest.fixture(scope="module")
def fixtures():
    return load_catalog(FIXTURES)


def checks(cert):
    return {c.name: c.passed for c in cert.checks}


def test_sound_pair_certifies(fixtures):
    entry = fixtures["shop-reserve-drill"]
    cert = certify(entry.pair, entry.env)
    assert checks(cert) == dict.fromkeys(ALL_CHECKS, True)


def test_mutation_with_a_rescue_path_is_rejected(fixtures):
    entry = fixtures["shop-rescued"]
    cert = certify(entry.pair, entry.env)
    result = {c.name: c for c in cert.checks}["no_rescue"]
    assert not result.passed and not cert.passed
    assert "price_history" in result.detail
    assert [c.name for c in cert.checks if not c.passed] == ["no_rescue"]


def test_mutation_outside_its_scope_is_rejected(fixtures):
    entry = fixtures["shop-out-of-scope"]
    cert = certify(entry.pair, entry.env)
    assert [c.name for c in cert.checks if not c.passed] == ["scope"]
    assert "HX-100" in {c.name: c for c in cert.checks}["scope"].detail


def test_witness_missing_on_both_sides_tests_nothing(fixtures):
    entry = fixtures["shop-reserve-drill"]
    mutation = entry.pair.mutation.model_copy(update={"witness": ({"sku": "DR-220", "colour": "*"},)})
    cert = certify(entry.pair.model_copy(update={"mutation": mutation}), entry.env)
    assert [c.name for c in cert.checks if not c.passed] == ["no_rescue"]


def test_evidence_must_be_observable_before_the_write(fixtures):
    entry = fixtures["shop-reserve-drill"]
    mutation = entry.pair.mutation.model_copy(update={"evidence": entry.pair.mutation.evidence.model_copy(update={"tool": "reserve"})})
    cert = certify(entry.pair.model_copy(update={"mutation": mutation}), entry.env)
    assert [c.name for c in cert.checks if not c.passed] == ["blocking_evidence"]


def test_instruction_revealing_the_answer_is_rejected(fixtures):
    entry = fixtures["shop-reserve-drill"]
    task = entry.pair.task.model_copy(update={"instruction": "Reserve two drills at $89 each."})
    cert = certify(entry.pair.model_copy(update={"task": task}), entry.env)
    assert [c.name for c in cert.checks if not c.passed] == ["interface"]


def test_mutation_is_content_hashed_and_reverts(fixtures):
    entry = fixtures["shop-reserve-drill"]
    applied = apply_mutation(entry.env, entry.pair.mutation)
    assert applied.env.hash != entry.env.hash and applied.env.parent_hash == entry.env.hash
    assert revert(applied).hash == entry.env.hash
    assert next(r for r in applied.env.rows["items"] if r["sku"] == "DR-220")["price"] is None


def test_verifier_and_commit_check(fixtures):
    entry = fixtures["shop-reserve-drill"]
    task = entry.pair.task
    good = replay(entry.env, task.reference.calls, task.reference.answer)
    assert verify(task, good).passed
    assert [o.tool for o in committed(task, good.calls, {"reserve", "buggy_write"})] == ["reserve"]
    names = [name for name, _ in perturbations(entry.env, task)]
    assert names == ["answer without price", "answer with wrong price", "writes left out", "empty answer, no writes"]
    for _, outcome in perturbations(entry.env, task):
        assert not verify(task, outcome).passed
    infeasible = apply_mutation(entry.env, entry.pair.mutation).env
    refused = replay(infeasible, task.reference.calls[:2], "I cannot: the drill has no price on record.")
    assert committed(task, refused.calls, {"reserve"}) == []


# Planted bogus pairs: each exploits one way a pair could be wrongly certified,
# built from the sound depot pair, and is rejected by the check named.

DEPOT = FIXTURES / "bogus"


@pytest.fixture(scope="module")
def depot():
    return load_catalog(DEPOT)["depot-reserve-drill"]


def variant(entry, control=None, task=None, **mutation):
    pair = entry.pair
    updates = {"mutation": pair.mutation.model_copy(update=mutation)}
    if task:
        updates["task"] = pair.task.model_copy(update=task)
    if control is not None:
        updates["control"] = control
    return pair.model_copy(update=updates)


def set_op(table, key, **fields):
    return StateOp(op="set", table=table, key=key, fields=fields)


def insert_op(table, **row):
    return StateOp(op="insert", table=table, row=row)


# where the mutation is on customers, every other row is listed by the reference: declare the control
CONTROL = (set_op("items", "LV-400", name="Spirit level, 600 mm"),)
DUPLICATE_DANA = insert_op("customers", customer_id="C-4", name="Dana Reyes", city="Leeds", internal_score=5)
PRICE_CONFLICT = dict(
    category="conflicting_records",
    state=(set_op("ledger", "L-1", price=95.0),),
    scope=Scope(rows={"ledger": ("L-1",)}),
    evidence=Evidence(tool="price_ledger", contains='"price": 95.0'),
    witness=({"sku": "DR-220", "price_confirmed": True},),
    conflict=({"sku": "DR-220", "price": 89.0}, {"sku": "DR-220", "price": 95.0}),
)
AMBIGUOUS_DANA = dict(
    category="ambiguous_entity",
    state=(DUPLICATE_DANA,),
    scope=Scope(rows={"customers": ("C-4",)}),
    evidence=Evidence(tool="find_customers", contains="C-4"),
    witness=({"customer_id": "C-4", "confirmed_by_caller": True},),
    candidates={"name": "Dana Reyes", "city": "Leeds", "customer_id": "*"},
)
THIRD_DANA = insert_op("customers", customer_id="C-5", name="Dana Reyes", city="Leeds", internal_score=6)


def planted(entry):
    """(name, pair, environment, rescue budget, the checks that must fail)."""
    env = entry.env
    two_danas = env.model_copy(update={"rows": {**env.rows, "customers": env.rows["customers"] + (DUPLICATE_DANA.row,)}})
    budget = 10_000
    return [
        ("conflict: unrelated row edited, evidence on both sides, invented witness", variant(
            entry, **{**PRICE_CONFLICT, "state": (set_op("ledger", "L-3", price=99.0),), "scope": Scope(rows={"ledger": ("L-3",)}),
                      "evidence": Evidence(tool="get_item", contains="Cordless drill")}), env, budget, {"blocking_evidence", "conflict", "interface"}),
        ("conflict: the feasible side shows both values", variant(entry, **{**PRICE_CONFLICT, "conflict": ({"sku": "DR-220", "price": 89.0}, {"sku": "DR-220"})}), env, budget, {"conflict"}),
        ("conflict: the second value is never observed", variant(entry, **{**PRICE_CONFLICT, "conflict": ({"sku": "DR-220", "price": 89.0}, {"sku": "DR-220", "price": 97.0})}), env, budget, {"conflict"}),
        ("ambiguity: the second entity does not fit the details", variant(
            entry, CONTROL, **{**AMBIGUOUS_DANA, "state": (insert_op("customers", customer_id="C-4", name="Dana Reyes", city="York", internal_score=5),)}),
         env, budget, {"ambiguity"}),
        ("ambiguity: the feasible side is ambiguous already", variant(
            entry, CONTROL, **{**AMBIGUOUS_DANA, "state": (THIRD_DANA,), "scope": Scope(rows={"customers": ("C-5",)}), "evidence": Evidence(tool="find_customers", contains="C-5")}),
         two_danas, budget, {"ambiguity"}),
        ("ambiguity: a search budget that runs out", variant(entry, CONTROL, **AMBIGUOUS_DANA), env, 3, {"no_rescue", "ambiguity"}),
        ("a change no tool shows", variant(
            entry, CONTROL, state=(set_op("customers", "C-1", internal_score=0),), scope=Scope(rows={"customers": ("C-1",)})), env, budget, {"blocking_evidence", "no_rescue", "interface"}),
        ("no_rescue: budget spent, not exhausted", variant(entry), env, 5, {"no_rescue"}),
        ("no_rescue: the ledger still shows the price", variant(entry, state=entry.pair.mutation.state[:1], scope=Scope(rows={"items": ("DR-220",)})), env, budget, {"no_rescue"}),
        ("no_rescue: witness on neither side", variant(entry, witness=({"sku": "DR-220", "price_confirmed": True},)), env, budget, {"no_rescue"}),
        ("blocking evidence shown on the feasible side too", variant(entry, evidence=Evidence(tool="get_item", contains='"price"')), env, budget, {"blocking_evidence"}),
        ("write_replay: the reference's write goes through unseen", variant(
            entry, task={"commit": (CallPattern(tool="reserve", args={"qty": 3}),)}, state=(set_op("items", "DR-220", stock=1),), scope=Scope(rows={"items": ("DR-220",)}),
            evidence=Evidence(tool="get_item", contains='"stock": 1'), witness=({"sku": "DR-220", "stock": 5},)), env, budget, {"write_replay"}),
        ("control: text appended to JSON stored as text", variant(entry, control=(set_op("items", "LV-400", attrs='{"colour": "yellow"} (rev. 2)'),)), env, budget, {"control"}),
        ("control: text written to an integer column", variant(entry, control=(set_op("items", "LV-400", stock="7 (rev. 2)"),)), env, budget, {"control"}),
        ("scope: a row edited outside the declared scope", variant(entry, scope=Scope(rows={"items": ("DR-220",)})), env, budget, {"scope"}),
    ]


def test_the_depot_pair_certifies(depot):
    cert = certify(depot.pair, depot.env)
    assert checks(cert) == dict.fromkeys(ALL_CHECKS, True)


def test_sound_conflict_and_ambiguity_pass(depot):
    conflict = certify(variant(depot, **PRICE_CONFLICT), depot.env)
    assert {c.name: c.passed for c in conflict.checks}["conflict"] and conflict.passed
    ambiguous = certify(variant(depot, CONTROL, **AMBIGUOUS_DANA), depot.env)
    result = {c.name: c for c in ambiguous.checks}["ambiguity"]
    assert ambiguous.passed and "2 on the infeasible side" in result.detail and "1 on the feasible side" in result.detail


def test_every_planted_pair_is_rejected_by_its_check(depot):
    cases = planted(depot)
    assert len(cases) >= 12
    for name, pair, env, budget, expected in cases:
        cert = certify(pair, env, rescue_budget=budget)
        assert {c.name for c in cert.checks if not c.passed} == expected, name


def test_rejections_say_why(depot):
    details = {}
    for name, pair, env, budget, _ in planted(depot):
        details[name] = {c.name: c.detail for c in certify(pair, env, rescue_budget=budget).checks if not c.passed}
    assert details["no_rescue: budget spent, not exhausted"]["no_rescue"].startswith("search budget of 5 read calls spent before the search was exhausted")
    assert "control breaks get_item({'sku': 'LV-400'}): internal_error" in details["control: text appended to JSON stored as text"]["control"]
    assert "stock: a integer (got '7 (rev. 2)')" in details["control: text written to an integer column"]["control"]
    assert details["write_replay: the reference's write goes through unseen"]["write_replay"].startswith("no reference write is refused or caught")


def test_write_replay_records_refusal_or_commit(depot, fixtures):
    refused = {c.name: c.detail for c in certify(depot.pair, depot.env).checks}
    assert refused["write_replay"] == "reserve refused (no_price)"
    shop = fixtures["shop-reserve-drill"]
    assert {c.name: c.detail for c in certify(shop.pair, shop.env).checks}["write_replay"] == "reserve caught by the commit check"


def test_json_column_round_trips_and_is_typed(depot):
    env = depot.env
    instance = EnvInstance(env)
    assert instance.call("get_item", {"sku": "SW-310"}).output["specs"] == ["22 inch", "wood"]
    assert [r["specs"] for r in instance.rows()["items"]] == [r["specs"] for r in sorted(env.rows["items"], key=lambda r: r["sku"])]
    instance.close()
    rows, _ = apply_ops(env, (set_op("items", "DR-220", specs={"volts": 20}),))
    assert next(r for r in rows["items"] if r["sku"] == "DR-220")["specs"] == {"volts": 20}
    with pytest.raises(SpecError, match=r"control.0.specs: a JSON value"):
        apply_ops(env, (set_op("items", "DR-220", specs=float("nan")),), origin="control")


def test_generated_control_edits_plain_text_only(depot):
    ops = control_ops(variant(depot, state=(set_op("customers", "C-1", city="York"),), scope=Scope(rows={"customers": ("C-1",)})), depot.env)
    assert ops == ()
    (op,) = control_ops(depot.pair, depot.env)
    assert (op.table, op.key, op.fields) == ("customers", "C-2", {"name": "Omar Haddad (rev. 2)"})


def test_generated_control_skips_json_held_as_text(depot):
    env = depot.env
    items = env.table("items")
    attrs_first = items.model_copy(update={"columns": tuple(sorted(items.columns, key=lambda c: c.name != "attrs"))})
    env = env.model_copy(update={"tables": tuple(attrs_first if t.name == "items" else t for t in env.tables)})
    reference = depot.pair.task.reference
    task = {"reference": reference.model_copy(update={"calls": reference.calls[1:]})}
    ledger_only = {"state": depot.pair.mutation.state[1:], "scope": Scope(rows={"ledger": ("L-1",)})}
    (op,) = control_ops(variant(depot, task=task, **ledger_only), env)
    assert (op.table, op.key, op.fields) == ("items", "HX-100", {"name": "Hex key set (rev. 2)"})
