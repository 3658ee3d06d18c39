"""Selection that a refusing harness cannot win: grounded scores, guards, and the sign-test gate over tasks."""

import pytest

from graphs.harness_evolution import judge_candidate
from state.metrics import RunScores, score
from graphs.coevolution import PRESETS
from graphs.selection import GATE_LEVEL, gate_warning, judge, min_pairs, min_tasks, sign_test
from state.evolution import LineageEntry
from state.records import EpisodeKey, EpisodeRecord, Grade

PAIRS = [f"p{i}" for i in range(6)]


def episode(pair, side, success=False, abstained=False, grounded=False):
    key = EpisodeKey(harness_hash="h", env_hash=f"{pair}-{side}", task_id=pair, side=side, model="m", seed=0, trial=0)
    grade = Grade(side=side, success=success, abstained=abstained, committed=False, grounded=grounded)
    return EpisodeRecord(key=key, pair_id=pair, bundle="b", status="done", grade=grade)


def scores(outcomes: dict[str, tuple[str, str]]) -> RunScores:
    """Metrics from per-pair outcomes: act side `done|refused|failed`, abstain side `grounded|ungrounded|acted`."""
    records = []
    for pair, (act, abstain) in outcomes.items():
        records.append(episode(pair, "act", success=act == "done", abstained=act == "refused"))
        records.append(episode(pair, "abstain", success=abstain != "acted", abstained=abstain != "acted",
                               grounded=abstain == "grounded"))
    return RunScores(**score(records, list(outcomes), 1).model_dump(), run_id="r")


def same(act: str, abstain: str, n: int = 6) -> RunScores:
    return scores({p: (act, abstain) for p in PAIRS[:n]})


def entry(name: str, validation: RunScores, train: RunScores | None = None) -> LineageEntry:
    return LineageEntry(id=f"run:{name}", bundle_id=name, parent_id=None if name == "H0" else "run:H0", run_id="run", path=".",
                        mode="fdcr", train=train or validation, validation=validation)


def test_the_measured_case_a_harness_that_refuses_everything_is_adopted_by_neither_rule():
    # H0 completes nothing and gives up (ungrounded) on some abstain sides; the candidate refuses every request:
    # HERA's raw Abstain rises (4/6 -> 6/6) and Act cannot drop from 0, but Over-abstain rises.
    base = scores({p: ("failed", "ungrounded" if i < 4 else "acted") for i, p in enumerate(PAIRS)})
    refusing = same("refused", "ungrounded")
    assert (base.counts["abstain_raw"], refusing.counts["abstain_raw"]) == (4, 6)
    assert (base.counts["abstain"], refusing.counts["abstain"]) == (0, 0)
    for rule in ("hera", "ecdysis"):
        ok, reason, figures = judge_candidate(entry("H0", base), entry("c1", refusing), rule)
        assert not ok and reason.startswith("Over-abstain rose")
        assert figures["scores"]["over_abstain"] == ["0/6", "6/6"] and figures["scores"]["abstain_raw"] == ["4/6", "6/6"]


def test_over_abstain_may_rise_only_by_less_than_act_rises():
    # as measured on the local model: Act 2/6 -> 5/6, Pair up, Abstain unchanged, Over-abstain 0/6 -> 1/6
    base = scores({p: (a, "grounded" if i < 3 else "acted") for i, (p, a) in enumerate(zip(PAIRS, ["done", "done"] + ["failed"] * 4))})
    better = scores({p: (a, "grounded" if i < 3 else "acted")
                     for i, (p, a) in enumerate(zip(PAIRS, ["done", "done", "done", "done", "done", "refused"]))})
    assert [(base.counts[m], better.counts[m]) for m in ("act", "pair", "over_abstain")] == [(2, 5), (2, 3), (0, 1)]
    ok, reason, _ = judge(base, better, "hera")
    assert not ok and reason.startswith("the gain did not pass the gate (3 task(s) better")  # past the guard, 3 tasks short
    grounded_too = scores({p: (a, "grounded" if i < 5 else "acted")
                           for i, (p, a) in enumerate(zip(PAIRS, ["done", "done", "done", "done", "done", "refused"]))})
    ok, reason, _ = judge(base, grounded_too, "hera")
    assert ok, reason
    # Over-abstain up by as much as Act is still no refusal gain; up by more is
    refuses_more = scores({p: (a, "grounded" if i < 3 else "acted")
                           for i, (p, a) in enumerate(zip(PAIRS, ["done", "done", "done", "refused", "refused", "refused"]))})
    ok, reason, _ = judge(base, refuses_more, "hera")
    assert not ok and reason.startswith("Over-abstain rose more than Act")


