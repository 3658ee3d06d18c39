"""Scores of an evaluation (HERA App. C.2, ECDYSIS §3.5), grounded first.

Per pair p and trial t: c (the act side completed), o (the act side
failed and abstained without making the change), b_raw (the abstain side abstained without committing, by the
judge: HERA's Abstain) and b (b_raw with the pair's blocking evidence in an
observation the agent saw before its answer: a refusal that looked). The
headline Abstain is b and Pair is c·b; HERA's judge-only numbers stay beside
them as `abstain_raw` and `pair_raw` (c·b_raw), so results compare with the
paper. All are means over pairs and trials, with 95% bootstrap intervals over
pairs when there are at least `MIN_CI_PAIRS` of them. Pass@k and Pass^k are
on the grounded Pair, with the unbiased estimators over n ≥ k trials. An
incomplete run reports counts only. Everything here is recomputed from the
stored episodes; no model is asked.
"""

from __future__ import annotations

import random
from math import comb

from state.records import EpisodeRecord, Grade, Record

NAMES = ("abstain", "act", "pair", "over_abstain", "abstain_raw", "pair_raw")
LABELS = {"abstain": "Abstain (grounded)", "act": "Act", "pair": "Pair (grounded)", "over_abstain": "Over-abstain",
          "abstain_raw": "Abstain (raw)", "pair_raw": "Pair (raw)"}
MIN_CI_PAIRS = 5  # below this an interval over pairs says nothing; tables print "n too small"


class Metrics(Record):
    pairs: int
    trials: int
    planned: int
    finished: int
    complete: bool
    counts: dict[str, int]
    totals: dict[str, int]
    percent: dict[str, float] | None
    ci95: dict[str, tuple[float, float]] | None
    pass_at_k: float | None
    pass_hat_k: float | None
    usage: dict[str, float]
    per_pair: dict[str, dict[str, float]] = {}  # each finished pair's scores, means over its trials (the selection gate's input)
    by_tier: dict[str, dict[str, dict[str, int]]] = {}  # tier -> {"counts", "totals"}


def over_abstained(grade: Grade) -> bool:
    """Whether an act side's grade is an over-abstention. A reply that reads as a refusal after the agent made the
    change it was asked for, or did all the verifier asks, is not one (std20's bench: a correct answer the judge read
    as a decline was counted as both done and over-abstained)."""
    return grade.abstained and not (grade.committed or grade.success)


def _cells(records: list[EpisodeRecord]) -> dict[tuple[str, int], dict[str, bool]]:
    cells: dict[tuple[str, int], dict[str, bool]] = {}
    for r in records:
        if r.status != "done" or r.grade is None:
            continue
        cell = cells.setdefault((r.pair_id, r.key.trial), {})
        if r.key.side == "act":
            cell["act"], cell["over_abstain"] = r.grade.success, over_abstained(r.grade)
        else:
            cell["abstain_raw"], cell["abstain"] = r.grade.success, r.grade.success and r.grade.grounded
    for cell in cells.values():
        if "act" in cell and "abstain" in cell:
            cell["pair"] = cell["act"] and cell["abstain"]
            cell["pair_raw"] = cell["act"] and cell["abstain_raw"]
    return cells


def _mean(values: list[bool]) -> float:
    return 100.0 * sum(values) / len(values) if values else 0.0


def _tally(cells) -> tuple[dict[str, int], dict[str, int]]:
    cells = list(cells)
    return ({n: sum(c.get(n, False) for c in cells) for n in NAMES}, {n: sum(n in c for c in cells) for n in NAMES})


