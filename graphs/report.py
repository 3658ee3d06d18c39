"""Reports of recorded runs: pure functions from the ledger to tables and
figures, rendered as Markdown and as one self-contained HTML page.

`build_report(ledger, run_id)` detects the kind of run (evaluation,
harness evolution, environment evolution, co-evolution) and assembles its
sections; `render_markdown` / `render_html` / `write_report` turn them into
files. Scores always come from `state.metrics.score` over the ledger's
episodes (or the Metrics a lineage entry recorded); an incomplete evaluation
shows counts only, and every table says when infrastructure errors left
episodes unscored. Figures are SVG drawn here: nothing is fetched.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from roles.failure_analyst import failure_kind
from state.metrics import LABELS, MIN_CI_PAIRS, NAMES, Metrics, fraction, over_abstained, over_abstains, paired_difference, score
from state.evolution import LineageEntry, ProposalOutcome
from state.ledger import Ledger
from state.records import CATEGORIES, EpisodeRecord, UsageRecord

MAIN = NAMES  # the grounded headline, then HERA's raw Abstain and Pair beside it
LINEAGE_SCORES = ("abstain", "pair", "act", "over_abstain", "abstain_raw", "pair_raw")
KINDS = {"evaluation": "evaluation", "harness": "harness evolution", "env": "environment evolution", "coevolution": "co-evolution",
         "transfer": "transfer", "compare": "comparison"}


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""
    note: str = ""


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    svg: str
    note: str = ""


@dataclass(frozen=True)
class Details:
    summary: str
    body: str


@dataclass(frozen=True)
class Node:
    label: str
    detail: str = ""
    details: tuple[Details, ...] = ()
    children: tuple[Node, ...] = ()
    status: str = ""  # adopted | rejected | not adopted


@dataclass(frozen=True)
class Tree:
    roots: tuple[Node, ...]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Links:
    links: tuple[tuple[str, str], ...]  # (label, section anchor)


Block = Table | Figure | Tree | Text | Links | Details


@dataclass(frozen=True)
class Section:
    title: str
    anchor: str
    blocks: tuple[Block, ...]
    level: int = 2


@dataclass(frozen=True)
class Report:
    run_id: str
    kind: str
    sections: tuple[Section, ...]
    heading: str = ""

    @property
    def title(self) -> str:
        return self.heading or f"Report of {KINDS[self.kind]} run {self.run_id}"

    def tables(self) -> list[Table]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Table)]

    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]


# ---- scores, shared with the CLI ----

def score_rows(metrics: Metrics) -> list[tuple[str, str, str, str]]:
    """The score table of `hera eval`: metric, count, %, 95% CI ("n too small" under MIN_CI_PAIRS pairs, dashes for
    an incomplete run), Pass@k and Pass^k on the grounded Pair."""
    rows = []
    for key in NAMES:
        pct = f"{metrics.percent[key]:.1f}" if metrics.percent else "—"
        if metrics.ci95:
            ci = f"{metrics.ci95[key][0]:.1f}–{metrics.ci95[key][1]:.1f}"
        else:
            ci = f"n too small ({metrics.pairs} < {MIN_CI_PAIRS})" if metrics.complete and metrics.pairs < MIN_CI_PAIRS else "—"
        rows.append((LABELS[key], f"{metrics.counts[key]}/{metrics.totals[key]}", pct, ci))
    if metrics.complete:
        rows.append((f"Pass@{metrics.trials} (Pair)", "", f"{metrics.pass_at_k:.1f}", ""))
        rows.append((f"Pass^{metrics.trials} (Pair)", "", f"{metrics.pass_hat_k:.1f}", ""))
    return rows


def tier_rows(metrics: Metrics) -> list[tuple[str, ...]]:
    """Counts by tier (short, standard): the rows of `TIER_COLUMNS`."""
    return [(tier, *(f"{t['counts'][k]}/{t['totals'][k]}" for k in NAMES)) for tier, t in sorted(metrics.by_tier.items())]


TIER_COLUMNS = ("tier", *(LABELS[k] for k in NAMES))


def score_note(metrics: Metrics) -> str:
    u = metrics.usage
    return _join(f"{metrics.finished}/{metrics.planned} episodes finished"
                 + ("" if metrics.complete else " — incomplete: counts only")
                 + f"; tokens in {u['input_tokens']:,.0f} (cached {u['cached_tokens']:,.0f}), out {u['output_tokens']:,.0f}"
                 + (f"; ${u['cost_usd']:.4f}" if u["cost_usd"] else ""),
                 over_abstain_warning(metrics))


def over_abstain_warning(metrics: Metrics | None) -> str:
    if not metrics or not metrics.totals.get("act") or not over_abstains(metrics):
        return ""
    return (f"warning: Over-abstain ({fraction(metrics, 'over_abstain'):.0%}) exceeds Act ({fraction(metrics, 'act'):.0%}): "
            "this harness refuses feasible requests more often than it completes them")


def count_cell(metrics: Metrics | None, name: str, percent: bool = True) -> str:
    """Count and percentage for a complete run (unless `percent` is false), the count alone for an incomplete one."""
    if metrics is None:
        return "—"
    count = f"{metrics.counts[name]}/{metrics.totals[name]}"
    return f"{count} ({metrics.percent[name]:.1f}%)" if percent and metrics.percent else count


def funnel(outcomes: list[ProposalOutcome], admitted: int) -> dict[str, int]:
    """Proposals → passed review → certified → admitted."""
    return {"proposals": len(outcomes), "passed_review": sum(any("accepts" in r for r in o.reviews) for o in outcomes),
            "certified": sum(o.status == "certified" for o in outcomes), "admitted": admitted}


def proposal_costs(outcomes: list[ProposalOutcome]) -> list[dict]:
    """Model calls, tokens and model minutes (call latencies, waits for a server slot included) by role over all
    proposals; then the totals, whose minutes are the wall time of the longest proposal (a design round's proposals
    run side by side), and the totals per certified pair."""
    certified = sum(o.status == "certified" for o in outcomes)
    rows = usage_costs([u for o in outcomes for u in o.usage])
    total = {"role": "all roles", "calls": sum(r["calls"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
             "minutes": max((o.elapsed_s for o in outcomes), default=0.0) / 60}
    per = {"role": "per certified pair", **({k: total[k] / certified for k in ("calls", "tokens", "minutes")} if certified else
                                             {"calls": None, "tokens": None, "minutes": None})}
    return [*rows, total, per]


def usage_costs(usage: list[UsageRecord]) -> list[dict]:
    """Model calls, tokens and model minutes (call latencies) by role, in role order."""
    rows: dict[str, dict] = {}
    for u in usage:
        row = rows.setdefault(u.role, {"role": u.role, "calls": 0, "tokens": 0, "minutes": 0.0})
        row["calls"] += 1
        row["tokens"] += u.input_tokens + u.output_tokens
        row["minutes"] += u.latency_s / 60
    return sorted(rows.values(), key=lambda r: r["role"])


# ---- reading the ledger ----

def run_kind(ledger: Ledger, run_id: str) -> str | None:
    if ledger.rounds(run_id):
        return "coevolution"
    if ledger.lineage(run_id):
        return "harness"
    if ledger.proposals(run_id) or ledger.batches(run_id):
        return "env"
    if ledger.run(run_id) is not None:
        return "evaluation"
    return None


def _json(value, default=None):
    if value is None:
        return default
    if isinstance(value, str) and (value[:1] in "[{\"" or value in ("null", "true", "false")):
        return json.loads(value)
    return value


def evaluation(ledger: Ledger, run_id: str, pairs: list[str] | None = None) -> tuple[Metrics | None, list[EpisodeRecord]]:
    """The run's metrics, scored from its episodes in the ledger (on `pairs` only, if given), and those episodes."""
    run = ledger.run(run_id)
    if run is None:
        return None, []
    records = ledger.episodes(run_id)
    run_pairs = _json(run.get("pairs"), [])
    if not run_pairs:
        return (Metrics.model_validate_json(run["metrics"]) if run.get("metrics") else None), records
    chosen = [p for p in run_pairs if pairs is None or p in pairs]
    records = [r for r in records if r.pair_id in chosen]
    return score(records, chosen, int(run.get("trials") or 1), tiers=_json(run.get("tiers"), {})), records


