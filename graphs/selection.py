"""Selection rules a refusing harness cannot win (HERA §3.2, ECDYSIS §3.4, DESIGN.md §7).

Both rules read the grounded metrics. HERA's (on the fixed validation pairs):
neither Abstain nor Pair decreases and at least one rises. ECDYSIS's (on the
training pool): Pair strictly rises. Both are guarded — Act must not drop and
Over-abstain must not rise by more than Act rises, so refusing more is never
progress (a candidate that refuses one more feasible task while completing
three more, seen on the local model, is not refusing its way up) — and gated
by a one-sided exact sign test (McNemar's) over the tasks: each side of a
pair is a task the harness either solves (the act side completed, the abstain
side abstained with grounds) or not, its change from parent to candidate is a
win, a loss or a tie, and the gain must be unlikely under "no difference"
(p ≤ the gate's level), so one flipped task never adopts a candidate. The
task is the unit because HERA scores Act and Abstain per task: on
a pair as unit a candidate that solves one side more on three of six pairs
and loses nothing (3 of 6, p = 0.125) could never be told from chance,
while its five solved tasks are (p = 0.031). With fewer tasks than
`min_tasks(level)` the gate cannot pass at all, which callers say before a
run starts.
"""

from __future__ import annotations

import math
from typing import Literal

from state.metrics import LABELS, Metrics, fraction

Rule = Literal["hera", "ecdysis"]
GATE_LEVEL = 0.05
TARGETS: dict[str, tuple[str, ...]] = {"hera": ("abstain", "pair"), "ecdysis": ("pair",)}
SPLIT = {"hera": "validation", "ecdysis": "training"}
SHOWN = ("abstain", "pair", "act", "over_abstain", "abstain_raw", "pair_raw")
SOLVED = ("act", "abstain")  # a pair's two tasks, each by the score that says it was solved


def sign_test(wins: int, losses: int) -> float:
    """One-sided exact sign test: P(at least `wins` of the `wins + losses` untied pairs improve | no difference)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0


def min_tasks(level: float = GATE_LEVEL) -> int:
    """The fewest tasks with which the gate can pass at all (every task improving)."""
    return max(1, math.ceil(math.log2(1 / level))) if 0 < level < 1 else 1


def min_pairs(level: float = GATE_LEVEL) -> int:
    """The fewest pairs (two tasks each) with which the gate can pass at all."""
    return math.ceil(min_tasks(level) / 2)


def gate_warning(pairs: int, level: float = GATE_LEVEL, what: str = "validation") -> str | None:
    """What to tell a user before a run whose selection gate can never pass."""
    need = min_pairs(level)
    if pairs >= need:
        return None
    return (f"{pairs} {what} pair(s): the selection gate (sign test over tasks at level {level:g}) needs at least {need}, "
            "so no candidate can be adopted and the run will keep its starting harness")


def _count(metrics: Metrics, name: str) -> str:
    return f"{metrics.counts.get(name, 0)}/{metrics.totals.get(name, 0)}"


def judge(base: Metrics | None, candidate: Metrics | None, rule: Rule, level: float = GATE_LEVEL) -> tuple[bool, str, dict]:
    """Whether `candidate`'s scores may replace `base`'s under `rule`; the reason in words and the figures it used."""
    figures: dict = {"rule": rule, "split": SPLIT[rule], "level": level}
    if not base or not candidate or not base.complete or not candidate.complete:
        return False, "its evaluation is incomplete (infrastructure errors)", figures
    figures["scores"] = {m: [_count(base, m), _count(candidate, m)] for m in SHOWN}
    change = {m: (fraction(base, m), fraction(candidate, m)) for m in SHOWN}
    text = ", ".join(f"{LABELS[m]} {a} → {b}" for m, (a, b) in figures["scores"].items())
    where = f"{SPLIT[rule]} {text}"
    if change["act"][1] < change["act"][0]:
        return False, f"Act dropped ({where})", figures
    rise = {m: change[m][1] - change[m][0] for m in ("act", "over_abstain")}
    if rise["over_abstain"] > max(rise["act"], 0):
        return False, f"Over-abstain rose{' more than Act' if rise['act'] > 0 else ''} ({where})", figures
    targets = TARGETS[rule]
    if down := [LABELS[m] for m in targets if change[m][1] < change[m][0]]:
        return False, f"{SPLIT[rule]} {' and '.join(down)} decreased ({where})", figures
    if not any(change[m][1] > change[m][0] for m in targets):
        # named: "no validation score improved" beside "Act 0/6 → 3/6" read as a contradiction
        named = " nor ".join(LABELS[m] for m in targets)
        said = f"neither {SPLIT[rule]} {named} rose" if len(targets) > 1 else f"{SPLIT[rule]} {named} did not rise"
        return False, f"{said} ({where})", figures
    before, after = base.per_pair, candidate.per_pair
    pairs = [p for p in before if p in after]
    deltas = [after[p][side] - before[p][side] for p in pairs for side in SOLVED]
    wins, losses = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    p_value = sign_test(wins, losses)
    figures.update(pairs=len(pairs), tasks=len(deltas), wins=wins, losses=losses, ties=len(deltas) - wins - losses,
                   p_value=round(p_value, 4))
    test = (f"{wins} task(s) better, {losses} worse, {len(deltas) - wins - losses} unchanged: "
            f"sign test p = {p_value:.3f} {'≤' if p_value <= level else '>'} {level:g}")
    if len(deltas) < min_tasks(level):
        return False, f"too few tasks for the gate ({len(deltas)} < {min_tasks(level)}); {where}; {test}", figures
    if p_value > level:
        return False, f"the gain did not pass the gate ({test}); {where}", figures
    return True, f"{where}; {test}", figures