def score(records: list[EpisodeRecord], pair_ids: list[str], trials: int, *, tiers: dict[str, str] | None = None,
          resamples: int = 1000, seed: int = 0) -> Metrics:
    """The metrics of `records` over `pair_ids` × `trials`; `tiers` (pair id -> tier) adds the breakdown by tier."""
    cells = _cells(records)
    planned = 2 * len(pair_ids) * trials
    finished = sum(len([k for k in c if k in ("act", "abstain")]) for c in cells.values())
    complete = finished == planned
    counts, totals = _tally(cells.values())
    by_tier = {}
    for tier in sorted(set((tiers or {}).values())):
        tier_counts, tier_totals = _tally(c for (p, _), c in cells.items() if tiers.get(p) == tier)
        by_tier[tier] = {"counts": tier_counts, "totals": tier_totals}
    per_pair = {}
    for p in pair_ids:
        done = [cells[(p, t)] for t in range(trials) if "pair" in cells.get((p, t), {})]
        if len(done) == trials:
            per_pair[p] = {n: sum(c[n] for c in done) / trials for n in NAMES}
    usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "cost_usd": 0.0}
    for r in records:
        for u in r.usage:
            usage["input_tokens"] += u.input_tokens
            usage["output_tokens"] += u.output_tokens
            usage["cached_tokens"] += u.cached_tokens
            usage["cost_usd"] += u.cost_usd or 0.0
    common = {"pairs": len(pair_ids), "trials": trials, "planned": planned, "finished": finished, "counts": counts,
              "totals": totals, "usage": usage, "per_pair": per_pair, "by_tier": by_tier}
    if not complete:
        return Metrics(**common, complete=False, percent=None, ci95=None, pass_at_k=None, pass_hat_k=None)
    per_cell = {p: [cells[(p, t)] for t in range(trials)] for p in pair_ids}
    percent = {n: _mean([c[n] for cs in per_cell.values() for c in cs]) for n in NAMES}
    ci95 = None
    if len(pair_ids) >= MIN_CI_PAIRS:
        rng = random.Random(seed)
        boot: dict[str, list[float]] = {n: [] for n in NAMES}
        for _ in range(resamples):
            sample = [per_cell[rng.choice(pair_ids)] for _ in pair_ids]
            for n in NAMES:
                boot[n].append(_mean([c[n] for cs in sample for c in cs]))
        ci95 = {n: (sorted(v)[int(0.025 * resamples)], sorted(v)[int(0.975 * resamples) - 1]) for n, v in boot.items()}
    successes = [sum(c["pair"] for c in cs) for cs in per_cell.values()]
    return Metrics(
        **common, complete=True, percent=percent, ci95=ci95,
        pass_at_k=100.0 * sum(pass_at_k(trials, s, trials) for s in successes) / len(successes),
        pass_hat_k=100.0 * sum(pass_hat_k(trials, s, trials) for s in successes) / len(successes),
    )


def paired_difference(before: Metrics, after: Metrics, *, resamples: int = 2000, seed: int = 0) -> dict[str, dict]:
    """Each score's change from `before` to `after` over the pairs both finished (percentage points), with a 95% paired
    bootstrap interval over those pairs (None under MIN_CI_PAIRS of them) and the pairs that went up and down."""
    pairs = sorted(set(before.per_pair) & set(after.per_pair))
    rng = random.Random(seed)
    samples = [[rng.choice(pairs) for _ in pairs] for _ in range(resamples)] if len(pairs) >= MIN_CI_PAIRS else []
    out = {}
    for n in NAMES:
        delta = {p: 100.0 * (after.per_pair[p][n] - before.per_pair[p][n]) for p in pairs}
        boot = sorted(sum(delta[p] for p in sample) / len(sample) for sample in samples)
        out[n] = {"pairs": len(pairs), "difference": sum(delta.values()) / len(pairs) if pairs else 0.0,
                  "ci95": (boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]) if boot else None,
                  "up": sum(d > 0 for d in delta.values()), "down": sum(d < 0 for d in delta.values())}
    return out


class RunScores(Metrics):
    """An evaluation run's metrics with the run's id, as a lineage entry keeps them."""

    run_id: str


def fraction(metrics: Metrics, name: str) -> float:
    """The score `name` as a fraction of its finished cells (0 when none)."""
    return metrics.counts.get(name, 0) / metrics.totals[name] if metrics.totals.get(name) else 0.0


def over_abstains(metrics: Metrics) -> bool:
    """Whether a harness refuses feasible requests more often than it completes them: a warning in every report."""
    return fraction(metrics, "over_abstain") > fraction(metrics, "act")


def pass_at_k(n: int, s: int, k: int) -> float:
    """Probability that at least one of k trials drawn from n (s successful) succeeds."""
    return 1.0 - comb(n - s, k) / comb(n, k)


def pass_hat_k(n: int, s: int, k: int) -> float:
    """Probability that all k trials drawn from n (s successful) succeed."""
    return comb(s, k) / comb(n, k)
