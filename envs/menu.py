"""Mutation menus: what a proposer may change in a parent pair, each choice
with its mutation derived programmatically (HERA App. B.3, for a small model).

The facts of a pair are the values its reference solution reads before the
first write and then relies on: a value a later call passes, the answer
states or the instruction names, traced to the row it came from. Each
category offers operations on facts of a fitting kind (delete or redact the
row's field for missing evidence, fail the call for a broken tool, move a
date into the past for a stale record, set a status to a revoked value,
insert a near-duplicate entity, make a second record disagree, take the one
option that met every constraint, add a category to what an earlier
disclosure shared). An option's witness, evidence, scope and
state/tool operations are computed from the choice, and the menu keeps only
options whose mutation passes the programmatic certification, so a proposer
writes nothing but the choice, a description and the requirement; what no
program can judge, that the change breaks the task for its stated reason, is
left to the semantic and rescue reviewers. What a menu is computed for is a
pair or a `Parent`: a feasible task, on its environment, and its control rows.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass

from envs.catalog import Parent
from envs.certify import certify, read_observations, reads_before_write
from envs.match import ANY, equal, objects, scalars
from envs.mutation import apply_mutation
from envs.spec import SpecError, tool_infos, write_tools
from state.records import (
    EnvironmentSpec,
    Evidence,
    Mutation,
    Observation,
    PairSpec,
    Row,
    Scalar,
    Scope,
    StateOp,
    TableSpec,
    ToolPatch,
    content_hash,
)

MAX_OPTIONS = 12  # shown to a proposer at once; categories take turns
_STATUS = re.compile(r"status|state|active|enabled|valid|approved|authori[sz]|granted|permission|access", re.I)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_REVOKED = ("revoked", "suspended", "withdrawn", "inactive", "expired", "cancelled", "canceled", "terminated", "disabled",
            "blocked", "lapsed", "denied", "rejected")
_GRANTED = ("active", "approved", "valid", "granted", "enabled", "authorized", "authorised", "current", "confirmed", "verified",
            "signed", "issued", "in_force", "true", "yes")
_OPEN = ("open", "available", "free", "vacant", "bookable", "in_stock")
_DISCLOSURE = re.compile(r"disclos|shar|releas|consent|recipient", re.I)  # a table or column recording what data went where
_SHARED = re.compile(r"categor|items|fields|data|shared|disclosed|released", re.I)  # ... and the column listing the data
_CATEGORIES = re.compile(r"^[a-z][a-z_]*(?:\s*,\s*[a-z][a-z_]*)*$")  # a list of data categories: "name,email"
_TAKEN = ("booked", "taken", "reserved", "held", "closed", "full", "sold_out", "unavailable", "cancelled")
STALE_DAYS = 400


@dataclass(frozen=True)
class Fact:
    """A value the reference read before its first write, and the row it came from."""

    call: int
    tool: str
    args: Row
    table: str
    pk: str
    key: Scalar
    field: str
    value: Scalar
    observed: Row  # the object that showed it
    listed: int  # objects of the same table in that observation
    relied_on: bool  # a later call passes it or the answer states it (not only named by the instruction)


@dataclass(frozen=True)
class Option:
    id: str
    category: str
    operation: str
    summary: str
    mutation: Mutation  # description and requirement are the proposer's to write

    def line(self) -> str:
        return f"{self.id} [{self.category}] {self.summary}"


def facts(env: EnvironmentSpec, pair: PairSpec | Parent) -> list[Fact]:
    """The facts of the reference path, in call order, each (table, key, field) once."""
    task = pair.task
    _, outcome = reads_before_write(env, task.reference.calls)
    tables = [(t, {r[t.primary_key]: r for r in env.rows.get(t.name, ())}) for t in env.tables]
    found: dict[tuple, Fact] = {}
    for i, obs in enumerate(outcome.calls):
        if not obs.ok:
            continue
        used, named = _used_after(task, i), [task.instruction]
        found_objects = list(objects(obs.output))
        for obj in found_objects:
            for table, rows in tables:
                key = obj.get(table.primary_key)
                if isinstance(key, (dict, list)) or key not in rows:
                    continue
                row = rows[key]
                listed = sum(o.get(table.primary_key) in rows for o in found_objects if isinstance(o.get(table.primary_key), (str, int)))
                for field, value in obj.items():
                    column = table.column(field)
                    if column is None or column.type == "json" or isinstance(value, (dict, list)) or not equal(value, row.get(field)):
                        continue
                    if _used(value, used) or _used(value, named):
                        found.setdefault((table.name, key, field), Fact(i, obs.tool, dict(obs.args), table.name, table.primary_key, key,
                                                                         field, value, obj, listed, _used(value, used)))
    return list(found.values())


def _used_after(task, i: int) -> list[str]:
    """Texts in which a fact read by call `i` counts as relied on: later arguments and the answer."""
    return [str(s) for c in task.reference.calls[i + 1:] for s in scalars(c.args)] + [task.reference.answer]


def _used(value: Scalar, texts: list[str]) -> bool:
    if value is None or isinstance(value, bool) or value == "":
        return False
    if isinstance(value, (int, float)):  # 89.0 is stated as 89, 89.00 or 1,089 as 1089
        number = f"{value:g}" if isinstance(value, float) else str(value)
        pattern = rf"(?<![\w.,]){re.escape(number)}{'0*' if '.' in number else r'(?:[.]0+)?'}(?![\w]|[.,]\d)"
        return any(re.search(pattern, t.replace(",", "")) for t in texts)
    return any(re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", t, re.I) for t in texts)


def menu(env: EnvironmentSpec, pair: PairSpec | Parent) -> list[Option]:
    """Up to `MAX_OPTIONS` options whose derived mutations certify, the categories taking turns; computed once per process."""
    key = _key(env, pair)
    if key not in _menus:
        _menus[key] = _menu(env, pair)
    return list(_menus[key])


def remember(env: EnvironmentSpec, pair: PairSpec | Parent, options: list[Option]) -> None:
    """Keeps a menu computed elsewhere (in a sandboxed child, for generated tools) as this process's."""
    _menus[_key(env, pair)] = tuple(options)


