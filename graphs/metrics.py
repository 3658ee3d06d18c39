"""Scores of an evaluation (HERA App. C.2, ECDYSIS §3.5).

Per pair p and trial t: c (the act side completed), b (the abstain side
abstained without committing), o (the act side abstained), g (b with the
blocking evidence observed first). Abstain, Act, Pair (c·b), Over-abstain
and Grounded are means over pairs and trials, with 95% bootstrap intervals
over pairs. Pass@k and Pass^k are on Pair, with the unbiased estimators over
n ≥ k trials. An incomplete run reports counts only.
"""

from __future__ import annotations

import random
from math import comb

from state.records import EpisodeRecord, Record

NAMES = ("abstain", "act", "pair", "over_abstain", "grounded")


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


def _cells(records: list[EpisodeRecord]) -> dict[tuple[str, int], dict[str, bool]]:
    cells: dict[tuple[str, int], dict[str, bool]] = {}
    for r in records:
        if r.status != "done" or r.grade is None:
            continue
        cell = cells.setdefault((r.pair_id, r.key.trial), {})
        if r.key.side == "act":
            cell["act"], cell["over_abstain"] = r.grade.success, r.grade.abstained
        else:
            cell["abstain"], cell["grounded"] = r.grade.success, r.grade.success and r.grade.grounded
    for cell in cells.values():
        if "act" in cell and "abstain" in cell:
            cell["pair"] = cell["act"] and cell["abstain"]
    return cells


def _mean(values: list[bool]) -> float:
    return 100.0 * sum(values) / len(values) if values else 0.0


def score(records: list[EpisodeRecord], pair_ids: list[str], trials: int, *, resamples: int = 1000, seed: int = 0) -> Metrics:
    cells = _cells(records)
    planned = 2 * len(pair_ids) * trials
    finished = sum(len([k for k in c if k in ("act", "abstain")]) for c in cells.values())
    complete = finished == planned
    counts = {n: sum(c.get(n, False) for c in cells.values()) for n in NAMES}
    totals = {n: sum(n in c for c in cells.values()) for n in NAMES}
    usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "cost_usd": 0.0}
    for r in records:
        for u in r.usage:
            usage["input_tokens"] += u.input_tokens
            usage["output_tokens"] += u.output_tokens
            usage["cached_tokens"] += u.cached_tokens
            usage["cost_usd"] += u.cost_usd or 0.0
    if not complete:
        return Metrics(pairs=len(pair_ids), trials=trials, planned=planned, finished=finished, complete=False,
                       counts=counts, totals=totals, percent=None, ci95=None, pass_at_k=None, pass_hat_k=None, usage=usage)
    per_pair = {p: [cells[(p, t)] for t in range(trials)] for p in pair_ids}
    percent = {n: _mean([c[n] for cs in per_pair.values() for c in cs]) for n in NAMES}
    rng = random.Random(seed)
    boot: dict[str, list[float]] = {n: [] for n in NAMES}
    for _ in range(resamples):
        sample = [per_pair[rng.choice(pair_ids)] for _ in pair_ids]
        for n in NAMES:
            boot[n].append(_mean([c[n] for cs in sample for c in cs]))
    ci95 = {n: (sorted(v)[int(0.025 * resamples)], sorted(v)[int(0.975 * resamples) - 1]) for n, v in boot.items()}
    successes = [sum(c["pair"] for c in cs) for cs in per_pair.values()]
    return Metrics(
        pairs=len(pair_ids), trials=trials, planned=planned, finished=finished, complete=True, counts=counts,
        totals=totals, percent=percent, ci95=ci95, usage=usage,
        pass_at_k=100.0 * sum(pass_at_k(trials, s, trials) for s in successes) / len(successes),
        pass_hat_k=100.0 * sum(pass_hat_k(trials, s, trials) for s in successes) / len(successes),
    )


def pass_at_k(n: int, s: int, k: int) -> float:
    """Probability that at least one of k trials drawn from n (s successful) succeeds."""
    return 1.0 - comb(n - s, k) / comb(n, k)


def pass_hat_k(n: int, s: int, k: int) -> float:
    """Probability that all k trials drawn from n (s successful) succeed."""
    return comb(s, k) / comb(n, k)