def infra_errors(ledger: Ledger, run_ids) -> tuple[int, int]:
    """Episodes of these runs still unfinished after an infrastructure error, and ones finished on a re-run."""
    unfinished = recovered = 0
    for run_id in dict.fromkeys(r for r in run_ids if r):
        attempts = ledger.attempts(run_id)
        finished = {a["episode_id"] for a in attempts if a["status"] in ("done", "reused")}
        errored = {a["episode_id"] for a in attempts if a["status"] == "infrastructure_error"}
        unfinished += len(errored - finished)
        recovered += len(errored & finished)
    return unfinished, recovered


def infra_note(ledger: Ledger, run_ids) -> str:
    unfinished, recovered = infra_errors(ledger, run_ids)
    parts = []
    if unfinished:
        parts.append(f"{unfinished} episode(s) ended in an infrastructure error and are not scored "
                     "(neither success nor failure; resume the run to re-run them)")
    if recovered:
        parts.append(f"{recovered} episode(s) hit an infrastructure error and finished on a re-run")
    return "; ".join(parts)


def spent_tokens(ledger: Ledger, run_id: str | None) -> int:
    """Tokens (in + out) the run's own episodes spent; episodes reused from the rollout cache cost nothing."""
    if not run_id:
        return 0
    fresh = {a["episode_id"] for a in ledger.attempts(run_id) if a["status"] == "done"}
    return sum(u.input_tokens + u.output_tokens for e in ledger.episodes(run_id) if e.key.id in fresh for u in e.usage)