def _key(env: EnvironmentSpec, pair: PairSpec | Parent) -> tuple:
    return env.hash, content_hash(pair.task.model_dump()), content_hash([op.model_dump() for op in pair.control])


_menus: dict[tuple, tuple[Option, ...]] = {}


def _menu(env: EnvironmentSpec, pair: PairSpec | Parent) -> tuple[Option, ...]:
    drafts: dict[str, list[Option]] = {}
    seen: set[str] = set()
    reads = reads_before_write(env, pair.task.reference.calls)[1].calls
    feasible = [o.text.casefold() for o in read_observations(env, pair.task)]
    for fact in facts(env, pair):
        for category, operation, summary, ops, patches, witness, extra in _derivations(env, pair, fact, reads):
            mutation = _mutation(env, pair, category, summary, ops, patches, witness, extra, feasible)
            signature = mutation and mutation.model_dump_json(include={"state", "tools", "witness"})
            if mutation is not None and signature not in seen:
                seen.add(signature)
                drafts.setdefault(category, []).append(Option("", category, operation, summary, mutation))
    # certification is the costly part: categories take turns, each draft certified until the menu is full
    chosen: list[Option] = []
    queues = [drafts[c] for c in sorted(drafts)]
    while queues and len(chosen) < MAX_OPTIONS:
        for queue in list(queues):
            while queue:
                option = queue.pop(0)
                trial = PairSpec(id="menu", split="train", environment=env.id, task=pair.task, mutation=option.mutation, control=pair.control)
                if certify(trial, env).passed:
                    chosen.append(option)
                    break
            if not queue:
                queues.remove(queue)
            if len(chosen) == MAX_OPTIONS:
                break
    return tuple(Option(f"O{i + 1}", o.category, o.operation, o.summary, o.mutation) for i, o in enumerate(chosen))


