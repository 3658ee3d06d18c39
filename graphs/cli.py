"""The `hera` command: a thin argparse + rich layer over the library.

Human output goes to stderr, `--json` output to stdout. Exit codes: 0 ok,
1 a run or check failed, 2 bad usage or a broken spec.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import Progress
from rich.table import Table
from rich.tree import Tree

from envs.catalog import CATALOG, Entry, catalog_problems, load_catalog, load_entry, public_text_findings, task_ids
from envs.certify import certify
from graphs.certify import certify_pairs
from graphs.serve import CONFIG, STUDIO, supervise
from envs.importer import import_suite
from envs.mcp_server import serve_stdio, side_environment
from envs.mutation import apply_mutation
from envs.rescue import MAX_CALLS
from envs.spec import SpecError, load_environment, tool_infos
from graphs import api
from graphs.api import split_pairs
from graphs.coevolution import CONFIGS, PRESETS
from state.metrics import LABELS, MIN_CI_PAIRS, NAMES, over_abstains, paired_difference
from graphs.selection import GATE_LEVEL, SPLIT, gate_warning, min_pairs
from state.metrics import Metrics
from graphs.progress import Lines, progress
from graphs.report import (
    LINEAGE_SCORES,
    TIER_COLUMNS,
    build_report,
    comparison,
    comparison_report,
    comparison_tables,
    evaluation,
    funnel,
    proposal_costs,
    count_cell,
    score_note,
    score_rows,
    tier_rows,
    transfer_report,
    usage_costs,
    write_report,
)
from harness.bundle import bundle_diff, load_bundle
from state.context import PROPOSALS, ConfigError, Context
from roles.models import chat_model, endpoint_down, endpoint_problem
from state.evolution import LineageEntry
from state.ledger import Ledger, LedgerError
from state.store import StoreError, redacted
from state.paths import ID, RunPaths, run_id_problem
from state.records import CATEGORIES, Certification, EpisodeRecord, Grade, unicode_text

console = Console(stderr=True)


def say(markup: str) -> None:
    """One message line, never wrapped: rich wraps at 80 columns when stderr is no terminal, and an error,
    a note or a path must stay one piece to be read, copied and matched."""
    console.print(markup, soft_wrap=True)


ROLE_MODELS = ("judge_model", "analyst_model", "optimizer_model", "proposer_model", "reviewer_model", "builder_model", "task_model",
               "solver_model")


def context_from(args: argparse.Namespace, **given) -> Context:
    """A command's run settings: the agent's model --model, every other role's its own flag where the command has
    one, else --model; the other settings the command takes (catalog, ledger, turn cap, retries, ...) as given."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(Context) if getattr(args, f.name, None) is not None}
    if getattr(args, "model", None):
        values |= {"agent_model": args.model} | {role: getattr(args, role, None) or args.model for role in ROLE_MODELS}
    if getattr(args, "retries", None) is not None:
        values["max_infra_retries"] = args.retries
    return Context(**values | given)


def mark(episode: EpisodeRecord | dict) -> str:
    """An episode's mark in a progress line: ✓ succeeded, ✗ failed, ! not scored (an infrastructure error)."""
    event = api.episode_event(episode) if isinstance(episode, EpisodeRecord) else episode
    return "✓" if event["success"] else ("!" if event["status"] != "done" else "✗")


def counted(minimum: int):
    """An argparse type: an integer of at least `minimum` (a count, a budget, a limit)."""
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what} (got {text})")
        return value

    parse.__name__ = what
    return parse


positive_int, non_negative_int = counted(1), counted(0)


def fraction(low_open: bool):
    """An argparse type: a number from 0 (excluded when `low_open`) to 1."""
    what = "a number above 0 and at most 1" if low_open else "a number from 0 to 1"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not (0 < value <= 1 if low_open else 0 <= value <= 1):
            raise argparse.ArgumentTypeError(f"must be {what} (got {text})")
        return value

    parse.__name__ = what
    return parse


share, level = fraction(False), fraction(True)