def _usage_tokens(usage) -> int:
    return sum(u.input_tokens + u.output_tokens for u in usage)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _anchor(*parts: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


# ---- evaluation runs ----

def evaluation_sections(ledger: Ledger, run_id: str, level: int = 2, title: str = "") -> list[Section]:
    run = ledger.run(run_id) or {}
    metrics, records = evaluation(ledger, run_id)
    if metrics is None:
        return [Section(title or f"Evaluation {run_id}", _anchor("eval", run_id), (Text("no episodes recorded"),), level)]
    heading = f"run {run_id}: {run.get('bundle', '')} × {run.get('model', '')}, {metrics.pairs} pairs × {metrics.trials} trial(s)"
    table = Table(("metric", "count", "%", "95% CI"), tuple(score_rows(metrics)), heading,
                  _join(score_note(metrics), infra_note(ledger, [run_id])))
    tiers = [Table(TIER_COLUMNS, tuple(tier_rows(metrics)), "by tier")] if metrics.by_tier else []
    latency = sum(r.latency_s for r in records)
    stamps = sorted(a["created_at"] for a in ledger.attempts(run_id))
    reused = sum(a["status"] == "reused" for a in ledger.attempts(run_id))
    time_text = (f"Judge {run.get('judge', '—')}. Wall time: {latency:,.1f} s summed over {len(records)} finished episodes"
                 + (f" ({reused} reused from the rollout cache)" if reused else "")
                 + (f"; the run recorded episodes from {stamps[0]} to {stamps[-1]}." if stamps else "."))
    cells: dict[tuple[str, int], dict[str, EpisodeRecord]] = {}
    for r in records:
        cells.setdefault((r.pair_id, r.key.trial), {})[r.key.side] = r
    rows = []
    for pair_id in _json(run.get("pairs"), []):
        for trial in range(metrics.trials):
            sides = cells.get((pair_id, trial), {})
            act, abstain = sides.get("act"), sides.get("abstain")
            rows.append((pair_id, str(trial), _mark(act, "success"), _mark(abstain, "success"),
                         _mark(abstain, "grounded", abstain is not None and abstain.grade.success),
                         "—" if act is None or act.grade is None else ("yes" if over_abstained(act.grade) else "no"),
                         _kind(act), _kind(abstain)))
    unfinished = "— not finished (an infrastructure error or an interrupted run), never a failure" if not metrics.complete else ""
    per_pair = Table(("pair", "trial", "act done", "abstained", "grounded", "over-abstained", "act failure", "abstain failure"),
                     tuple(rows), "per pair", _join(unfinished, infra_note(ledger, [run_id])))
    kinds = kinds_table(list(cells.values()))
    return [Section(title or f"Evaluation {run_id}", _anchor("eval", run_id),
                    (table, *tiers, Text(time_text), per_pair, *([kinds] if kinds.rows else [])), level)]


def _kind(record: EpisodeRecord | None) -> str:
    """The failure kind of a finished episode (roles.failure_analyst), "" when it succeeded, — when it did not finish."""
    return "—" if record is None or record.grade is None else failure_kind(record) or ""


def kinds_table(cells: list[dict[str, EpisodeRecord]]) -> Table:
    """Failures by kind and side, and how many of them were all that kept their pair from Pair: the pair's other
    side was solved (the task done, or the twin refused with the evidence)."""
    tally: Counter = Counter()
    for sides in cells:
        of_side = {side: _kind(r) for side, r in sides.items()}  # "": solved (a task done, a twin refused with grounds)
        for side, kind in of_side.items():
            if kind not in ("", "—"):
                tally[kind, side] += 1
                tally[kind, "alone"] += of_side.get("abstain" if side == "act" else "act") == ""
    kinds = sorted({k for k, _ in tally}, key=lambda k: (-tally[k, "alone"], -tally[k, "act"] - tally[k, "abstain"], k))
    return Table(("failure kind", "act side", "abstain side", "the pair's other side solved"),
                 tuple((k, str(tally[k, "act"]), str(tally[k, "abstain"]), str(tally[k, "alone"])) for k in kinds),
                 "failure kinds", "as the failure analyst names an outcome (before it reads guessed ids); the pair's other side "
                                  "solved: the task done, or the twin refused with the evidence, so this failure was all that "
                                  "kept its pair from Pair")


def _mark(record: EpisodeRecord | None, name: str, applies: bool = True) -> str:
    if record is None or record.grade is None:
        return "—"
    if not applies:
        return ""
    return "yes" if getattr(record.grade, name) else "no"


# ---- harness evolution ----

def harness_sections(ledger: Ledger, run_id: str, level: int = 2) -> list[Section]:
    entries = ledger.lineage(run_id)
    anchor = _anchor("harness", run_id)
    eval_runs = [m.run_id for e in entries for m in (e.train, e.validation) if m]
    rows = []
    for e in entries:
        train, val = e.train, e.validation
        status = "adopted" if e.adopted else ("rejected" if e.problems else "not adopted")
        notes = [f"{name} incomplete ({m.finished}/{m.planned})" for name, m in (("train", train), ("val", val)) if m and not m.complete]
        notes += [infra_note(ledger, [m.run_id for m in (e.train, e.validation) if m])]
        rows.append((e.bundle_id, _bundle_of(entries, e.parent_id), status,
                     *(count_cell(train, k) for k in MAIN), *(count_cell(val, k) for k in MAIN),
                     f"{_usage_tokens(e.usage):,}", f"{e.build_s:.0f}", _join(*notes)))
    columns = ("candidate", "parent", "status", *(f"train {LABELS[k]}" for k in MAIN), *(f"val {LABELS[k]}" for k in MAIN),
               "build tokens", "build s", "note")
    table = Table(columns, tuple(rows), f"lineage of {run_id}: train and validation scores",
                  _join("count (%) for a complete evaluation, count only for an incomplete one", infra_note(ledger, eval_runs)))
    cost = harness_cost(ledger, entries)
    blocks: list[Block] = [table, Text("Lineage (parent → child):"), lineage_tree(entries)]
    if cost:
        blocks.append(cost)
    return [Section(f"Harness evolution {run_id}", anchor, tuple(blocks), level)]


def _bundle_of(entries: list[LineageEntry], entry_id: str | None) -> str:
    return next((e.bundle_id for e in entries if e.id == entry_id), entry_id or "—")


def lineage_tree(entries: list[LineageEntry]) -> Tree:
    children: dict[str | None, list[LineageEntry]] = {}
    ids = {e.id for e in entries}
    for e in entries:
        children.setdefault(e.parent_id if e.parent_id in ids else None, []).append(e)

    def node(e: LineageEntry) -> Node:
        scores = "  ".join(f"{name} " + " ".join(f"{LABELS[k]} {count_cell(m, k)}" for k in LINEAGE_SCORES)
                           for name, m in (("train", e.train), ("val", e.validation)) if m)
        mark = "adopted" if e.adopted else ("rejected" if e.problems else "not adopted")
        detail = ("rejected: " + "; ".join(e.problems)) if e.problems else e.reason
        detail = _join(detail, *(f"{name}: {over_abstain_warning(m)}" for name, m in (("train", e.train), ("val", e.validation))
                                 if over_abstain_warning(m)))
        if e.usage:
            edits = sum(u.role == "harness_optimizer" for u in e.usage)
            detail = _join(detail, f"built by {len(e.usage)} model calls ({edits} coding-agent), {_usage_tokens(e.usage):,} tokens, {e.build_s:.0f} s")
        details = []
        if e.spec:
            spec = "\n".join(["failure patterns:", *(f"  - {p}" for p in e.spec.failure_patterns), "changes:",
                              *(f"  - [{c.component}] {c.description} ({c.rationale})" for c in e.spec.changes)])
            details.append(Details(f"{e.bundle_id}: modification spec", spec))
        if e.diff:
            details.append(Details(f"{e.bundle_id}: diff ({e.diff.count(chr(10))} lines)", e.diff))
        return Node(f"{e.bundle_id} [{mark}]  {scores}".rstrip(), detail, tuple(details), tuple(node(c) for c in children.get(e.id, [])), mark)

    return Tree(tuple(node(e) for e in children.get(None, [])))


def harness_cost(ledger: Ledger, entries: list[LineageEntry]) -> Figure | None:
    """HERA Fig. 3 for one lineage: cumulative tokens (building and evaluating) against validation Pair and Abstain."""
    total, points = 0, {"pair": [], "abstain": []}
    for e in entries:
        total += _usage_tokens(e.usage) + sum(spent_tokens(ledger, m.run_id) for m in (e.train, e.validation) if m)
        val = e.validation
        if val is None or not val.complete:
            continue
        for k in points:
            points[k].append(Point(total, val.percent[k], e.bundle_id, hollow=not e.adopted))
    if not points["pair"]:
        return None
    series = [Series(LABELS[k], tuple(v), dashed=k == "abstain", annotate=k == "pair") for k, v in points.items()]
    name = _anchor("cost", entries[0].run_id)
    return Figure(name, "Cost: validation score against tokens spent", line_chart(series, "tokens spent (cumulative)", "validation %"),
                  "x: tokens (in + out) of every model call that built a candidate and of every episode evaluated fresh "
                  "(cache reuses cost nothing), cumulative over the lineage; filled marks adopted, hollow not adopted; "
                  "only complete validation evaluations are plotted")


# ---- environment evolution ----

def env_data(ledger: Ledger, run_id: str) -> tuple[list[ProposalOutcome], list[dict]]:
    batches = [{**b, "batch": _json(b.get("batch"), []), "failed_to_abstain": _json(b.get("failed_to_abstain"), []),
                "admitted": bool(b.get("admitted"))} for b in ledger.batches(run_id)]
    return ledger.proposals(run_id), batches


def env_sections(ledger: Ledger, run_id: str, level: int = 2) -> list[Section]:
    outcomes, batches = env_data(ledger, run_id)
    admitted = [p for b in batches if b["admitted"] for p in b["batch"]]
    counts = funnel(outcomes, len(admitted))
    screens = [b.get("screen_run") for b in batches]
    blocks: list[Block] = [Table(("proposed", "passed review", "certified", "admitted"), (tuple(str(v) for v in counts.values()),),
                                 "funnel", "passed review: both reviewers accepted in some round")]
    blocks.append(Table(("batch", "pairs", "failed to abstain", "needed", "admitted", "screening run"),
                        tuple((str(i + 1), ", ".join(b["batch"]), f"{len(b['failed_to_abstain'])}/{len(b['batch'])}", str(b.get("needed", "")),
                               "yes" if b["admitted"] else "no", b.get("screen_run") or "—") for i, b in enumerate(batches)),
                        "batch screening (infeasible sides with the current harness)", infra_note(ledger, screens)))
    cats = category_counts(outcomes, admitted)
    rows = tuple((c, str(n["certified"]), str(n["admitted"])) for c, n in cats.items())
    blocks.append(Table(("category", "certified", "admitted"), rows, "categories of change introduced (HERA App. E.3)"))
    if cats:
        blocks.append(Figure(_anchor("categories", run_id), "Certified and admitted pairs per mutation category",
                             bar_chart(list(cats), [("certified", [n["certified"] for n in cats.values()]),
                                                    ("admitted", [n["admitted"] for n in cats.values()])])))
    blocks.append(Table(("pair", "parent", "category", "status", "rounds", "reason"),
                        tuple((o.pair_id, o.target.parent, o.target.category, o.status, str(o.rounds), o.reason[:300]) for o in outcomes),
                        "proposals"))
    return [Section(f"Environment evolution {run_id}", _anchor("env", run_id), tuple(blocks), level)]


def category_counts(outcomes: list[ProposalOutcome], admitted: list[str]) -> dict[str, dict[str, int]]:
    """Certified and admitted pairs per category, in the catalog's category order; categories with neither left out."""
    certified = Counter(o.target.category for o in outcomes if o.status == "certified")
    taken = Counter(o.target.category for o in outcomes if o.pair_id in set(admitted))
    order = list(CATEGORIES) + sorted(set(certified) - set(CATEGORIES))
    return {c: {"certified": certified[c], "admitted": taken[c]} for c in order if certified[c] or taken[c]}


# ---- co-evolution ----

@dataclass(frozen=True)
class Round:
    round: int
    env_run: str | None
    harness_run: str | None
    harness: str | None
    train_run: str | None
    validation_run: str | None
    pool: list[str]
    batches: dict[str, list[str]]
    bench_run: str | None = None


def rounds(ledger: Ledger, run_id: str) -> list[Round]:
    return [Round(round=int(r["round"]), pool=_json(r.get("pool"), []), batches=_json(r.get("batches"), {}),
                  **{k: _json(r.get(k)) for k in ("env_run", "harness_run", "harness", "train_run", "validation_run", "bench_run")})
            for r in ledger.rounds(run_id)]


def coevolution_sections(ledger: Ledger, run_id: str) -> list[Section]:
    rs = rounds(ledger, run_id)
    lineage = {e.id: e for e in ledger.lineage()}
    sections = [round_section(ledger, run_id, rs, lineage), dynamics_section(ledger, run_id, rs),
                coevolution_cost_section(ledger, run_id, rs, lineage), coevolution_categories_section(ledger, run_id, rs)]
    bench = next((r.bench_run for r in reversed(rs) if r.bench_run), None)
    if bench:
        sections += evaluation_sections(ledger, bench, 2, f"Bench: final harness on the reserved split ({bench})")
    for r in rs:
        if r.env_run and run_kind(ledger, r.env_run) == "env":
            sections += [_retitled(s, f"Round {r.round}: environment evolution {r.env_run}", 3) for s in env_sections(ledger, r.env_run)]
        if r.harness_run and ledger.lineage(r.harness_run):
            sections += [_retitled(s, f"Round {r.round}: harness evolution {r.harness_run}", 3) for s in harness_sections(ledger, r.harness_run)]
    return sections


def _retitled(section: Section, title: str, level: int) -> Section:
    return Section(title, section.anchor, section.blocks, level)


def round_section(ledger: Ledger, run_id: str, rs: list[Round], lineage: dict[str, LineageEntry]) -> Section:
    rows, links = [], []
    for r in rs:
        metrics, _ = evaluation(ledger, r.validation_run) if r.validation_run else (None, [])
        new = [name for name in r.batches if name.startswith(f"round-{r.round}-")]
        harness = lineage[r.harness].bundle_id if r.harness in lineage else (r.harness or "—")
        rows.append((str(r.round), harness, str(len(r.pool)), ", ".join(new) or "—",
                     *(count_cell(metrics, k) for k in MAIN),
                     "incomplete" if metrics and not metrics.complete else ""))
        if r.env_run:
            links.append((f"round {r.round}: environment evolution {r.env_run}", _anchor("env", r.env_run)))
        if r.harness_run:
            links.append((f"round {r.round}: harness evolution {r.harness_run}", _anchor("harness", r.harness_run)))
    table = Table(("round", "harness", "pool", "batches admitted", *(f"val {LABELS[k]}" for k in MAIN), "note"), tuple(rows),
                  f"co-evolution {run_id}: the harness selected at the end of each round on the fixed validation pairs",
                  _join("count (%) for a complete evaluation, count only for an incomplete one",
                        infra_note(ledger, [r.validation_run for r in rs])))
    return Section(f"Rounds of {run_id}", _anchor("rounds", run_id), (table, Links(tuple(links))))


def batch_scores(ledger: Ledger, rs: list[Round]) -> dict[str, dict[int, Metrics]]:
    """Each batch's metrics under each round's harness, from that round's training run on the batch's pairs in its pool."""
    batches = rs[-1].batches if rs else {}
    out: dict[str, dict[int, Metrics]] = {name: {} for name in batches}
    for r in rs:
        run = ledger.run(r.train_run) if r.train_run else None
        if run is None:
            continue
        run_pairs = set(_json(run.get("pairs"), []))
        for name, pairs in batches.items():
            chosen = [p for p in pairs if p in run_pairs]
            if chosen:
                metrics, _ = evaluation(ledger, r.train_run, chosen)
                out[name][r.round] = metrics
    return out


def dynamics_section(ledger: Ledger, run_id: str, rs: list[Round]) -> Section:
    scores = batch_scores(ledger, rs)
    rows = tuple((name, *(" · ".join(f"{LABELS[k]} {count_cell(by_round.get(r.round), k)}" for k in ("abstain", "pair"))
                          if r.round in by_round else "—" for r in rs)) for name, by_round in scores.items())
    table = Table(("batch", *(f"H{r.round}" for r in rs)), rows, "each batch under each round's harness (training runs)",
                  _join("Abstain on the batch's infeasible sides, Pair on its pairs; — the batch was not yet in the pool",
                        infra_note(ledger, [r.train_run for r in rs])))
    blocks: list[Block] = [table]
    ticks = [(float(r.round), f"H{r.round}") for r in rs]
    for k in ("abstain", "pair"):
        series = [Series(name, tuple(Point(float(n), m.percent[k], f"H{n}") for n, m in sorted(by_round.items()) if m.complete))
                  for name, by_round in scores.items()]
        series = [s for s in series if s.points]
        if series:
            blocks.append(Figure(_anchor("dynamics", k, run_id), f"{LABELS[k]} across rounds, per batch",
                                 line_chart(series, "harness update (H_i: selected at the end of round i, on pool T_i)", f"{LABELS[k]} %", ticks),
                                 "one line per batch; only complete evaluations are plotted"))
    return Section("Co-evolution dynamics (HERA Fig. 2)", _anchor("dynamics", run_id), tuple(blocks))


def round_work(ledger: Ledger, r: Round, lineage: dict[str, LineageEntry]) -> tuple[int, list[str]]:
    """A round's model work outside episodes (tokens of its proposals and harness candidates) and the evaluation
    runs it scored."""
    tokens, runs = 0, [r.train_run, r.validation_run, r.bench_run]
    if r.env_run:
        outcomes, batches = env_data(ledger, r.env_run)
        tokens += sum(_usage_tokens(o.usage) for o in outcomes)
        runs += [b.get("screen_run") for b in batches]
    for e in lineage.values():
        if r.harness_run and e.run_id == r.harness_run:
            tokens += _usage_tokens(e.usage)
            runs += [m.run_id for m in (e.train, e.validation) if m]
    return tokens, [run for run in runs if run]


def round_tokens(ledger: Ledger, r: Round, lineage: dict[str, LineageEntry], seen: set[str]) -> int:
    """Tokens a round spent: proposals, harness candidates, and each evaluation run not counted before."""
    tokens, runs = round_work(ledger, r, lineage)
    for run in runs:
        if run not in seen:
            seen.add(run)
            tokens += spent_tokens(ledger, run)
    return tokens


def method_tokens(ledger: Ledger, run_id: str, rs: list[Round] | None = None) -> int:
    """Tokens (in + out) a compared method's run (its rounds `rs`, read when not given) used, each episode it scored
    counted once whether it ran or came from the rollout cache: what the method costs on its own."""
    rs = rounds(ledger, run_id) if rs is None else rs
    if not rs:
        return sum(_usage_tokens(e.usage) for e in ledger.episodes(run_id))
    lineage = {e.id: e for e in ledger.lineage()}
    tokens, episodes = 0, {}
    for r in rs:
        work, runs = round_work(ledger, r, lineage)
        tokens += work
        episodes |= {e.key.id: e for run in dict.fromkeys(runs) for e in ledger.episodes(run)}
    return tokens + sum(_usage_tokens(e.usage) for e in episodes.values())


def comparison(ledger: Ledger, results: dict[str, dict], reference: str = "h0") -> list[dict]:
    """One row per compared method (`api.compare`'s results): its bench metrics, the paired difference of each score
    from `reference`'s on the pairs both finished (None without a complete reference), tokens, wall time, and the
    candidates its harness-evolution blocks adopted; a method run once under another name (`same_as`) repeats its row."""
    base = results.get(reference, {}).get("bench")
    base = Metrics.model_validate(base) if base else None
    rows = []
    for name, result in results.items():
        bench = Metrics.model_validate(result["bench"]) if result.get("bench") else None
        rs = rounds(ledger, result["run_id"])
        blocks = {r.harness_run for r in rs if r.harness_run}
        adopted = sum(e.adopted and e.parent_id is not None for b in blocks for e in ledger.lineage(b))
        run = ledger.run(result["run_id"]) or {}
        rows.append({"method": name, "run_id": result["run_id"], "harness": result.get("harness"), "bench": bench,
                     "difference": paired_difference(base, bench) if base and bench and base.complete and bench.complete
                     and name != reference else None,
                     "tokens": method_tokens(ledger, result["run_id"], rs), "wall_s": float(run.get("wall_s") or 0.0),
                     "adopted": adopted if blocks else None, "evolved": bool(rs), "same_as": result.get("same_as")})
    return rows


def _difference_cell(row: dict, name: str) -> str:
    d = row["difference"] and row["difference"][name]
    if not d:
        return "—"
    ci = f" [{d['ci95'][0]:+.0f}, {d['ci95'][1]:+.0f}]" if d["ci95"] else " (n too small)"
    return f"{d['difference']:+.1f}{ci}"


COMPARED = ("abstain", "act", "pair", "over_abstain", "abstain_raw", "pair_raw")


def comparison_tables(rows: list[dict], reference: str = "h0", compact: bool = False) -> tuple[Table, Table]:
    """The methods' bench scores, grounded and raw; then each one against `reference` and what it cost. `compact`
    (a terminal's width): counts without percentages, no run ids."""
    def method(row: dict) -> str:
        return row["method"] + (f" (= {row['same_as']})" if row.get("same_as") else "")

    scores = Table(("method", *(LABELS[k] for k in COMPARED)),
                   tuple((method(r), *(count_cell(r["bench"], k, percent=not compact) for k in COMPARED)) for r in rows),
                   "bench scores of each method's final harness, scored once")
    columns = ("method", "Δ Pair", "Δ Abstain", "tokens", "wall (min)", "adopted", "min / adopted", *(() if compact else ("run",)))
    against = Table(columns, tuple((method(r), _difference_cell(r, "pair"), _difference_cell(r, "abstain"), f"{r['tokens']:,}",
                                    f"{r['wall_s'] / 60:.1f}", "—" if r["adopted"] is None else str(r["adopted"]),
                                    f"{r['wall_s'] / 60 / r['adopted']:.1f}" if r["adopted"] else "—",
                                    *(() if compact else (r["run_id"],))) for r in rows),
                    f"against {reference}, and cost",
                    f"Δ: bench score minus {reference}'s in percentage points, with a 95% paired bootstrap interval over the "
                    "pairs; tokens: every model call of the method's runs, episodes reused from the rollout cache included "
                    "(what it costs on its own); wall: the time its own runs took, reused episodes costing none; adopted: "
                    "candidates its harness-evolution blocks adopted; min / adopted: wall time per adopted candidate; "
                    "(= M): the same settings as M, run once")
    return scores, against


def comparison_report(ledger: Ledger, run_id: str, rows: list[dict]) -> Report:
    """The comparison tables (`comparison`'s rows), then each evolving method's co-evolution sections (lineage,
    dynamics, cost)."""
    sections = [Section("Comparison", _anchor("compare", run_id), comparison_tables(rows))]
    for row in rows:
        if row["evolved"] and not row["same_as"]:
            sections += [_retitled(s, f"{row['method']}: {s.title}", 3) for s in coevolution_sections(ledger, row["run_id"])]
    return Report(run_id, "compare", tuple(sections))


def coevolution_cost_section(ledger: Ledger, run_id: str, rs: list[Round], lineage: dict[str, LineageEntry]) -> Section:
    seen: set[str] = set()
    total, rows, points = 0, [], {"pair": [], "abstain": []}
    for r in rs:
        spent = round_tokens(ledger, r, lineage, seen)
        total += spent
        metrics, _ = evaluation(ledger, r.validation_run) if r.validation_run else (None, [])
        rows.append((str(r.round), f"{spent:,}", f"{total:,}", *(count_cell(metrics, k) for k in ("abstain", "pair"))))
        if metrics and metrics.complete:
            for k in points:
                points[k].append(Point(float(total), metrics.percent[k], f"H{r.round}"))
    blocks: list[Block] = [Table(("round", "tokens", "cumulative tokens", "val Abstain", "val Pair"), tuple(rows), "cost across rounds",
                                 "tokens (in + out) of proposals, reviews, candidate builds and fresh episodes; cache reuses cost nothing")]
    if points["pair"]:
        blocks.append(Figure(_anchor("cost", run_id), "Validation score against tokens spent, per round",
                             line_chart([Series(LABELS[k], tuple(v), dashed=k == "abstain", annotate=k == "pair") for k, v in points.items()],
                                        "tokens spent (cumulative)", "validation %")))
    return Section("Cost (HERA Fig. 3)", _anchor("cost-rounds", run_id), tuple(blocks))


def coevolution_categories_section(ledger: Ledger, run_id: str, rs: list[Round]) -> Section:
    per_round: dict[int, dict[str, dict[str, int]]] = {}
    for r in rs:
        if r.env_run:
            outcomes, batches = env_data(ledger, r.env_run)
            per_round[r.round] = category_counts(outcomes, [p for b in batches if b["admitted"] for p in b["batch"]])
    cats = [c for c in list(CATEGORIES) + sorted({c for v in per_round.values() for c in v} - set(CATEGORIES))
            if any(c in v for v in per_round.values())]
    rows = tuple((c, str(sum(v.get(c, {}).get("certified", 0) for v in per_round.values())),
                  str(sum(v.get(c, {}).get("admitted", 0) for v in per_round.values())),
                  *(str(per_round[n].get(c, {}).get("admitted", 0)) for n in per_round)) for c in cats)
    blocks: list[Block] = [Table(("category", "certified", "admitted", *(f"admitted E{n}" for n in per_round)), rows,
                                 "categories of change introduced (HERA App. E.3)")]
    if cats:
        blocks.append(Figure(_anchor("categories", run_id), "Admitted pairs per mutation category and round",
                             bar_chart(cats, [(f"E{n}", [per_round[n].get(c, {}).get("admitted", 0) for c in cats]) for n in per_round])))
    return Section("Categories of change", _anchor("categories-rounds", run_id), tuple(blocks))


# ---- transfer across models ----

def transfer_report(ledger: Ledger, harness: str, judge: str, pairs: int, trials: int,
                    results: list[tuple[str, str, Metrics]], run_id: str = "") -> Report:
    """One frozen harness across models: rows = models, columns = Abstain / Act / Pair / Over-abstain."""
    run_id = run_id or "transfer-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    rows = tuple((model, *(count_cell(m, k) for k in MAIN), eval_id,
                  _join("" if m.complete else f"incomplete ({m.finished}/{m.planned})", infra_note(ledger, [eval_id])))
                 for model, eval_id, m in results)
    table = Table(("model", *(LABELS[k] for k in MAIN), "run", "note"), rows,
                  f"{harness} across models: {pairs} pairs × {trials} trial(s), judge {judge}",
                  "count (%) for a complete run, count only for an incomplete one; `hera report RUN` for any row's details")
    return Report(run_id, "transfer", (Section("Transfer matrix", _anchor("transfer", run_id), (table,)),),
                  f"Transfer of harness {harness} across {len(results)} model(s)")