def _derivations(env: EnvironmentSpec, pair: PairSpec | Parent, f: Fact, reads: tuple[Observation, ...]):
    """(category, operation, summary, state ops, tool patches, witness, extra fields) for each fitting operation."""
    table = env.table(f.table)
    column = table.column(f.field)
    original = {f.pk: f.key, f.field: f.value} if f.field != f.pk else {f.pk: f.key}
    is_key = f.field == f.pk
    if is_key:
        yield from _duplicate(env, pair, table, f)
        yield from _take_option(env, pair, table, f)
    if not f.relied_on:  # a detail the instruction names identifies the entity; it is no evidence to take away
        return
    if is_key and not _referenced(env, table, f.key):
        yield ("missing_evidence", "delete_row", f"delete {f.table} row {f.key} (read by {f.tool})",
               (StateOp(op="delete", table=f.table, key=f.key),), (), (original,), {})
    if not is_key:
        if column.nullable:
            yield ("missing_evidence", "clear_field", f"empty {f.table}[{f.key}].{f.field} (was {_show(f.value)})",
                   (StateOp(op="set", table=f.table, key=f.key, fields={f.field: None}),), (), (original,), {})
        redacts = tuple(ToolPatch(op="redact", tool=t.name, where={f.pk: f.key}, fields=(f.field,),
                                  message=f"{f.field} is not on record for this entry.")
                        for t in tool_infos(env).values() if t.read_only)
        yield ("missing_evidence", "redact_field", f"hide {f.table}[{f.key}].{f.field} from every read tool (was {_show(f.value)})",
               (), redacts, (original,), {})
    yield ("broken_tool", "fail_tool", f"{f.tool} fails for {json.dumps(f.args, ensure_ascii=False)} (it showed {f.table}[{f.key}])",
           (), (ToolPatch(op="fail", tool=f.tool, when=f.args, error_code="upstream_unavailable",
                          message=f"{f.tool} is unavailable: the upstream system did not respond."),), (original,), {})
    if not is_key and isinstance(f.value, str) and _DATE.match(f.value):
        past = _shift(f.value, -STALE_DAYS)
        yield ("stale_record", "backdate", f"move {f.table}[{f.key}].{f.field} from {f.value} to {past}",
               (StateOp(op="set", table=f.table, key=f.key, fields={f.field: past}),), (), (original,), {})
    if not is_key and _STATUS.search(f.field) and (f.value is True or str(f.value).casefold() in _GRANTED):
        revoked = _status_value(env, table, f.field, f.value, _REVOKED, "revoked")
        if revoked is not None:
            yield ("authorization_revoked", "revoke", f"set {f.table}[{f.key}].{f.field} from {_show(f.value)} to {_show(revoked)}",
                   (StateOp(op="set", table=f.table, key=f.key, fields={f.field: revoked}),), (), (original,), {})
    if not is_key and isinstance(f.value, (int, float, str)) and not isinstance(f.value, bool) and (not isinstance(f.value, str) or _DATE.match(f.value)):
        yield from _contradict(env, table, f, reads)
    if not is_key and isinstance(f.value, str):
        yield from _widen(env, pair, table, f)


def _duplicate(env: EnvironmentSpec, pair: PairSpec | Parent, table: TableSpec, f: Fact):
    """A near-duplicate of an entity the instruction names: a second row matching the same identifying details."""
    named = {k: v for k, v in f.observed.items() if k != f.pk and isinstance(v, str) and table.column(k)
             and re.search(rf"(?<!\w){re.escape(v)}(?!\w)", pair.task.instruction, re.I)}
    if not named:
        return
    row = next(r for r in env.rows[f.table] if r[f.pk] == f.key)
    key = _new_key(env, table, f.key)
    pattern = {**named, f.pk: ANY}
    yield ("ambiguous_entity", "duplicate_entity", f"add {f.table} row {key}, a second entity matching {json.dumps(named, ensure_ascii=False)}",
           (StateOp(op="insert", table=f.table, row={**row, f.pk: key}),), (), (_unresolved(pattern),), {"candidates": pattern})


def _take_option(env: EnvironmentSpec, pair: PairSpec | Parent, table: TableSpec, f: Fact):
    """The option the reference chose among several, taken: the rest each miss a constraint."""
    writes = write_tools(env)
    chosen = any(c.tool in writes and any(equal(s, f.key) for s in scalars(c.args)) for c in pair.task.reference.calls[f.call + 1:])
    status = next((c for c in table.columns if _STATUS.search(c.name) and str(f.observed.get(c.name)).casefold() in _OPEN), None)
    if not chosen or f.listed < 2 or status is None:
        return
    current = f.observed[status.name]
    taken = _status_value(env, table, status.name, current, _TAKEN, "unavailable")
    if taken is None:
        return
    yield ("joint_constraints", "take_option", f"set {f.table}[{f.key}].{status.name} to {_show(taken)}: the option the request's constraints "
                                                f"single out among {f.listed} is gone",
           (StateOp(op="set", table=f.table, key=f.key, fields={status.name: taken}),), (), ({f.pk: f.key, status.name: current},), {})