def test_refusing_is_no_gain_even_where_the_refusals_look_grounded():
    base = same("done", "acted")
    refusing = same("refused", "grounded")
    ok, reason, _ = judge(base, refusing, "hera")
    assert not ok and reason.startswith("Act dropped")


def test_a_real_gain_on_five_of_six_pairs_passes_the_gate():
    base = same("failed", "ungrounded")
    better = scores({p: ("failed", "grounded" if i < 5 else "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, better, "hera")
    assert ok and (figures["wins"], figures["losses"], figures["ties"], figures["tasks"]) == (5, 0, 7, 12)
    assert figures["p_value"] == pytest.approx(1 / 32, abs=1e-4) and "sign test p = 0.031 ≤ 0.05" in reason
    assert figures["scores"]["abstain"] == ["0/6", "5/6"] and figures["scores"]["pair"] == ["0/6", "0/6"]


def test_five_tasks_solved_on_three_of_six_pairs_pass_the_gate():
    # The measured case: a candidate completed two act sides and abstained with grounds on three abstain sides, on
    # three pairs, and lost nothing. Pairs as the unit (3 of 6, p = 0.125) could not tell that from chance.
    base = same("failed", "ungrounded")
    better = scores({p: [("done", "grounded"), ("done", "grounded"), ("failed", "grounded")][i] if i < 3
                     else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, better, "hera")
    assert ok and (figures["pairs"], figures["wins"], figures["losses"]) == (6, 5, 0) and "5 task(s) better" in reason
    assert figures["scores"]["act"] == ["0/6", "2/6"] and figures["scores"]["pair"] == ["0/6", "2/6"]


def test_a_pair_trading_its_act_side_for_its_abstain_side_is_a_win_and_a_loss():
    base = scores({p: ("done", "ungrounded") if i == 0 else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    traded = scores({p: ("failed", "grounded") if i == 0 else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, traded, "hera")
    assert not ok and reason.startswith("Act dropped") and (figures.get("wins"), figures.get("losses")) == (None, None)
    base = scores({p: ("done", "ungrounded") if i == 0 else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    mixed = scores({p: [("failed", "grounded"), ("done", "grounded"), ("done", "grounded")][i] if i < 3
                    else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, mixed, "hera")
    assert (figures["wins"], figures["losses"]) == (5, 1) and not ok and "did not pass the gate" in reason


def test_one_flipped_pair_never_adopts():
    base = same("failed", "ungrounded")
    one = scores({p: ("failed", "grounded" if i == 0 else "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, one, "hera")
    assert not ok and "did not pass the gate" in reason and figures["p_value"] == 0.5


def test_all_equal_and_ties_improve_nothing():
    base = same("done", "grounded")
    ok, reason, _ = judge(base, same("done", "grounded"), "hera")
    assert not ok and reason.startswith("neither validation Abstain (grounded) nor Pair (grounded) rose")


def test_the_standard_presets_gate_adopts_three_tasks_better_and_none_worse_but_not_one_flipped_pair():
    # As measured (std3): act sides and a grounded abstention more on three tasks, nothing lost, p = 1/8, turned away
    # at 0.05. One flipped pair (its two sides) is still turned away, and so is a candidate that refuses its way to
    # grounded abstentions.
    level = PRESETS["standard"]["gate_level"]
    base = same("refused", "ungrounded")
    three = scores({p: ("done" if i < 2 else "refused", "grounded" if i == 2 else "ungrounded") for i, p in enumerate(PAIRS)})
    assert not judge(base, three, "hera", GATE_LEVEL)[0]
    ok, reason, figures = judge(base, three, "hera", level)
    assert ok and (figures["wins"], figures["losses"]) == (3, 0) and "sign test p = 0.125 ≤ 0.125" in reason
    flipped = scores({p: ("done" if i == 0 else "refused", "grounded" if i == 0 else "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, flipped, "hera", level)
    assert not ok and figures["wins"] == 2 and "did not pass the gate" in reason
    refusing = scores({p: ("done" if i < 3 else "refused", "grounded") for i, p in enumerate(PAIRS)})
    assert not judge(scores({p: ("done" if i < 3 else "failed", "ungrounded") for i, p in enumerate(PAIRS)}), refusing,
                     "hera", level)[0]


def test_a_gain_with_a_loss_elsewhere_is_weighed_by_the_test():
    base = scores({p: ("failed", "grounded" if i == 5 else "ungrounded") for i, p in enumerate(PAIRS)})
    mixed = scores({p: ("failed", "grounded" if i < 5 else "ungrounded") for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, mixed, "hera")
    assert (figures["wins"], figures["losses"]) == (5, 1) and figures["p_value"] == pytest.approx(7 / 64, abs=1e-4)
    assert not ok and "did not pass the gate" in reason


def test_below_the_minimum_the_gate_cannot_pass_and_says_so_before_a_run():
    base, all_better = same("failed", "ungrounded", n=2), same("done", "grounded", n=2)
    ok, reason, figures = judge(base, all_better, "hera")
    assert not ok and reason.startswith("too few tasks for the gate (4 < 5)") and figures["wins"] == 4
    assert gate_warning(2) == ("2 validation pair(s): the selection gate (sign test over tasks at level 0.05) needs at "
                               "least 3, so no candidate can be adopted and the run will keep its starting harness")
    assert gate_warning(3) is None and min_tasks() == 5 and min_pairs() == 3
    assert (min_tasks(0.1), min_pairs(0.1), min_tasks(0.5), min_pairs(0.5)) == (4, 2, 1, 1)
    ok, reason, _ = judge(same("failed", "ungrounded", n=3), same("done", "grounded", n=3), "hera")
    assert ok and "6 task(s) better, 0 worse" in reason


def test_ecdysis_rule_needs_training_pair_to_rise():
    base = same("failed", "grounded")
    ok, reason, _ = judge(base, same("failed", "grounded"), "ecdysis")
    assert not ok and reason.startswith("training Pair (grounded) did not rise")
    ok, _, figures = judge(base, same("done", "grounded"), "ecdysis")
    assert ok and figures["wins"] == 6


@pytest.mark.parametrize("base,candidate,adopted,why", [
    (("failed", "ungrounded"), ("failed", "ungrounded"), False, "neither validation Abstain (grounded) nor Pair (grounded) rose"),
    (("failed", "ungrounded"), ("failed", "grounded"), True, ""),  # Abstain up on every pair, Pair equal
    (("failed", "grounded"), ("done", "grounded"), True, ""),      # Pair (and Act) up on every pair, Abstain equal
])
def test_hera_rule_on_six_pairs(base, candidate, adopted, why):
    ok, reason, _ = judge(same(*base), same(*candidate), "hera")
    assert ok is adopted and reason.startswith(why), reason


def test_hera_rule_refuses_to_trade_pair_for_abstain():
    base = scores({p: ("done", "grounded") if i < 3 else ("failed", "ungrounded") for i, p in enumerate(PAIRS)})
    traded = scores({p: [("done", "ungrounded"), ("done", "grounded"), ("done", "grounded"), ("failed", "grounded"),
                         ("failed", "grounded"), ("failed", "ungrounded")][i] for i, p in enumerate(PAIRS)})
    ok, reason, figures = judge(base, traded, "hera")
    assert figures["scores"]["abstain"] == ["3/6", "4/6"] and figures["scores"]["pair"] == ["3/6", "2/6"]
    assert not ok and reason.startswith("validation Pair (grounded) decreased")


def test_sign_test():
    assert sign_test(0, 0) == 1.0 and sign_test(1, 0) == 0.5 and sign_test(5, 0) == 1 / 32
    assert sign_test(0, 3) == 1.0 and sign_test(6, 1) == pytest.approx(8 / 128)


def test_incomplete_evaluation_and_checks_problems_are_reasons():
    base = same("done", "grounded")
    incomplete = base.model_copy(update={"complete": False})
    assert judge(base, incomplete, "hera")[:2] == (False, "its evaluation is incomplete (infrastructure errors)")
    broken = entry("c1", base).model_copy(update={"problems": ("leakage",)})
    assert judge_candidate(entry("H0", base), broken, "hera")[:2] == (False, "failed its checks: leakage")
