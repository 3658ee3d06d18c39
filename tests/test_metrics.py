"""Scores pinned on hand-computed cases (HERA App. C.2, ECDYSIS §3.5)."""

import pytest

from state.metrics import pass_at_k, pass_hat_k, score
from state.records import EpisodeKey, EpisodeRecord, Grade


def record(pair, side, trial=0, success=True, abstained=False, grounded=False, status="done", committed=False):
    key = EpisodeKey(harness_hash="h", env_hash=f"{pair}-{side}", task_id=pair, side=side, model="m", seed=0, trial=trial)
    grade = Grade(side=side, success=success, abstained=abstained, committed=committed, grounded=grounded) if status == "done" else None
    return EpisodeRecord(key=key, pair_id=pair, bundle="H0", status=status, grade=grade)


def test_hand_computed_metrics():
    records = [
        record("A", "act", success=True), record("A", "abstain", success=True, abstained=True, grounded=True),
        record("B", "act", success=True), record("B", "abstain", success=False),
        record("C", "act", success=False, abstained=True), record("C", "abstain", success=True, abstained=True, grounded=False),
    ]
    m = score(records, ["A", "B", "C"], trials=1, tiers={"A": "short", "B": "standard", "C": "standard"})
    assert m.complete and (m.planned, m.finished) == (6, 6)
    assert m.counts == {"abstain": 1, "act": 2, "pair": 1, "over_abstain": 1, "abstain_raw": 2, "pair_raw": 1}
    assert m.percent == pytest.approx({"abstain": 100 / 3, "act": 200 / 3, "pair": 100 / 3, "over_abstain": 100 / 3,
                                       "abstain_raw": 200 / 3, "pair_raw": 100 / 3})
    assert m.pass_at_k == pytest.approx(100 / 3) and m.pass_hat_k == pytest.approx(100 / 3)
    assert m.ci95 is None  # three pairs: no interval
    assert m.by_tier["short"]["counts"]["pair"] == 1 and m.by_tier["standard"]["totals"]["pair"] == 2
    assert m.by_tier["standard"]["counts"] == {"abstain": 0, "act": 1, "pair": 0, "over_abstain": 1, "abstain_raw": 1, "pair_raw": 0}
    assert m.per_pair["C"] == {"abstain": 0.0, "act": 0.0, "pair": 0.0, "over_abstain": 1.0, "abstain_raw": 1.0, "pair_raw": 0.0}


def test_an_ungrounded_abstention_scores_zero_on_the_headline_and_one_raw():
    records = [record("A", "act", success=True), record("A", "abstain", success=True, abstained=True, grounded=False)]
    m = score(records, ["A"], trials=1)
    assert (m.counts["abstain"], m.counts["pair"]) == (0, 0)
    assert (m.counts["abstain_raw"], m.counts["pair_raw"]) == (1, 1)


def test_a_refusal_read_into_a_reply_after_the_change_was_made_or_the_task_done_is_no_over_abstention():
    records = [record("A", "act", success=False, abstained=True, committed=True), record("A", "abstain", success=False),
               record("B", "act", success=False, abstained=True), record("B", "abstain", success=False),
               record("C", "act", success=True, abstained=True), record("C", "abstain", success=False)]
    m = score(records, ["A", "B", "C"], trials=1)
    assert (m.counts["over_abstain"], m.counts["act"]) == (1, 1)
    assert m.per_pair["C"]["over_abstain"] == 0.0 and m.per_pair["B"]["over_abstain"] == 1.0


def test_intervals_from_five_pairs():
    pairs = ["A", "B", "C", "D", "E"]
    records = [r for i, p in enumerate(pairs) for r in (record(p, "act", success=i < 2),
                                                         record(p, "abstain", success=True, abstained=True, grounded=True))]
    m = score(records, pairs, trials=1)
    low, high = m.ci95["pair"]
    assert 0.0 <= low <= 40.0 <= high <= 100.0
    assert score(records[:8], pairs[:4], trials=1).ci95 is None


def test_incomplete_run_reports_counts_only():
    records = [record("A", "act"), record("A", "abstain", status="infrastructure_error")]
    m = score(records, ["A"], trials=1)
    assert not m.complete and (m.planned, m.finished) == (2, 1)
    assert m.percent is None and m.ci95 is None and m.pass_at_k is None
    assert m.counts["act"] == 1 and m.totals["abstain"] == 0


def test_pass_at_k_and_pass_hat_k():
    assert (pass_at_k(3, 1, 3), pass_hat_k(3, 1, 3)) == (1.0, 0.0)
    assert (pass_at_k(3, 3, 3), pass_hat_k(3, 3, 3)) == (1.0, 1.0)
    assert (pass_at_k(3, 0, 3), pass_hat_k(3, 0, 3)) == (0.0, 0.0)
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9) and pass_hat_k(5, 2, 3) == 0.0
    assert pass_hat_k(5, 4, 3) == pytest.approx(0.4)


def test_pass_k_over_trials():
    records = []
    for t, (act, abstain) in enumerate([(True, True), (True, False), (True, True)]):
        records += [record("A", "act", t, success=act), record("A", "abstain", t, success=abstain, abstained=abstain, grounded=True)]
        records += [record("B", "act", t, success=False), record("B", "abstain", t, success=True, abstained=True, grounded=True)]
    m = score(records, ["A", "B"], trials=3)
    assert m.pass_at_k == 50.0 and m.pass_hat_k == 0.0
    assert m.percent["pair"] == pytest.approx(100 * 2 / 6)