def _contradict(env: EnvironmentSpec, table: TableSpec, f: Fact, reads: tuple[Observation, ...]):
    """A second record that disagrees on the fact: another table's observed record of the same entity (it carries
    the entity's key under the same name) with the same field and value, edited."""
    other_value = _different(f.value)
    for obs in reads:
        if not obs.ok:
            continue
        for obj in objects(obs.output):
            for other in env.tables:
                key = obj.get(other.primary_key)
                if other.name == f.table or isinstance(key, (dict, list)) or other.column(f.field) is None:
                    continue
                if not equal(obj.get(f.pk), f.key) or not equal(obj.get(f.field, object()), f.value):
                    continue
                if not any(r[other.primary_key] == key for r in env.rows.get(other.name, ())):
                    continue
                patterns = ({f.pk: f.key, f.field: f.value}, {f.pk: f.key, f.field: other_value})
                yield ("conflicting_records", "contradict",
                       f"set {other.name}[{key}].{f.field} to {_show(other_value)}, against {f.table}[{f.key}]'s {_show(f.value)}",
                       (StateOp(op="set", table=other.name, key=key, fields={f.field: other_value}),), (),
                       (_unresolved(patterns[1]),), {"conflict": patterns})
                return


def _widen(env: EnvironmentSpec, pair: PairSpec | Parent, table: TableSpec, f: Fact):
    """An earlier disclosure that shared one more category of data than it did: a category the column records
    elsewhere and the request itself does not share, so what went before and what the task shares add up to more."""
    if not _DISCLOSURE.search(f"{f.table} {f.field}") or not _SHARED.search(f.field) or not _CATEGORIES.match(f.value):
        return
    words = lambda text: {w.strip() for w in str(text).split(",") if w.strip()}
    shared = {w.casefold() for c in pair.task.reference.calls[f.call + 1:] for s in scalars(c.args) for w in words(s)}
    known = set().union(*(words(r.get(f.field)) for r in env.rows.get(f.table, ()) if isinstance(r.get(f.field), str)
                          and _CATEGORIES.match(r[f.field])))
    extra = sorted(w for w in known if w.casefold() not in shared and w not in words(f.value))
    if not extra:
        return
    widened = f"{f.value}{', ' if ', ' in f.value else ','}{extra[0]}"
    yield ("cumulative_privacy", "widen_disclosure", f"set {f.table}[{f.key}].{f.field} from {_show(f.value)} to {_show(widened)}: "
                                                     f"{extra[0]} was already shared",
           (StateOp(op="set", table=f.table, key=f.key, fields={f.field: widened}),), (), ({f.pk: f.key, f.field: f.value},), {})


def _unresolved(pattern: Row) -> Row:
    """The witness of an unresolvable category: a record saying which candidate holds, which neither side has;
    what these pairs prove is checked by `ambiguity` and `conflict`."""
    return {**pattern, "resolved_by": ANY}


def _mutation(env: EnvironmentSpec, pair: PairSpec | Parent, category: str, summary: str, ops, patches, witness, extra,
              feasible: list[str]) -> Mutation | None:
    """The mutation of one option, with its scope and evidence computed; None when nothing observable changes."""
    draft = Mutation(category=category, description=summary, requirement="", state=ops, tools=patches, scope=Scope(),
                     evidence=Evidence(tool="", contains=""), witness=witness, **extra)
    try:
        mutated = apply_mutation(env, draft).env
    except SpecError:
        return None
    rows: dict[str, list] = {}
    for op in ops:
        rows.setdefault(op.table, []).append(_op_key(env, op))
    evidence = _evidence(env, mutated, pair, ops, patches, feasible)
    if evidence is None:
        return None
    scope = Scope(rows={t: tuple(k) for t, k in rows.items()}, tools=tuple(dict.fromkeys(p.tool for p in patches)))
    return draft.model_copy(update={"scope": scope, "evidence": evidence})


