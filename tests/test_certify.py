"""Certification accepts a sound pair and rejects a rescuable or out-of-scope one."""

import pytest

from envs.catalog import load_catalog
from envs.certify import certify, perturbations
from envs.mutation import apply_mutation, revert
from envs.verify import committed, verify
from envs.certify import replay
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def fixtures():
    return load_catalog(FIXTURES)


def checks(cert):
    return {c.name: c.passed for c in cert.checks}


def test_sound_pair_certifies(fixtures):
    entry = fixtures["shop-reserve-drill"]
    cert = certify(entry.pair, entry.env)
    assert checks(cert) == dict.fromkeys(
        ["feasible_replay", "verifier_rejects", "blocking_evidence", "no_rescue", "revert", "scope", "control", "interface"], True
    )


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