def port_number(text: str) -> int:
    value = counted(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535 (got {text})")
    return value


def run_id(text: str) -> str:
    """An argparse type: a run id, which names folders under the runs root (`state.paths.ID`)."""
    problem = run_id_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def pair_id(text: str) -> str:
    """An argparse type: one pair id, never a pattern or a path (the catalog lookup would expand it to some pair)."""
    if not ID.fullmatch(text) or any(c in text for c in "*?[]"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a pair id: name each pair (see `hera envs list`); patterns are not expanded")
    return text


class Distinct(argparse.Action):
    """Stores a list of ids, refusing one given twice (a run of duplicates never completes)."""

    def __call__(self, parser, namespace, values, option_string=None):
        twice = sorted(v for v, n in Counter(values).items() if n > 1)
        if twice:
            raise argparse.ArgumentError(self, f"given more than once: {', '.join(twice)}")
        setattr(namespace, self.dest, values)


def model_spec(text: str) -> str:
    """An argparse type: a spec the model seam can build here (known kind, credentials set)."""
    try:
        chat_model(text, role="agent")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def reachable(*options: tuple[str, str | None]) -> None:
    """Asks each remote endpoint once, before anything is recorded: a dead or silent one costs seconds, not a run."""
    asked = set()
    for option, spec in options:
        if spec and spec not in asked:
            asked.add(spec)
            problem = endpoint_problem(spec)
            if problem:
                raise ConfigError(f"{option} {spec}: {problem}; nothing was run")


def role_specs(args: argparse.Namespace, *roles: str) -> list[tuple[str, str]]:
    """(option, spec) of each role's model: its own option when given, else --model."""
    return [(f"--{r.replace('_', '-')}", getattr(args, r)) if getattr(args, r) else ("--model", args.model) for r in roles]


def stop_note(resume: str, *specs: str) -> None:
    """Says why an evaluation stopped early (an endpoint went down) and how to finish it."""
    down = endpoint_down(*specs)
    if down:
        say(f"[red]stopped:[/] {escape(down)}; the finished episodes are kept: resume with `{escape(resume)}`")


def model_specs(text: str) -> list[str]:
    """An argparse type: model specs separated by commas, each buildable, none twice."""
    specs = [m.strip() for m in text.split(",") if m.strip()]
    if not specs:
        raise argparse.ArgumentTypeError("expected model specs separated by commas, e.g. local,openai:gpt-4o-mini")
    twice = sorted(m for m, n in Counter(specs).items() if n > 1)
    if twice:
        raise argparse.ArgumentTypeError(f"given more than once: {', '.join(twice)}")
    return [model_spec(m) for m in specs]


def _entries(args: argparse.Namespace, errors: list[SpecError] | None = None) -> dict[str, Entry]:
    return load_catalog(args.catalog, errors=errors)


def _entry(args: argparse.Namespace, pair_id: str) -> Entry:
    try:
        return load_entry(pair_id, args.catalog)
    except KeyError:
        raise ConfigError(f"unknown pair {pair_id!r} in catalog {args.catalog} (see `hera envs list --catalog {args.catalog}`)") from None


def builtin_catalog(catalog: str | Path) -> bool:
    return Path(catalog).resolve() == CATALOG.resolve()


def envs_list(args: argparse.Namespace) -> int:
    """What loads is listed; each environment or pair that does not is reported, and the exit is 2."""
    errors: list[SpecError] = []
    entries = _entries(args, errors)
    ledger = Ledger(args.ledger)
    rows = []
    for pair_id, e in entries.items():
        if args.split and e.pair.split != args.split:
            continue
        mutated = apply_mutation(e.env, e.pair.mutation).env
        cert = ledger.certification(pair_id, e.env.hash, mutated.hash)
        status = "not run" if cert is None else ("certified" if cert.passed else "FAILED")
        rows.append({"pair": pair_id, "theme": e.env.theme, "split": e.pair.split,
                     "category": e.pair.mutation.category, "certification": status})
    if args.json:
        print(json.dumps(rows if not errors else {"pairs": rows, "errors": [str(e) for e in errors]}, indent=1))
        return 2 if errors else 0
    table = Table(title=f"{len(rows)} pairs")
    for col in ("pair", "theme", "split", "category", "certification"):
        table.add_column(col)
    for r in rows:
        style = {"certified": "green", "FAILED": "red"}.get(r["certification"], "dim")
        table.add_row(*(escape(r[c]) for c in ("pair", "theme", "split", "category")), f"[{style}]{r['certification']}[/]")
    console.print(table)
    for error in errors:
        say(f"[red]error:[/] {escape(str(error))}")
    return 2 if errors else 0


def envs_show(args: argparse.Namespace) -> int:
    entry = _entry(args, args.pair)
    pair, env = entry.pair, entry.env
    mutated = apply_mutation(env, pair.mutation).env
    cert = Ledger(args.ledger).certification(pair.id, env.hash, mutated.hash) or certify(pair, env)
    if args.json:
        print(json.dumps({"pair": pair.model_dump(), "feasible_hash": env.hash, "infeasible_hash": mutated.hash,
                          "certification": cert.model_dump()}, indent=1, default=str))
        return 0
    m = pair.mutation
    console.print(Panel(escape(pair.task.instruction.strip()), title=escape(f"{pair.id}  [{pair.split}]  {env.theme}")))
    tools = Table(title="public tools (identical on both sides)")
    tools.add_column("tool")
    tools.add_column("kind")
    tools.add_column("description")
    for t in tool_infos(env).values():
        tools.add_row(escape(t.name), "read" if t.read_only else "[yellow]write[/]", escape(t.description.splitlines()[0]))
    console.print(tools)
    sides = Table(title="sides")
    sides.add_column("side")
    sides.add_column("environment")
    sides.add_column("should")
    sides.add_row("act", escape(f"{env.id} @ {env.hash}"), "complete the task")
    sides.add_row("abstain", escape(f"{env.id} @ {mutated.hash} (parent {mutated.parent_hash})"), "abstain")
    console.print(sides)
    ops = [f"{o.op} {o.table}[{o.key if o.op != 'insert' else '…'}] {o.fields or o.row or ''}" for o in m.state]
    ops += [f"{p.op} tool {p.tool} {p.when or p.where or ''} {p.fields or p.error_code}" for p in m.tools]
    body = "\n".join([
        f"[bold]category[/] {m.category}",
        f"[bold]what changed[/] {escape(m.description)}",
        f"[bold]breaks[/] {escape(m.requirement)}",
        "[bold]patch[/]\n  " + "\n  ".join(escape(op) for op in ops),
        f"[bold]scope[/] {escape(f'rows {dict(m.scope.rows)} tools {list(m.scope.tools)}')}",
        f"[bold]evidence[/] {escape(f'{m.evidence.tool} shows {m.evidence.contains!r}')}",
        f"[bold]witness[/] {escape(str(list(m.witness)))}",
        f"[bold]still reportable[/] {escape(', '.join(m.reportable) or '-')}",
    ])
    console.print(Panel(body, title="mutation (private)"))
    console.print(_cert_table([cert]))
    return 0 if cert.passed else 1


def _cert_table(certs: list[Certification]) -> Table:
    table = Table(title="certification")
    for col in ("pair", "check", "result", "detail"):
        table.add_column(col, overflow="fold")
    for cert in certs:
        for i, c in enumerate(cert.checks):
            result = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
            table.add_row(escape(cert.pair_id) if i == 0 else "", escape(c.name), result, escape(c.detail))
        table.add_section()
    return table


def envs_certify(args: argparse.Namespace) -> int:
    if not args.all and not args.pairs:
        raise ConfigError("name pairs to certify, or --all")
    errors: list[SpecError] = []
    if args.all:
        entries = _entries(args, errors)
        chosen = list(entries.values())
    else:
        chosen = [_entry(args, pair_id) for pair_id in args.pairs]
    with progress(console, transient=True) as bars:
        task = bars.add_task("certifying", total=len(chosen))
        result = asyncio.run(certify_pairs([e.pair.id for e in chosen], context_from(args), rescue_budget=args.rescue_budget,
                                           on_pair=lambda cert: bars.update(task, advance=1, description=f"certifying · {cert.pair_id}"))
                             ) if chosen else {"certifications": {}}
    certs = [result["certifications"][e.pair.id] for e in chosen]  # recorded in the ledger by the graph
    if args.all:
        problems = [str(e) for e in errors] + catalog_problems(entries, quotas=args.quotas or builtin_catalog(args.catalog))
    else:  # the named pairs' values must not show in their environment's public text either
        envs = {e.env.id: e.env for e in chosen}
        problems = [str(f) for env in envs.values() for f in public_text_findings(env, [e.pair for e in chosen if e.env.id == env.id])]
    failed = [c.pair_id for c in certs if not c.passed]
    if args.json:
        print(json.dumps({"certifications": [c.model_dump() for c in certs], "problems": problems}, indent=1))
    else:
        shown = certs if args.verbose or len(certs) <= 5 else [c for c in certs if not c.passed]
        if shown:
            console.print(_cert_table(shown))
        if args.all:
            console.print(_summary(chosen, certs))
        for problem in problems:
            say(f"[red]problem:[/] {escape(problem)}")
        verdict = f"[red]{len(failed)} failed[/]" if failed else "[green]none failed[/]"
        if problems:
            verdict += f"; [red]{len(problems)} catalog problem(s)[/]"
        say(f"{len(certs) - len(failed)}/{len(certs)} pairs certified; {verdict}")
    return 1 if failed or problems else 0


def _summary(entries: list[Entry], certs: list[Certification]) -> Table:
    passed = {c.pair_id for c in certs if c.passed}
    table = Table(title="catalog")
    table.add_column("category")
    splits = ("train", "validation", "bench")
    for s in splits:
        table.add_column(s, justify="right")
    table.add_column("certified", justify="right")
    counts = Counter((e.pair.mutation.category, e.pair.split) for e in entries)
    for cat in CATEGORIES:
        ok = sum(1 for e in entries if e.pair.mutation.category == cat and e.pair.id in passed)
        total = sum(counts[(cat, s)] for s in splits)
        table.add_row(cat, *(str(counts[(cat, s)]) for s in splits), f"{ok}/{total}")
    totals = Counter(e.pair.split for e in entries)
    table.add_section()
    table.add_row("all", *(str(totals[s]) for s in splits), f"{len(passed)}/{len(entries)}")
    return table


def envs_serve(args: argparse.Namespace) -> int:
    try:
        env = side_environment(args.pair, args.side, args.catalog)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    asyncio.run(serve_stdio(env))
    return 0


def envs_build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not args.run_id and out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: not empty; give a new or empty directory (or --run-id to resume)")
    context = context_from(args)
    reachable(*role_specs(args, "builder_model", "task_model", "solver_model", "proposer_model", "reviewer_model"))
    steps: dict[str, float] = {}
    last = [time.monotonic()]
    args.run_id = announce(args)
    with progress(console, bar=False) as bars:
        bar = bars.add_task("environment_builder")

        def on_event(node: str, value: dict) -> None:
            now = time.monotonic()
            steps[node] = steps.get(node, 0.0) + now - last[0]
            last[0] = now
            for d in value.get("decisions", []):
                mark = "[green]accepted[/]" if d.accepted else "[yellow]rejected[/]"
                say(f"{mark} {d.step} {escape(d.subject)} (attempt {d.attempt}): {escape('; '.join(d.reasons))[:400]}")
            bars.update(bar, description=f"{node} done")

        run_id, final = asyncio.run(api.build_environment(
            args.theme, str(out.resolve()), context, tasks=args.tasks, max_attempts=args.max_attempts,
            max_turns=args.max_turns, solver_tries=args.solver_tries, rows=args.rows, pairs=args.pairs,
            max_refinements=args.max_refinements, run_id=args.run_id, on_event=on_event))
    result = {"run_id": run_id, "out": str(out), "status": final.get("status"), "environment": final.get("env_id"),
              "kept": final.get("kept", []), "pairs": final.get("pairs_written", []), "log": str(out / "construction.json"),
              "wall_s_by_step": {k: round(v, 1) for k, v in steps.items()}, "costs": usage_costs(final.get("usage", []))}
    if result["pairs"]:  # the whole build's model use and wall time, shared by the pairs it ended in
        spent = {"calls": sum(r["calls"] for r in result["costs"]), "tokens": sum(r["tokens"] for r in result["costs"]),
                 "minutes": sum(steps.values()) / 60}
        result["per_certified_pair"] = {k: round(v / len(result["pairs"]), 1) for k, v in spent.items()}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        say(f"{result['status']}: {escape(str(result['environment']))} in {escape(str(out))}, {len(result['kept'])} validated task(s), "
            f"{len(result['pairs'])} certified pair(s); every decision in {result['log']}")
        spent = Table(title="wall time by step (s) and model use by role")
        for col in ("step or role", "seconds", "calls", "tokens"):
            spent.add_column(col, justify="left" if col == "step or role" else "right")
        for node, seconds in steps.items():
            spent.add_row(node, f"{seconds:,.0f}", "", "")
        for row in result["costs"]:
            spent.add_row(row["role"], f"{row['minutes'] * 60:,.0f}", f"{row['calls']:,}", f"{row['tokens']:,}")
        if "per_certified_pair" in result:
            per = result["per_certified_pair"]
            spent.add_row("per certified pair (whole build)", f"{per['minutes'] * 60:,.0f}", f"{per['calls']:,}", f"{per['tokens']:,}")
        console.print(spent)
    return 0 if result["status"] == "built" and result["kept"] and (result["pairs"] or not args.pairs) else 1


def envs_import(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: not empty; give a new or empty directory")
    report = import_suite(args.src, out, env_id=args.id, description=args.description)
    env = load_environment(out)
    report.notes += [str(f) for f in public_text_findings(env)]
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=1))
        return 0
    tables = ", ".join(f"{name} ({n})" for name, n in report.tables.items())
    say(f"imported {escape(report.env_id)} into {escape(str(out))}: tables {escape(tables)}; "
        f"{len(report.references)} reference(s); {len(report.tasks)} task(s) in tasks/")
    for note in report.notes:
        say(f"[yellow]note:[/] {escape(note)}")
    say(f"next: write the bodies of the {len(report.tools)} tool(s) in {escape(str(out / 'tools.py'))} (they raise NotImplementedError)")
    return 0


def add_envs_build(envs: argparse._SubParsersAction) -> None:
    build = envs.add_parser("build", help="build an environment and validated tasks from a theme; exit 1 if none is kept")
    build.add_argument("--theme", required=True, help="what the environment is about, in a few words")
    build.add_argument("--out", required=True, help="a new or empty directory for the environment")
    build.add_argument("--model", default="local", type=model_spec, help="local | openai:<model> | scripted:<name>")
    build.add_argument("--builder-model", type=model_spec, help="environment builder and tool coder (default: --model)")
    build.add_argument("--task-model", type=model_spec, help="task proposer (default: --model)")
    build.add_argument("--solver-model", type=model_spec, help="the independent solver (default: --model)")
    build.add_argument("--solver-harness", default="H-small", help="the harness the solver's model runs in (a built-in name or a bundle directory)")
    build.add_argument("--solver-tries", type=positive_int, default=3, help="solver attempts per task until the verifier accepts one")
    build.add_argument("--tasks", type=positive_int, default=3, help="tasks to propose")
    build.add_argument("--task-proposals", choices=PROPOSALS, default="menu",
                       help="menu: each task a change the write tools make on the initial state, the model writing only its "
                            "request (for small models); free: the model writes tasks with their rules (default: menu)")
    build.add_argument("--max-attempts", type=positive_int, default=3, help="drafts of the database, and of the tools, at most")
    build.add_argument("--max-turns", type=positive_int, default=12, help="solver turns per task")
    build.add_argument("--rows", type=non_negative_int, default=200, help="grow each table the builder wrote rows for to this many (0: as written)")
    build.add_argument("--pairs", type=non_negative_int, default=1, help="certified twins to seek per kept task (0: stop at tasks)")
    build.add_argument("--max-refinements", type=non_negative_int, default=1, help="refinement rounds per twin proposal")
    build.add_argument("--proposer-model", type=model_spec, help="mutation proposer (default: --model)")
    build.add_argument("--reviewer-model", type=model_spec, help="task, semantic and rescue reviewers (default: --model)")
    run_options(build, turns=None, resume="resume this build")  # its --max-turns is the solver's, above
    build.set_defaults(run=envs_build)
    imp = envs.add_parser("import", help="a suite (db.json, tasks.json, tools.json) as an environment with a tools.py skeleton and tasks/")
    imp.add_argument("src", metavar="SRC", help="the suite's directory")
    imp.add_argument("--out", required=True, help="a new or empty directory for the environment")
    imp.add_argument("--id", help="the environment id (default: SRC's name in kebab case)")
    imp.add_argument("--description", help="the environment's public description")
    imp.add_argument("--json", action="store_true")
    imp.set_defaults(run=envs_import)


def _note_unrecorded(ledger: Ledger) -> None:
    note = api.unrecorded_note(ledger)
    if note:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def run_eval(args: argparse.Namespace) -> int:
    catalog = args.catalog
    request = api.resume_request(args.run_id, context_from(args), pair_ids=args.pairs, bundle=args.harness, trials=args.trials,
                                 seed=args.seed, model=args.model, judge=args.judge_model, max_turns=args.max_turns)
    for option, key in (("--model", "model"), ("--judge-model", "judge")) if args.run_id else ():
        try:  # read back from the ledger, not parsed: its credentials may be gone
            model_spec(request[key] or request["model"])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"{option} {request[key]} (run {args.run_id}'s): {exc}") from None
    args.pairs, args.harness, args.trials, args.seed = request["pair_ids"], request["bundle"], request["trials"], request["seed"]
    args.model, args.judge_model, args.max_turns = request["model"], request["judge"], request["max_turns"]
    pair_ids = args.pairs or split_pairs(args.split, catalog)
    if args.limit:
        pair_ids = pair_ids[: args.limit]
    if not pair_ids:
        raise ConfigError(f"no pairs in split {args.split!r}")
    for pair_id in pair_ids:
        _entry(args, pair_id)
    judge = args.judge_model or args.model
    reachable(("--model", args.model), ("--judge-model", args.judge_model))
    _note_unrecorded(Ledger(args.ledger))
    context = context_from(args)
    total = 2 * len(pair_ids) * args.trials
    args.run_id = announce(args)
    with progress(console) as bars:
        bar = bars.add_task(f"{args.harness} × {args.model}", total=total)

        def advance(record: EpisodeRecord) -> None:
            bars.update(bar, advance=1, description=f"{args.harness} × {args.model} · {record.pair_id}/{record.key.side} {mark(record)}")

        run = asyncio.run(api.evaluate(args.harness, pair_ids, context, trials=args.trials, seed=args.seed,
                                       concurrency=args.concurrency, run_id=args.run_id, on_episode=advance))
    run_id, metrics = run.run_id, run.metrics
    if args.json:
        print(json.dumps({"run_id": run_id, "metrics": metrics.model_dump()}, indent=1))
    else:
        console.print(metrics_table(run_id, args.harness, args.model, metrics))
    stop_note(f"hera eval --run-id {run_id} --model {args.model}" + (f" --judge-model {judge}" if judge != args.model else ""),
              args.model, judge)
    return 0 if metrics.complete else 1