# ---- the report ----

def build_report(ledger: Ledger, run_id: str) -> Report:
    """The report of any recorded run; KeyError for an id the ledger does not know."""
    kind = run_kind(ledger, run_id)
    if kind is None:
        raise KeyError(run_id)
    build = {"evaluation": evaluation_sections, "harness": harness_sections, "env": env_sections}.get(kind)
    sections = build(ledger, run_id) if build else coevolution_sections(ledger, run_id)
    return Report(run_id, kind, tuple(sections))


def write_report(report: Report, out: Path, stem: str = "report") -> dict[str, Path]:
    """Writes `<stem>.md` (figures beside it as SVG files) and the self-contained `<stem>.html`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / f"{stem}.md", "html": out / f"{stem}.html"}
    paths["md"].write_text(render_markdown(report))
    paths["html"].write_text(render_html(report))
    for fig in report.figures():
        (out / f"{fig.name}.svg").write_text(fig.svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
    return paths


# ---- Markdown ----

def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _fence(body: str) -> str:
    ticks = "```"
    while ticks in body:
        ticks += "`"
    return ticks


def render_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    for s in report.sections:
        lines += [f'<a id="{s.anchor}"></a>', "", f"{'#' * s.level} {s.title}", ""]
        for b in s.blocks:
            lines += _md_block(b) + [""]
    return "\n".join(lines).rstrip() + "\n"


def _md_block(b: Block) -> list[str]:
    if isinstance(b, Table):
        out = [f"**{b.title}**", ""] if b.title else []
        out += ["| " + " | ".join(map(_md_cell, b.columns)) + " |", "|" + "---|" * len(b.columns)]
        out += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
        return out + (["", f"_{_md_cell(b.note)}_"] if b.note else [])
    if isinstance(b, Figure):
        return [f"![{b.title}]({b.name}.svg)"] + (["", f"_{b.note}_"] if b.note else [])
    if isinstance(b, Tree):
        out, details = [], []

        def walk(node: Node, depth: int) -> None:
            out.append("  " * depth + f"- **{_md_cell(node.label)}**" + (f" — {_md_cell(node.detail)}" if node.detail else ""))
            details.extend(node.details)
            for child in node.children:
                walk(child, depth + 1)

        for root in b.roots:
            walk(root, 0)
        for d in details:
            out += [""] + _md_block(d)
        return out
    if isinstance(b, Details):
        fence = _fence(b.body)
        return [f"<details><summary>{html.escape(b.summary)}</summary>", "", f"{fence}diff" if "diff" in b.summary else fence,
                b.body.rstrip("\n"), fence, "", "</details>"]
    if isinstance(b, Links):
        return [f"- [{label}](#{anchor})" for label, anchor in b.links]
    return [b.text]


# ---- HTML ----

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.8em 0; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; vertical-align: top; }
td { text-align: right; } td:first-child { text-align: left; }
th { background: #f3f3f3; }
.note { color: #555; font-size: 0.9em; margin-top: -0.4em; }
.tree ul, ul.tree { list-style: none; padding-left: 1.3em; border-left: 1px dotted #aaa; }
.adopted { color: #16803c; font-weight: 600; } .rejected { color: #b42318; }
.detail { color: #444; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 12px; }
figure { margin: 1em 0; } figcaption { font-weight: 600; }
nav li { margin: 0.1em 0; }
"""


