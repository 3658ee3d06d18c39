"""Task seeds: the changes a built environment's write tools make on its initial state, for a small model to ask for
(HERA App. B.2, task generation, made programmatic as the mutation menu is). A seed is a successful call of a write
tool: one of its declared valid calls with the records it names by key redrawn from rows like the declared ones, the
way a user names each record (a person's name, a title; else its key), its other values, and the checks its outcome
implies: the values the call returned and the rows it added, changed or removed. The model then writes only the
request. `task_seeds` runs the environment's tool code: call it only inside the sandbox (`harness.tool_sandbox`).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from envs.construct import DECLARATIONS, MIN_CHECKS, run_call
from envs.grow import person_column
from envs.spec import load_environment, load_tools
from state.construction import Named, TaskSeed, ToolDeclaration
from state.records import AnswerCheck, EnvironmentSpec, RowChange, StateCheck, TableSpec

TRIES_PER_SEED = 8  # redrawn calls tried per seed wanted, before the tools are taken to offer no more
MAX_ANSWERS = 2


def task_seeds(directory: Path | str, count: int, seed: int) -> list[TaskSeed]:
    """Up to `count` distinct seeds, the write tools taking turns, drawn with `seed`; seeds that name records come
    first (a task that looks nothing up leaves its twins little to change)."""
    env = load_environment(directory)
    tools = load_tools(env)
    declared = [ToolDeclaration.model_validate(d) for d in json.loads(Path(directory, DECLARATIONS).read_text())]
    writes = [d for d in declared if not d.read_only and d.valid and d.name in tools]
    rng, seeds, plain, seen = random.Random(seed), [], [], set()
    for n in range(count * TRIES_PER_SEED if writes else 0):
        if len(seeds) == count:
            break
        decl = writes[n % len(writes)]
        args, named = _redrawn(env, rng.choice(decl.valid), decl.changes, rng)
        if (decl.name, json.dumps(args, sort_keys=True, default=str)) in seen:
            continue
        seen.add((decl.name, json.dumps(args, sort_keys=True, default=str)))
        run = run_call(env, decl.name, args)
        if run.escaped or not run.observation.ok or not run.changes:
            continue
        answer = _answer(run.observation.output, args)
        state = [check for change in run.changes for check in _state(env.table(change.table), change, args)]
        if len(answer) + len(state) < MIN_CHECKS:
            continue
        keys = {n.arg for n in named}
        (seeds if named else plain).append(TaskSeed(tool=decl.name, description=tools[decl.name].info.description.strip().splitlines()[0], args=args,
                              named=tuple(named), details={k: v for k, v in args.items() if k not in keys and v is not None},
                              answer=tuple(answer), state=tuple(state), tables=tuple(dict.fromkeys(c.table for c in run.changes))))
    return (seeds + plain)[:count]


def _redrawn(env: EnvironmentSpec, args: dict, changes: list[str], rng: random.Random) -> tuple[dict, list[Named]]:
    """The call with each argument that names a record by key redrawn from the rows like that record (the same
    status, type or flag), preferring records the tables the call changes do not hold yet (a book nobody has
    reserved: an agent that finds a reservation for it may rightly stop), and the records it names."""
    args, named = dict(args), []
    for arg, value in list(args.items()):
        table = _keyed_by(env, arg)
        if table is None:
            continue
        rows = env.rows.get(table.name, ())
        row = next((r for r in rows if r.get(table.primary_key) == value), None)
        if row is None:
            continue
        alike = _alike(table, rows, row)
        held = {r.get(arg) for t in changes if t != table.name for r in env.rows.get(t, ())}
        row = rng.choice([r for r in alike if r[table.primary_key] not in held] or alike)
        args[arg] = row[table.primary_key]
        named.append(Named(arg=arg, table=table.name, key=row[table.primary_key], label=_label(table, rows, row)))
    return args, named


def _keyed_by(env: EnvironmentSpec, arg: str) -> TableSpec | None:
    """The one table whose key the argument names: by a reference of a column of that name, else by the key's name."""
    referred = {c.references.split(".")[0] for t in env.tables for c in t.columns if c.name == arg and c.references}
    tables = [t for t in env.tables if t.name in referred] or [t for t in env.tables if t.primary_key == arg]
    return tables[0] if len(tables) == 1 else None


def _alike(table: TableSpec, rows: tuple[dict, ...], row: dict) -> list[dict]:
    """The rows that agree with `row` on every column of few values (a status, a type, a flag): a record the
    declared call could change, so a redrawn call makes the same kind of change."""
    few = [c.name for c in table.columns if c.type in ("text", "boolean") and not c.references and c.name != table.primary_key
           and 1 < len({r.get(c.name) for r in rows}) <= max(2, len(rows) // 10)]
    return [r for r in rows if all(r.get(c) == row.get(c) for c in few)] or [row]


def _label(table: TableSpec, rows: tuple[dict, ...], row: dict) -> str:
    """How a user names the record: its person-name columns joined ("Mila Clark"), else its first text column whose
    values name one record each (a title); empty when neither names it alone (the key is used then)."""
    text = [c.name for c in table.columns if c.type == "text" and c.name != table.primary_key and not c.references]
    people = [c for c in text if person_column(table.name, c) and "name" in c]  # a user's name, not a book's author
    candidates = [people] if people else [[c] for c in text]
    for columns in candidates:
        label = _joined(row, columns)
        if (label and "@" not in label and re.search(r"[A-Za-z]{2}", label) and not re.fullmatch(r"\d{4}-\d{2}-\d{2}.*", label)
                and sum(_joined(r, columns).casefold() == label.casefold() for r in rows) == 1):
            return label
    return ""


def _joined(row: dict, columns: list[str]) -> str:
    return " ".join(str(row[c]).strip() for c in columns if isinstance(row.get(c), str) and row[c].strip())


def _answer(output, args: dict) -> list[AnswerCheck]:
    """Values the call returned that the request did not give (a new record's id, a count left)."""
    if not isinstance(output, dict):
        return []
    given = {json.dumps(v, default=str) for v in args.values()}
    return [AnswerCheck(name=k, value=v) for k, v in output.items()
            if isinstance(v, (str, int, float)) and not isinstance(v, bool) and k not in args and json.dumps(v) not in given][:MAX_ANSWERS]


def _state(table: TableSpec, change: RowChange, args: dict) -> list[StateCheck]:
    """The rows a correct run leaves: an added row with the values the call gave it; a changed row with its new
    values and without its old ones; a removed row gone."""
    pk = table.primary_key
    if change.after is None:
        return [StateCheck(table=table.name, match={pk: change.key}, absent=True)]
    if change.before is None:
        given = [v for v in args.values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
        match = {c: v for c, v in change.after.items() if c != pk and isinstance(v, (str, int, float)) and not isinstance(v, bool)
                 and v in given}
        return [StateCheck(table=table.name, match=match)] if match else []
    changed = [c for c, v in change.after.items() if change.before.get(c) != v]
    return [StateCheck(table=table.name, match={pk: change.key, **{c: change.after[c] for c in changed}}),
            StateCheck(table=table.name, match={pk: change.key, **{c: change.before[c] for c in changed}}, absent=True)]