def metrics_table(run_id: str, harness: str, model: str, metrics: Metrics) -> Table:
    title = f"run {run_id}: {harness} × {model}, {metrics.pairs} pairs × {metrics.trials} trial(s)"
    table = Table(title=title)
    for col in ("metric", "count", "%", "95% CI"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for row in score_rows(metrics):
        table.add_row(*row)
    if metrics.by_tier:
        table.add_section()
        table.add_row("by tier", *(c for c in TIER_COLUMNS[1:4]))
        for row in tier_rows(metrics):
            table.add_row(row[0], *row[1:4])
    table.caption = score_note(metrics)
    return table


def runs_list(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger)
    runs = ledger.runs()
    _note_unrecorded(ledger)
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    table = Table(title=f"{len(runs)} runs")
    for col in ("run", "harness", "model", "pairs", "trials", "Abstain", "Act", "Pair", "updated"):
        table.add_column(col)
    for r in runs:
        m = Metrics.model_validate_json(r["metrics"]) if r.get("metrics") else None
        table.add_row(r["id"], r.get("bundle") or "", r.get("model") or "", str(len(json.loads(r.get("pairs") or "[]"))),
                      str(r.get("trials") or ""), *(count_cell(m, k) for k in ("abstain", "act", "pair")), r["updated_at"])
    console.print(table)
    return 0


def _flag(grade: Grade | None, name: str) -> str:
    return "—" if grade is None else ("yes" if getattr(grade, name) else "no")


def runs_show(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger)
    run = ledger.run(args.run_id)
    if run is None and args.run_id in api.checkpointed_runs():
        raise LedgerError(f"run {args.run_id} has checkpoints in {RunPaths.here().checkpoints} but no row in the ledger {ledger.path}: "
                          "the ledger was emptied or replaced; restore it from a backup")
    if run is None:
        raise ConfigError(f"unknown run {args.run_id!r} (see `hera runs list`)")
    episodes = ledger.episodes(args.run_id)
    unfinished = _unfinished(ledger, args.run_id)
    if args.json:
        print(json.dumps({"run": run, "episodes": [e.model_dump(exclude={"messages"}) for e in episodes], "unfinished": unfinished},
                         indent=1, default=str))
        return 0
    metrics, _ = evaluation(ledger, args.run_id)  # scored again from the episodes: no model call
    if metrics is not None:
        console.print(metrics_table(args.run_id, run.get("bundle", ""), run.get("model", ""), metrics))
    table = Table(title="episodes")
    for col in ("episode", "pair", "side", "trial", "termination", "success", "abstained", "committed", "grounded", "turns"):
        table.add_column(col)
    for e in episodes:
        table.add_row(escape(e.key.id), escape(e.pair_id), e.key.side, str(e.key.trial), e.termination or e.status,
                      *(_flag(e.grade, n) for n in ("success", "abstained", "committed", "grounded")),
                      str(sum(1 for m in e.messages if m.get("type") == "ai")))
    console.print(table)
    if unfinished:
        errors = Table(title="not finished: infrastructure or environment errors, never scored")
        for col in ("episode", "pair", "side", "last error"):
            errors.add_column(col, overflow="fold")
        for a in unfinished:
            errors.add_row(a["episode_id"], a["pair_id"], a["side"], escape(a["error"].splitlines()[0] if a["error"] else ""))
        console.print(errors)
    return 0


def _unfinished(ledger: Ledger, run_id: str) -> list[dict]:
    """The last failed attempt of each episode the run did not finish (nor reuse)."""
    attempts = ledger.attempts(run_id)
    finished = {a["episode_id"] for a in attempts if a["status"] in ("done", "reused")}
    last = {a["episode_id"]: a for a in attempts if a["episode_id"] not in finished}
    return list(last.values())


def runs_compare(args: argparse.Namespace) -> int:
    """Two evaluation runs on the same pairs: each score, the paired difference with its interval, cost per episode
    (over the pairs both finished)."""
    ledger = Ledger(args.ledger)
    scored = {}
    for run_id in (args.before, args.after):
        if ledger.run(run_id) is None:
            raise ConfigError(f"unknown run {run_id!r} (see `hera runs list`)")
        scored[run_id] = evaluation(ledger, run_id)
    (a, _), (b, _) = scored[args.before], scored[args.after]
    diff = paired_difference(a, b)
    both = set(a.per_pair) & set(b.per_pair)
    cost = {run_id: episode_cost([r for r in records if r.pair_id in both]) for run_id, (_, records) in scored.items()}
    if args.json:
        print(json.dumps({"before": args.before, "after": args.after, "metrics": {args.before: a.model_dump(), args.after: b.model_dump()},
                          "difference": diff, "cost": cost}, indent=1))
        return 0
    table = Table(title=f"{args.before} → {args.after}: {diff['pair']['pairs']} pairs finished by both")
    for col in ("metric", args.before, args.after, "difference (pp)", "95% CI (paired)", "pairs up / down"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name in NAMES:
        d = diff[name]
        ci = f"{d['ci95'][0]:+.1f} … {d['ci95'][1]:+.1f}" if d["ci95"] else f"n too small (< {MIN_CI_PAIRS})"
        table.add_row(LABELS[name], count_text(a, name), count_text(b, name), f"{d['difference']:+.1f}", ci, f"{d['up']} / {d['down']}")
    table.add_section()
    for key, label in (("input_tokens", "prompt tokens / episode"), ("output_tokens", "output tokens / episode"),
                       ("latency_s", "wall s / episode")):
        table.add_row(label, *(f"{cost[r][key]:,.0f}" for r in (args.before, args.after)), "", "", "")
    console.print(table)
    return 0


def episode_cost(records: list[EpisodeRecord]) -> dict[str, float]:
    """Mean agent tokens and wall time per finished episode."""
    done = [r for r in records if r.status == "done"] or [None]
    agent = [[u for u in r.usage if u.role == "agent"] if r else [] for r in done]
    return {"episodes": len([r for r in done if r]),
            "input_tokens": sum(sum(u.input_tokens for u in us) for us in agent) / len(done),
            "output_tokens": sum(sum(u.output_tokens for u in us) for us in agent) / len(done),
            "latency_s": sum(r.latency_s for r in done if r) / len(done)}


def count_text(metrics: Metrics, name: str) -> str:
    count = f"{metrics.counts[name]}/{metrics.totals[name]}"
    return f"{count} ({metrics.percent[name]:.0f}%)" if metrics.percent else count


def episode_show(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger)
    record = ledger.episode(args.episode)
    if record is None:
        raise ConfigError(f"unknown episode {args.episode!r} (see `hera runs show RUN`)")
    twin = next((e for e in ledger.episodes() if e.pair_id == record.pair_id and e.key.trial == record.key.trial
                 and e.key.harness_hash == record.key.harness_hash and e.key.model == record.key.model
                 and e.key.side != record.key.side), None)
    sides = sorted([r for r in (record, twin) if r], key=lambda r: r.key.side != "act")
    if args.json:
        print(json.dumps([r.model_dump() for r in sides], indent=1, default=str))
        return 0
    table = Table(title=escape(f"{record.pair_id} — trial {record.key.trial}, {record.bundle} × {record.key.model}"), show_lines=True)
    for r in sides:
        table.add_column(escape(f"{r.key.side} ({r.key.id})"), ratio=1, overflow="fold")
    columns = [_trajectory(r) for r in sides]
    for row in itertools.zip_longest(*columns, fillvalue=""):
        table.add_row(*row)
    console.print(table)
    return 0


def _trajectory(record: EpisodeRecord) -> list[str]:
    lines = []
    for m in record.messages:
        kind, data = m.get("type"), m.get("data", {})
        if kind == "system":
            continue
        text = data.get("content") if isinstance(data.get("content"), str) else json.dumps(data.get("content"))
        if kind == "ai":
            calls = "; ".join(f"{c['name']}({json.dumps(c['args'])})" for c in data.get("tool_calls", []))
            lines.append(escape(f"agent: {text}" + (f"\n→ {calls}" if calls else "")))
        elif kind == "tool":
            lines.append(escape(f"tool: {text[:600]}"))
        else:
            lines.append(escape(f"user: {text}"))
    for o in record.observations:
        if not o.ok:
            lines.append(escape(f"tool error{' (a harness lookup)' if o.source == 'harness' else ''}: "
                                f"{o.tool}({json.dumps(o.args)}) {o.error_code}: {o.message}"))
    g = record.grade
    verdict = (f"success={g.success} abstained={g.abstained} committed={g.committed} grounded={g.grounded}"
               + (f"\nquote: {g.quote}" if g.quote else "") + ("\n" + "\n".join(g.failures) if g.failures else "")) if g else ""
    error = f"\nerror: {record.error}" if record.error else ""
    lines.append(escape(f"[{record.termination or record.status}] {verdict}{error}"))
    return lines


def evolve_harness(args: argparse.Namespace) -> int:
    pool = args.pool_pairs or split_pairs(args.pool, args.catalog)[: args.pool_size]
    validation = args.val_pairs or split_pairs(args.val, args.catalog)[: args.val_size]
    if not pool or not validation:
        raise ConfigError("the training pool and the validation set both need pairs")
    if set(pool) & set(validation):
        raise ConfigError(f"pairs in both the pool and the validation set: {sorted(set(pool) & set(validation))}")
    for pair_id in pool + validation:
        _entry(args, pair_id)
    context = context_from(args)
    reachable(("--model", args.model), *role_specs(args, "judge_model", "analyst_model", "optimizer_model"))
    gate_split = validation if args.rule == "hera" else pool
    per_eval = 2 * (len(pool) + len(validation) + (args.gate_trials - 1) * len(gate_split))
    warning = gate_warning(len(gate_split), args.gate_level, SPLIT[args.rule])
    if warning:
        say(f"[yellow]note:[/] {warning}")
    args.run_id = announce(args)
    with progress(console) as bars:
        bar = bars.add_task("evaluating the starting harness", total=per_eval * (args.candidates + 1))

        def on_event(node: str, value: dict) -> None:
            if node == "episode":
                bars.update(bar, advance=1, description=f"evaluating {value['bundle']} · {value['episode']}/{value['side']} {mark(value)}")
            elif node == "bundle_checks":
                for entry in value.get("lineage", {}).values():
                    if entry.problems:
                        bars.update(bar, advance=per_eval)
                        say(f"[yellow]{entry.bundle_id} rejected:[/] {escape('; '.join(entry.problems))}")
            elif node in ("failure_analyst", "fdcr", "harness_optimizer"):
                bars.update(bar, description=f"{node} done")

        run_id, final = asyncio.run(api.evolve_harness(
            args.base, pool, validation, context, candidates=args.candidates, mode=args.mode, channel=args.channel,
            rounds=args.rounds, rule=args.rule, gate_level=args.gate_level, gate_trials=args.gate_trials, run_id=args.run_id, on_event=on_event))
    lineage = list(final.get("lineage", {}).values())
    if args.json:
        print(json.dumps({"run_id": run_id, "selected": final.get("selected"), "lineage": [e.model_dump() for e in lineage]}, indent=1, default=str))
    else:
        console.print(lineage_tree(run_id, lineage))
        say(f"selected: {final.get('selected')}")
    return 0 if final.get("selected") else 1


def evolve_envs(args: argparse.Namespace) -> int:
    source = str(args.from_env or "")
    if source:  # a built environment's kept tasks are the parents
        known = task_ids(source)
        if not known:
            raise ConfigError(f"--from-env {source}: no tasks in {Path(source) / 'tasks'}; build the environment first (hera envs build)")
        parents = args.parents or known
        unknown = sorted(set(parents) - set(known))
        if unknown:
            raise ConfigError(f"--parents: {', '.join(unknown)} not a task of {source} ({', '.join(known)})")
    else:
        parents = args.parents or split_pairs("train", args.catalog)[: args.pool_size]
        for pair_id in parents:
            if _entry(args, pair_id).pair.split != "train":
                raise ConfigError(f"{pair_id} is not a training pair; only training pairs may be parents")
    context = context_from(args)
    reachable(("--model", args.model), *role_specs(args, "judge_model", "proposer_model", "reviewer_model"))
    diagnosis = asyncio.run(api.load_diagnosis(args.diagnosis, context))
    args.run_id = announce(args)
    with progress(console, bar=False) as bars:
        task = bars.add_task("designing proposals")
        shown: set[tuple] = set()  # an outcome comes once from the proposal subgraph and again from its parent

        def on_event(node: str, value: dict) -> None:
            for outcome in value.get("outcomes", {}).values():
                if (outcome.pair_id, outcome.status, outcome.rounds) in shown:
                    continue
                shown.add((outcome.pair_id, outcome.status, outcome.rounds))
                style = "green" if outcome.status == "certified" else "yellow"
                say(f"[{style}]{outcome.status}[/] {outcome.pair_id} after {outcome.rounds} round(s): {escape(outcome.reason[:200])}")
            for s in value.get("screenings", []):
                say(f"batch {'admitted' if s['admitted'] else 'not admitted'}: failed to abstain on "
                              f"{len(s['failed_to_abstain'])}/{len(s['batch'])} (needed {s['needed']})")
            bars.update(task, description=f"{node} done")

        run_id, final = asyncio.run(api.evolve_envs(
            parents, diagnosis, context, harness=args.harness, proposers=args.proposers, max_refinements=args.max_refinements,
            batch_size=args.batch_size, tau=args.tau, batches=args.batches, budget=args.budget, source=source, run_id=args.run_id,
            on_event=on_event))
    outcomes = list(final.get("outcomes", {}).values())
    counts = funnel(outcomes, len(final.get("admitted", [])))
    costs = proposal_costs(outcomes)
    if args.json:
        print(json.dumps({"run_id": run_id, "funnel": counts, "costs": costs, "outcomes": [o.model_dump() for o in outcomes],
                          "screenings": final.get("screenings", []), "admitted": final.get("admitted", [])}, indent=1, default=str))
    else:
        table = Table(title=f"environment evolution {run_id}")
        for col in counts:
            table.add_column(col.replace("_", " "), justify="right")
        table.add_row(*(str(v) for v in counts.values()))
        console.print(table)
        spent = Table(title="proposal costs (minutes: model time by role, the longest proposal's wall time for the totals)")
        for col in ("role", "calls", "tokens", "minutes"):
            spent.add_column(col, justify="left" if col == "role" else "right")
        for row in costs:
            spent.add_row(row["role"], *("—" if row[k] is None else f"{row[k]:,.1f}" if k == "minutes" or row["role"].startswith("per")
                                         else f"{row[k]:,}" for k in ("calls", "tokens", "minutes")))
        console.print(spent)
    return 0 if final.get("admitted") else 1


def lineage_tree(run_id: str, entries: list[LineageEntry]) -> Tree:
    tree = Tree(f"lineage of {run_id}")
    nodes: dict[str | None, Tree] = {None: tree}
    for e in entries:
        scores = "\n  ".join(f"{name}: " + " ".join(f"{LABELS[k]} {count_cell(m, k)}" for k in LINEAGE_SCORES)
                             + ("  [yellow]Over-abstain exceeds Act[/]" if m.complete and over_abstains(m) else "")
                             for name, m in (("train", e.train), ("val", e.validation)) if m)
        mark = "[green]adopted[/]" if e.adopted else "[dim]not adopted[/]"
        label = f"[bold]{e.bundle_id}[/] {mark}" + (f"\n  {scores}" if scores else "")
        if e.problems:
            label += f"\n  [red]rejected:[/] {escape('; '.join(e.problems))[:300]}"
        elif e.reason:
            label += f"\n  {escape(e.reason)[:300]}"
        tokens = sum(u.input_tokens + u.output_tokens for u in e.usage)
        if e.usage:
            edits = sum(u.role == "harness_optimizer" for u in e.usage)
            label += f"\n  built by {len(e.usage)} model calls ({edits} coding-agent), {tokens:,} tokens, {e.build_s:.0f} s"
        nodes[e.id] = nodes.get(e.parent_id, tree).add(label)
    return tree


def lineage_show(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger)
    entries = ledger.lineage(args.run_id)
    if args.json:
        print(json.dumps([e.model_dump() for e in entries], indent=1, default=str))
        return 0
    for run_id in dict.fromkeys(e.run_id for e in entries):
        console.print(lineage_tree(run_id, [e for e in entries if e.run_id == run_id]))
    if not entries:
        say("no lineage recorded" + (f" for {args.run_id}" if args.run_id else ""))
    return 0


def diff_bundles(args: argparse.Namespace) -> int:
    try:
        diff = bundle_diff(bundle_ref(args.ledger, args.a), bundle_ref(args.ledger, args.b))
    except SpecError as exc:
        raise ConfigError(str(exc)) from None
    print(diff, end="")
    return 0


def bundle_ref(ledger: str | None, ref: str) -> str:
    """A lineage id's bundle directory; any other reference (a directory or a built-in name) unchanged."""
    return {e.id: e.path for e in Ledger(ledger).lineage()}.get(ref, ref)


def report_run(args: argparse.Namespace) -> int:
    ledger = Ledger(args.ledger)
    try:
        built = build_report(ledger, args.run_id)
    except KeyError:
        raise ConfigError(f"unknown run {args.run_id!r}: {ledger.path} holds no evaluation, harness-evolution, "
                         "environment-evolution or co-evolution run of that id (see `hera runs list`, `hera lineage`)") from None
    paths = write_report(built, Path(args.out) if args.out else RunPaths.here().report(args.run_id))
    if args.json:
        print(json.dumps({"run_id": args.run_id, "kind": built.kind, **{k: str(v) for k, v in paths.items()}}, indent=1))
        return 0
    say(f"{escape(built.title)}: {len(built.sections)} section(s), {len(built.tables())} table(s), {len(built.figures())} figure(s)")
    for path in paths.values():
        print(path)
    return 0


def transfer(args: argparse.Namespace) -> int:
    models = args.models
    pair_ids = args.pairs or split_pairs(args.split, args.catalog)
    if args.limit:
        pair_ids = pair_ids[: args.limit]
    if not pair_ids:
        raise ConfigError(f"no pairs in split {args.split!r}")
    for pair_id in pair_ids:
        _entry(args, pair_id)
    judge = args.judge_model or models[0]
    reachable(*(("--models", m) for m in models), ("--judge-model", args.judge_model))
    bundle = bundle_ref(args.ledger, args.harness)
    harness = load_bundle(bundle)
    with progress(console) as bars:
        bar = bars.add_task(f"{harness.id} across {len(models)} models", total=2 * len(pair_ids) * args.trials * len(models))

        def advance(model: str, record: EpisodeRecord) -> None:
            bars.update(bar, advance=1, description=f"{harness.id} × {model} · {record.pair_id}/{record.key.side} {mark(record)}")

        results = asyncio.run(api.transfer(bundle, pair_ids, models, context_from(args), judge=judge, trials=args.trials, seed=args.seed,
                                           concurrency=args.concurrency, on_episode=advance,
                                           on_run=lambda model, run_id: stop_note(f"hera eval --run-id {run_id} --model {model} --judge-model {judge}", model, judge)))
    built = transfer_report(Ledger(args.ledger), harness.id, judge, len(pair_ids), args.trials, results)
    paths = write_report(built, Path(args.out) if args.out else RunPaths.here().report(built.run_id), stem="transfer")
    if args.json:
        print(json.dumps({"harness": harness.id, "bundle": str(harness.path), "judge": judge, "pairs": pair_ids, "paths": {k: str(v) for k, v in paths.items()},
                          "rows": [{"model": m, "run_id": r, "metrics": x.model_dump()} for m, r, x in results]}, indent=1))
    else:
        matrix = built.tables()[0]
        table = Table(title=matrix.title, caption=matrix.note)
        for col in matrix.columns:
            table.add_column(col, justify="left" if col in ("model", "run", "note") else "right", overflow="fold")
        for row in matrix.rows:
            table.add_row(*row)
        console.print(table)
        for path in paths.values():
            print(path)
    return 0 if all(m.complete for _, _, m in results) else 1


def _add_report_parsers(top) -> None:
    rp = top.add_parser("report", help="a run's report: report.md and a self-contained report.html with figures")
    rp.add_argument("run_id", metavar="RUN", type=run_id, help="an evaluation, harness-evolution, environment-evolution or co-evolution run")
    rp.add_argument("--out", help="directory (default: runs/reports/RUN)")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(run=report_run)
    tr = top.add_parser("transfer", help="one frozen harness across models: the Abstain/Act/Pair/Over-abstain matrix")
    tr.add_argument("--harness", required=True, help="bundle directory, built-in name or lineage id")
    tr.add_argument("--models", required=True, type=model_specs, help="model specs separated by commas")
    tr.add_argument("--judge-model", type=model_spec, help="the abstention judge, fixed across models (default: the first of --models)")
    tr.add_argument("--split", default="bench", choices=["train", "validation", "bench"])
    tr.add_argument("--pairs", nargs="+", type=pair_id, action=Distinct, help="pair ids (default: the whole split)")
    tr.add_argument("--limit", type=positive_int, help="only the first N pairs")
    tr.add_argument("--trials", type=positive_int, default=1)
    tr.add_argument("--seed", type=non_negative_int, default=0)
    episode_options(tr)
    tr.add_argument("--out", help="directory (default: runs/reports/transfer-<id>)")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(run=transfer)


def _protocol(args: argparse.Namespace) -> tuple[dict, dict[str, list[str]], Context]:
    """The preset's settings with the flags given on top, its pairs per split, and the run settings."""
    settings, pairs = api.protocol(args.preset, args.catalog, **{k: v for k, v in vars(args).items() if k in PRESETS[args.preset]})
    warning = gate_warning(len(pairs["validation"]), settings["gate_level"])
    if warning:  # said before the run starts: its selection gate can never pass
        say(f"[yellow]note:[/] {warning}")
    reachable(("--model", args.model), ("--judge-model", args.judge_model))
    return settings, pairs, context_from(args)


NEXT_STAGE = {"setup": "diagnosing", "diagnose": "environment evolution", "evolve_envs": "harness evolution",
              "evolve_harness": "recording the round", "record": "next round", "final": "done"}
# what a round's sub-run does after each of its nodes (a resumed run learns its stage from these)
NEXT_SUBSTAGE = {"environment_designer": "environment evolution: proposing", "batcher": "environment evolution: screening",
                 "screener": "environment evolution: designing", "baseline": "harness evolution: diagnosing",
                 "failure_analyst": "harness evolution: reviewing the failures", "fdcr": "harness evolution: editing",
                 "harness_optimizer": "harness evolution: checking the candidate",
                 "bundle_checks": "harness evolution: scoring the candidate",
                 "candidate_evaluation": "harness evolution: diagnosing or selecting", "selector": "harness evolution: selected",
                 "bench": "scoring the final harness on the bench"}  # said by `final` as it starts


def method_progress(bars: Progress | Lines) -> Callable[[str, str, dict], None]:
    """A compared method's progress line: its stage, and its latest episode with the count so far."""
    bars_of, stages, episodes = {}, {}, Counter()

    def on_event(name: str, node: str, value: dict) -> None:
        if name not in bars_of:
            for earlier in bars_of.values():  # methods run one after another: the ones before are done
                bars.update(earlier, total=1, completed=1)
            bars_of[name] = bars.add_task(f"{name}: starting", total=None)
            # until a node ends the stage is not known: a resumed run may be anywhere (std16 read "setup" for 5 minutes
            # of its panel's review)
            stages[name] = "scoring" if "static" in CONFIGS[name] else "starting"
        if node == "episode":
            episodes[name] += 1
            text = f"{name}: {stages[name]} · episode {episodes[name]}: {value['episode']}/{value['side']} {mark(value)}"
        elif node == "stage":  # a sub-run's inner nodes (a proposal's reviewers, say) leave the stage as it is
            stages[name] = NEXT_SUBSTAGE.get(value["stage"], stages[name])
            text = f"{name}: {stages[name]}"
        else:
            stages[name] = NEXT_STAGE.get(node, node)
            text = f"{name}: {stages[name]}"
        bars.update(bars_of[name], description=text)

    return on_event


def coevolve(args: argparse.Namespace) -> int:
    settings, pairs, context = _protocol(args)
    args.run_id = announce(args)
    with progress(console, bar=False) as bars:
        on_event = method_progress(bars)
        result = asyncio.run(api.run_method(args.config, settings, pairs, context, run_id=args.run_id,
                                            on_event=lambda node, value: on_event(args.config, node, value)))
    paths = write_report(build_report(Ledger(args.ledger), result["run_id"]), RunPaths.here().report(result["run_id"]))
    if args.json:
        print(json.dumps({**result, "report": {k: str(v) for k, v in paths.items()}}, indent=1, default=str))
    else:
        if result["bench"]:
            console.print(metrics_table(result["run_id"], str(result["harness"]), args.model, Metrics.model_validate(result["bench"])))
        ledger = Ledger(args.ledger)  # what each round's harness-evolution block adopted or kept, and why
        for block in dict.fromkeys(r["harness_run"] for r in ledger.rounds(result["run_id"]) if r.get("harness_run")):
            console.print(lineage_tree(block, ledger.lineage(block)))
        say(f"report: {paths['html']}")
    return 0 if result["bench"] is None or result["bench"]["complete"] else 1


def compare(args: argparse.Namespace) -> int:
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:  # before anything runs
        raise ConfigError(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    settings, pairs, context = _protocol(args)
    args.run_id = announce(args)  # each method's run is this id with the method's name
    with progress(console, bar=False) as bars:
        results = asyncio.run(api.compare(args.configs, settings, pairs, context, run_id=args.run_id, on_event=method_progress(bars)))
    ledger = Ledger(args.ledger)
    rows = comparison(ledger, results)
    paths = write_report(comparison_report(ledger, args.run_id, rows), RunPaths.here().report(args.run_id))
    if args.json:
        print(json.dumps({"run_id": args.run_id, "methods": rows, "report": {k: str(v) for k, v in paths.items()}}, indent=1,
                         default=lambda v: v.model_dump() if isinstance(v, Metrics) else str(v)))
        return 0
    heading = f"{args.preset} protocol, {args.model}, {len(pairs['bench'] or pairs['validation'])} evaluation pairs: "
    for table in comparison_tables(rows, compact=True):
        shown = Table(title=heading + table.title, caption=table.note)
        for col in table.columns:
            shown.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
        for row in table.rows:
            shown.add_row(*row)
        console.print(shown)
    say(f"each method's run is {args.run_id}-METHOD; report: {paths['html']}")
    return 0


def _add_coevolution_parsers(top) -> None:
    def protocol(sub) -> None:
        sub.add_argument("--preset", default="quick", choices=list(PRESETS), help="pool sizes and budgets (default: quick)")
        model_options(sub)
        overrides = {"train": "training pairs at the start", "validation": "validation pairs", "bench": "bench pairs scored at the end",
                     "rounds": "co-evolution rounds", "proposers": "mutation proposals per design round",
                     "batch_size": "pairs per screened batch", "candidates": "harness candidates per block",
                     "budget": "design rounds per admitted batch", "max_turns": "a cap on every episode's turns",
                     "gate_trials": "trials of each harness on the validation pairs the selection gate reads"}
        for key, what in overrides.items():
            sub.add_argument(f"--{key.replace('_', '-')}", type=non_negative_int if key == "bench" else positive_int, help=f"{what} (default: the preset's)")
        sub.add_argument("--tier", choices=["short", "standard", "all"], help="the pairs' tier: short (2–3 reference calls, what a "
                                                                              "small model can finish), standard, or all (default: the preset's)")
        sub.add_argument("--tau", type=share, help="batch admission threshold (default 0.4)")
        sub.add_argument("--gate-level", type=level, help=f"the selection gate's sign-test level (default {GATE_LEVEL:g})")
        sub.add_argument("--proposals", choices=PROPOSALS, default="menu", help=PROPOSALS_HELP)
        run_options(sub, turns=None)  # --max-turns is one of the preset's settings above

    co = top.add_parser("coevolve", help="the HERA loop: rounds of environment then harness evolution, scored on the bench, with a report")
    co.add_argument("--config", default="coevolution", choices=list(CONFIGS), help="the method (default: coevolution)")
    protocol(co)
    co.set_defaults(run=coevolve)
    cmp = top.add_parser("compare", help="several methods on the same protocol and model, in one table")
    cmp.add_argument("configs", nargs="+", metavar="CONFIG", help=", ".join(CONFIGS))
    protocol(cmp)
    cmp.set_defaults(run=compare)


def serve(args: argparse.Namespace) -> int:
    """Runs `langgraph dev` on the project's langgraph.json until it exits or Ctrl-C."""
    import importlib.util
    import webbrowser

    if not CONFIG.is_file():
        raise ConfigError(f"{CONFIG} not found: `hera serve` runs from a source checkout (pip install -e '.[dev]')")
    if importlib.util.find_spec("langgraph_api") is None:
        raise ConfigError("`hera serve` needs langgraph-cli[inmem]: pip install -e '.[dev]'")

    def ready(url: str) -> None:
        console.print(Panel(f"Studio  {STUDIO}{url}\nAPI     {url}  (docs {url}/docs)\nCtrl-C stops the server.", title="hera serve"))
        if not args.no_browser:
            webbrowser.open(f"{STUDIO}{url}")

    return supervise(args.port, ready)


def add_serve(top: argparse._SubParsersAction) -> None:
    sv = top.add_parser("serve", help="serve the graphs to LangGraph Studio and over the LangGraph API (langgraph dev, 127.0.0.1)")
    sv.add_argument("--port", type=port_number, default=2024, help="port to ask for (default 2024; a free one is taken if it is busy)")
    sv.add_argument("--no-browser", action="store_true", help="do not open Studio in the browser")
    sv.set_defaults(run=serve)


def model_options(sub: argparse.ArgumentParser, *roles: tuple[str, str], default: str | None = "local",
                  model_help: str = "local | openai:<model> | scripted:<name> (default local)") -> None:
    """--model (every role's model), --judge-model and the given roles' own flags, each defaulting to --model."""
    sub.add_argument("--model", default=default, type=model_spec, help=model_help)
    sub.add_argument("--judge-model", type=model_spec, help="model of the abstention judge (default: --model)")
    for flag, what in roles:
        sub.add_argument(flag, type=model_spec, help=f"{what} (default: --model)")


def episode_options(sub: argparse.ArgumentParser) -> None:
    """How an evaluation's episodes run: at once, and re-run after an infrastructure error."""
    sub.add_argument("--concurrency", type=positive_int, default=1,
                     help="episodes run at once; up to twice as many are in hand, their claims and records made beside the runs")
    sub.add_argument("--retries", type=non_negative_int, default=2, help="re-runs of an episode after an infrastructure error")


def run_options(sub: argparse.ArgumentParser, turns: str | None = "every episode's", resume: str = "resume this run") -> None:
    """A long command's --max-turns (when its episodes take one), --run-id and --json."""
    if turns:
        sub.add_argument("--max-turns", type=positive_int, help=f"a cap on {turns} turns (default: the harness's own limit)")
    sub.add_argument("--run-id", type=run_id, help=resume)
    sub.add_argument("--json", action="store_true")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hera", description="Harness–environment co-evolution for agentic abstention.")
    p.add_argument("--catalog", default=str(CATALOG), help="catalog directory (default: the built-in one); every command that reads pairs also takes it")
    p.add_argument("--ledger", default=None, help="ledger file (default: $HERA_RUNS/hera.db, else runs/hera.db)")
    p.add_argument("--store", default=None, help="a PostgreSQL URL (postgresql://...) holding the ledger, the call journal and the "
                                                 "checkpoints instead of SQLite files under runs/ (default: $HERA_STORE)")
    p.add_argument("--engine", default=os.environ.get("HERA_ENGINE"),
                   help="where evaluation episodes run: in this process (default), local:N (a Dask cluster of N worker processes "
                        "started here) or tcp://HOST:PORT (an existing Dask scheduler); default: $HERA_ENGINE")
    top = p.add_subparsers(dest="command", required=True)
    add_serve(top)
    envs = top.add_parser("envs", help="environments and matched pairs").add_subparsers(dest="envs_command", required=True)
    ls = envs.add_parser("list", help="list the catalog's pairs")
    ls.add_argument("--split", choices=["train", "validation", "bench"])
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(run=envs_list)
    show = envs.add_parser("show", help="both sides of a pair, its mutation and its certification")
    show.add_argument("pair")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=envs_show)
    cert = envs.add_parser("certify", help="certify pairs; exit 1 if any check fails")
    cert.add_argument("pairs", nargs="*", type=pair_id, action=Distinct)
    cert.add_argument("--all", action="store_true")
    cert.add_argument("--json", action="store_true")
    cert.add_argument("-v", "--verbose", action="store_true", help="show every check of every pair")
    cert.add_argument("--quotas", action="store_true",
                      help="hold a custom catalog to the built-in one's split, tier and category quotas (always on for the built-in catalog)")
    cert.add_argument("--rescue-budget", type=positive_int, default=MAX_CALLS, help=f"read calls per rescue search (default {MAX_CALLS})")
    cert.set_defaults(run=envs_certify)
    serve = envs.add_parser("serve", help="serve one side of a pair as an MCP server on stdio")
    serve.add_argument("pair")
    serve.add_argument("--side", choices=["act", "abstain"], required=True)
    serve.set_defaults(run=envs_serve)
    add_envs_build(envs)
    ev = top.add_parser("eval", help="run a harness on both sides of pairs and score it")
    ev.add_argument("--harness", help="bundle name or directory (default H0)")
    ev.add_argument("--split", default="bench", choices=["train", "validation", "bench"])
    ev.add_argument("--pairs", nargs="+", type=pair_id, action=Distinct, help="pair ids (default: the whole split)")
    ev.add_argument("--limit", type=positive_int, help="only the first N pairs")
    model_options(ev, default=None, model_help="local | openai:<model> | scripted:<name> (default local, or the resumed run's)")
    ev.add_argument("--trials", type=positive_int, help="trials per pair and side (default 1)")
    ev.add_argument("--seed", type=non_negative_int)
    episode_options(ev)
    run_options(ev, resume="resume this run (its recorded harness, pairs, trials, seed, models and turn cap)")
    ev.set_defaults(run=run_eval)
    runs = top.add_parser("runs", help="evaluation runs").add_subparsers(dest="runs_command", required=True)
    rl = runs.add_parser("list")
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(run=runs_list)
    rs = runs.add_parser("show")
    rs.add_argument("run_id", metavar="RUN", type=run_id)
    rs.add_argument("--json", action="store_true")
    rs.set_defaults(run=runs_show)
    rc = runs.add_parser("compare", help="two runs on the same pairs: scores, paired differences with 95%% intervals, cost")
    rc.add_argument("before", metavar="RUN_A")
    rc.add_argument("after", metavar="RUN_B")
    rc.add_argument("--json", action="store_true")
    rc.set_defaults(run=runs_compare)
    ep = top.add_parser("episode", help="episodes").add_subparsers(dest="episode_command", required=True)
    es = ep.add_parser("show", help="a pair's act and abstain trajectories side by side")
    es.add_argument("episode")
    es.add_argument("--json", action="store_true")
    es.set_defaults(run=episode_show)
    evo = top.add_parser("evolve-harness", help="one block of harness evolution: failures → review → coding agent → checks → selection")
    evo.add_argument("--base", default="H0", help="starting bundle (default H0)")
    evo.add_argument("--pool", default="train", choices=["train", "validation", "bench"], help="split of the training pool")
    evo.add_argument("--val", default="validation", choices=["train", "validation", "bench"], help="split of the validation set")
    evo.add_argument("--pool-size", type=positive_int, default=None, help="only the first N pool pairs")
    evo.add_argument("--val-size", type=positive_int, default=None, help="only the first N validation pairs")
    evo.add_argument("--pool-pairs", nargs="+", type=pair_id, action=Distinct, help="explicit pool pair ids")
    evo.add_argument("--val-pairs", nargs="+", type=pair_id, action=Distinct, help="explicit validation pair ids")
    evo.add_argument("--candidates", type=positive_int, default=4)
    evo.add_argument("--mode", default="fdcr", choices=["fdcr", "aggregate", "serial"])
    evo.add_argument("--channel", default="structured", choices=["structured", "code"],
                     help="structured edits (small models) or free code edits with file tools (stronger endpoints)")
    evo.add_argument("--rounds", type=non_negative_int, default=2, help="FDCR review rounds")
    evo.add_argument("--rule", default="hera", choices=["hera", "ecdysis"], help="selection rule")
    evo.add_argument("--gate-level", type=level, default=GATE_LEVEL,
                     help=f"the selection gate's sign-test level (default {GATE_LEVEL:g}; it needs at least {min_pairs()} pairs)")
    evo.add_argument("--gate-trials", type=positive_int, default=1,
                     help="trials of each harness on the split the gate reads (validation under hera, the pool under ecdysis)")
    model_options(evo, ("--analyst-model", "failure analyst and review roles"), ("--optimizer-model", "the coding agent"))
    run_options(evo)
    evo.set_defaults(run=evolve_harness)
    ee = top.add_parser("evolve-envs", help="grow the training pool: mutation proposals → review → certification → batch screening")
    ee.add_argument("--diagnosis", required=True, help="a Diagnosis JSON file, or an evaluation run on training pairs")
    model_options(ee, ("--proposer-model", "environment designer and mutation proposers"), ("--reviewer-model", "semantic and rescue reviewers"))
    ee.add_argument("--proposals", choices=PROPOSALS, default="menu", help=PROPOSALS_HELP)
    ee.add_argument("--harness", default="H0", help="the current harness, which screens each batch")
    ee.add_argument("--parents", nargs="+", type=pair_id, action=Distinct, help="training pairs to mutate (default: the first --pool-size of the train split)")
    ee.add_argument("--from-env", type=Path, metavar="DIR", help="mutate the tasks kept in a built environment DIR (hera envs build)")
    ee.add_argument("--pool-size", type=positive_int, default=20)
    ee.add_argument("--proposers", type=positive_int, default=5, help="proposals per design round")
    ee.add_argument("--max-refinements", type=non_negative_int, default=2)
    ee.add_argument("--batch-size", type=positive_int, default=5)
    ee.add_argument("--tau", type=share, default=0.4, help="admit a batch when the harness fails to abstain on this share of it")
    ee.add_argument("--batches", type=positive_int, default=1, help="batches to admit")
    ee.add_argument("--budget", type=positive_int, default=3, help="design rounds at most")
    run_options(ee, turns="every screening episode's")
    ee.set_defaults(run=evolve_envs)
    lin = top.add_parser("lineage", help="the lineage tree of harness evolution runs, with scores")
    lin.add_argument("run_id", nargs="?", metavar="RUN", type=run_id)
    lin.add_argument("--json", action="store_true")
    lin.set_defaults(run=lineage_show)
    df = top.add_parser("diff", help="the diff between two bundles (directories, built-in names or lineage ids)")
    df.add_argument("a")
    df.add_argument("b")
    df.set_defaults(run=diff_bundles)
    _add_report_parsers(top)
    _add_coevolution_parsers(top)
    for sub in [*envs.choices.values(), *(top.choices[name] for name in CATALOG_COMMANDS)]:
        sub.add_argument("--catalog", default=argparse.SUPPRESS, help="catalog directory (default: the built-in one)")
    return p


PROPOSALS_HELP = ("menu: proposers choose one of the changes derived from the parent pair (for small models); "
                  "free: they write whole mutations (for a stronger --proposer-model) (default: menu)")
CATALOG_COMMANDS = ("eval", "evolve-harness", "evolve-envs", "coevolve", "compare", "transfer")


def announce(args: argparse.Namespace) -> str:
    """Says, before a long command starts, its run id (the one given, else a new one) and how to resume it."""
    run_id = args.run_id or api.new_run_id()
    argv = [redacted(a) for i, a in enumerate(args.argv) if a != "--run-id" and not a.startswith("--run-id=")
            and (i == 0 or args.argv[i - 1] != "--run-id")]  # a store's password is not printed
    say(f"run {run_id}; to resume it: `hera {escape(shlex.join([*argv, '--run-id', run_id]))}`")
    return run_id


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    # A byte the file system's encoding cannot decode reaches argv as a surrogate: text no record, prompt or log can
    # hold (a run id of it stopped `hera eval` with a traceback; sent to a model, a call fails as a malformed reply)
    if undecodable := next((a for a in given if unicode_text(a) is not a), None):
        say(f"[red]error:[/] argument {escape(repr(undecodable))} holds bytes that are not UTF-8; hera's arguments are text")
        return 2
    args = parser().parse_args(argv)
    args.argv = given
    if args.store:  # read by every store the run opens, in this process and in the processes it starts
        os.environ["HERA_STORE"] = args.store
    if args.ledger and os.environ.get("HERA_STORE"):
        say("[red]error:[/] --ledger names a ledger file and --store (or $HERA_STORE) a PostgreSQL store: give one of them")
        return 2
    catalog = Path(getattr(args, "catalog", CATALOG))
    if not any(catalog.glob("*/environment.yaml")):  # a mistyped path would list no pair and say nothing
        say(f"[red]error:[/] --catalog {escape(str(catalog))}: "
            f"{'no environment (ENV/environment.yaml) in it' if catalog.is_dir() else 'no such directory'}")
        return 2
    if args.command in ("eval", "evolve-harness", "evolve-envs", "transfer", "coevolve", "compare"):
        api.tune_gc()
    try:
        return args.run(args)
    except (ConfigError, SpecError, LedgerError, StoreError) as exc:
        say(f"[red]error:[/] {escape(str(exc))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