def render_html(report: Report) -> str:
    e = html.escape
    toc = "".join(f'<li style="margin-left:{(s.level - 2) * 1.5}em"><a href="#{s.anchor}">{e(s.title)}</a></li>' for s in report.sections)
    body = [f"<h1>{e(report.title)}</h1>", f"<nav><ul>{toc}</ul></nav>"]
    for s in report.sections:
        body.append(f'<section id="{s.anchor}"><h{s.level}>{e(s.title)}</h{s.level}>')
        body += [_html_block(b) for b in s.blocks]
        body.append("</section>")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(report.title)}</title><style>{CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")


def _html_block(b: Block) -> str:
    e = html.escape
    if isinstance(b, Table):
        head = "".join(f"<th>{e(c)}</th>" for c in b.columns)
        rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
        table = f"<table><caption>{e(b.title)}</caption><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        return table + (f'<p class="note">{e(b.note)}</p>' if b.note else "")
    if isinstance(b, Figure):
        return f"<figure>{b.svg}<figcaption>{e(b.title)}</figcaption>" + (f'<p class="note">{e(b.note)}</p>' if b.note else "") + "</figure>"
    if isinstance(b, Tree):
        def item(node: Node) -> str:
            inner = f'<span class="{node.status.replace(" ", "-")}">{e(node.label)}</span>'
            inner += f'<div class="detail">{e(node.detail)}</div>' if node.detail else ""
            inner += "".join(_html_block(d) for d in node.details)
            inner += f"<ul>{''.join(item(c) for c in node.children)}</ul>" if node.children else ""
            return f"<li>{inner}</li>"
        return f'<ul class="tree">{"".join(item(r) for r in b.roots)}</ul>'
    if isinstance(b, Details):
        return f"<details><summary>{e(b.summary)}</summary><pre>{e(b.body)}</pre></details>"
    if isinstance(b, Links):
        return "<ul>" + "".join(f'<li><a href="#{a}">{e(label)}</a></li>' for label, a in b.links) + "</ul>"
    return f"<p>{e(b.text)}</p>"


# ---- SVG ----

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: str = ""
    hollow: bool = False


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[Point, ...] = field(default_factory=tuple)
    dashed: bool = False
    annotate: bool = False  # write each point's label beside it


def _num(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:,.0f}" if v == int(v) else f"{v:.1f}"


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2 or 5 × 10^k apart) covering lo..hi."""
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def line_chart(series: list[Series], x_label: str, y_label: str, x_ticks: list[tuple[float, str]] | None = None,
               width: int = 640, height: int = 320) -> str:
    """Lines with point marks over a 0–100 y axis; x ticks given (categorical), else round values from 0 to past the data."""
    e = html.escape
    left, right, top, bottom = 56, 150, 16, 48
    pw, ph = width - left - right, height - top - bottom
    xs = [p.x for s in series for p in s.points] + [t[0] for t in x_ticks or []]
    if x_ticks:
        lo, hi = min(xs), max(xs)
        if hi == lo:
            lo, hi = lo - 1, hi + 1
        pad = (hi - lo) * 0.08
        lo, hi = lo - pad, hi + pad
    else:
        lo, hi = 0.0, max(max(xs), 1.0) * 1.08
        x_ticks = [(t, "") for t in _nice_ticks(lo, hi)]

    def sx(x: float) -> float:
        return left + (x - lo) / (hi - lo) * pw

    def sy(y: float) -> float:
        return top + (1 - y / 100) * ph

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">']
    for y in range(0, 101, 20):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y}</text>')
    for x, label in x_ticks:
        out.append(f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#333"/>'
                   f'<text x="{sx(x):.1f}" y="{top + ph + 16}" text-anchor="middle">{e(label or _num(x))}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle">{e(x_label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">{e(y_label)}</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(s.points, key=lambda p: p.x)
        if len(pts) > 1:
            path = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in pts)
            dash = ' stroke-dasharray="6 4"' if s.dashed else ""
            out.append(f'<polyline class="series" data-label="{e(s.label)}" points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for p in pts:
            fill = "white" if p.hollow else color
            out.append(f'<circle cx="{sx(p.x):.1f}" cy="{sy(p.y):.1f}" r="4" fill="{fill}" stroke="{color}" stroke-width="2">'
                       f"<title>{e(s.label)} {e(p.label)}: {p.y:.1f}% at {_num(p.x)}</title></circle>")
            if s.annotate and p.label:
                out.append(f'<text x="{sx(p.x) + 6:.1f}" y="{sy(p.y) - 6:.1f}" font-size="10" fill="{color}">{e(p.label)}</text>')
        ly = top + 10 + 16 * i
        out.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 30}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"'
                   + (' stroke-dasharray="6 4"' if s.dashed else "") + "/>"
                   f'<text x="{left + pw + 36}" y="{ly + 4}">{e(s.label)}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(categories: list[str], groups: list[tuple[str, list[int]]], width: int = 640) -> str:
    """Horizontal grouped bars: one row per category, one bar per group, integer counts."""
    e = html.escape
    left, right, top, bar = 170, 110, 16, 12
    row = bar * max(len(groups), 1) + 10
    height = top + row * len(categories) + 36
    pw = width - left - right
    peak = max([v for _, values in groups for v in values] + [1])

    out = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="11">']
    step = max(1, -(-peak // 5))
    for v in range(0, peak + 1, step):
        x = left + v / peak * pw
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + row * len(categories)}" stroke="#e5e5e5"/>'
                   f'<text x="{x:.1f}" y="{top + row * len(categories) + 14}" text-anchor="middle">{v}</text>')
    for ci, cat in enumerate(categories):
        y0 = top + ci * row
        out.append(f'<text x="{left - 6}" y="{y0 + row / 2 + 2:.1f}" text-anchor="end">{e(cat)}</text>')
        for gi, (name, values) in enumerate(groups):
            w = values[ci] / peak * pw
            out.append(f'<rect class="bar" data-group="{e(name)}" data-category="{e(cat)}" data-value="{values[ci]}" x="{left}" '
                       f'y="{y0 + 5 + gi * bar}" width="{w:.1f}" height="{bar - 2}" fill="{PALETTE[gi % len(PALETTE)]}">'
                       f"<title>{e(cat)} {e(name)}: {values[ci]}</title></rect>")
    out.append(f'<text x="{left + pw / 2:.1f}" y="{height - 6}" text-anchor="middle">task pairs</text>')
    for gi, (name, _) in enumerate(groups):
        ly = top + 10 + 16 * gi
        out.append(f'<rect x="{left + pw + 12}" y="{ly - 8}" width="12" height="10" fill="{PALETTE[gi % len(PALETTE)]}"/>'
                   f'<text x="{left + pw + 30}" y="{ly + 1}">{e(name)}</text>')
    out.append("</svg>")
    return "".join(out)