def _evidence(env: EnvironmentSpec, mutated: EnvironmentSpec, pair: PairSpec | Parent, ops, patches, feasible: list[str]) -> Evidence | None:
    """A short text a reference read shows on the infeasible side and no feasible reference observation (`feasible`,
    case-folded) shows."""
    changed = {(op.table, _op_key(env, op)) for op in ops}
    for obs in reads_before_write(mutated, pair.task.reference.calls)[1].calls:
        for text in _fragments(obs, env, changed, ops, patches):
            if text.casefold() in obs.text.casefold() and not any(text.casefold() in f for f in feasible):
                return Evidence(tool=obs.tool, contains=text)
    return None


def _fragments(obs: Observation, env: EnvironmentSpec, changed: set, ops, patches):
    """Candidate evidence texts of one observation: the error it returns, or the changed fields of the changed rows."""
    if not obs.ok:
        yield obs.error_code or ""
        return
    fields = {k for op in ops for k in (op.fields if op.op == "set" else ())} | {f for p in patches for f in p.fields}
    for obj in objects(obs.output):
        for table in env.tables:
            key = obj.get(table.primary_key)
            if isinstance(key, (dict, list)):
                continue
            if (table.name, key) not in changed and not any(p.op == "redact" and obj.get(k) == v for p in patches for k, v in p.where.items()):
                continue
            if any(op.op == "insert" and (op.table, key) in changed for op in ops):
                yield _fragment(table.primary_key, key)
            for field in sorted(fields):
                if field in obj:
                    yield _fragment(field, obj[field])


def _fragment(field: str, value) -> str:
    return json.dumps({field: value}, ensure_ascii=False, default=str)[1:-1][:80]


def _op_key(env: EnvironmentSpec, op: StateOp) -> Scalar:
    """The primary key of the row an edit touches."""
    return op.row[env.table(op.table).primary_key] if op.op == "insert" else op.key


def _referenced(env: EnvironmentSpec, table: TableSpec, key: Scalar) -> bool:
    """Whether any row refers to this one (deleting it would leave a dangling reference)."""
    for other in env.tables:
        for column in other.columns:
            if column.references and column.references.split(".")[0] == table.name:
                if any(equal(r.get(column.name), key) for r in env.rows.get(other.name, ())):
                    return True
    return False


def _status_value(env: EnvironmentSpec, table: TableSpec, field: str, current: Scalar, words: tuple[str, ...], default: str) -> Scalar:
    """A value of the field that negates `current`: false for a flag; a word the column already uses, else `default`."""
    if isinstance(current, bool) or table.column(field).type == "boolean":
        return False if current else None
    used = {str(r.get(field)) for r in env.rows.get(table.name, ())}
    for word in words:
        for value in used:
            if value.casefold() == word and value.casefold() != str(current).casefold():
                return value
    return default if str(current).casefold() not in words else None


def _new_key(env: EnvironmentSpec, table: TableSpec, key: Scalar) -> Scalar:
    """An unused key shaped like `key`: its last number counted up."""
    used = {r[table.primary_key] for r in env.rows.get(table.name, ())}
    if isinstance(key, int):
        return max(k for k in used if isinstance(k, int)) + 1
    match = re.search(r"(\d+)(?!.*\d)", str(key))
    for n in range(1, 10_000):
        candidate = (str(key)[: match.start()] + str(int(match.group()) + n).zfill(len(match.group())) + str(key)[match.end():]
                     if match else f"{key}-{n + 1}")
        if candidate not in used:
            return candidate
    raise ValueError(f"no unused key near {key!r} in {table.name}")


def _shift(value: str, days: int) -> str:
    moved = dt.date.fromisoformat(value[:10]) + dt.timedelta(days=days)
    return moved.isoformat() + value[10:]


def _different(value: Scalar) -> Scalar:
    """A value that plainly disagrees with `value`, of the same type."""
    if isinstance(value, str):
        return _shift(value, 30)
    if isinstance(value, int):
        return value + max(1, round(abs(value) * 0.1))
    return round(value * 1.1 + 0.1, 2)


def _show(value: Scalar) -> str:
    return json.dumps(value, ensure_ascii=False)
