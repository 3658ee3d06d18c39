"""The deterministic parts of building an environment from a theme (HERA §3.1,
App. B.1–B.2): write a model's database and tools module as an environment
directory, check the tools against the database, pre-check proposed tasks,
and test a task's verifier on a replay and on perturbed outcomes.

`tool_problems` and `check_task` run the directory's tool code: call them
only inside the sandbox (`harness.tool_sandbox`). Everything else reads
files and records and runs no generated code.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import signal
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

from envs.answers import contains_text, cut, spans, states
from envs.certify import perturbations, replay
from envs.match import ANY
from envs.runtime import EnvInstance, diff_rows, initial_rows
from envs.spec import SpecError, Tool, load_database, load_environment, load_tools
from envs.verify import Outcome, verify
from state.construction import ColumnDraft, DatabaseDraft, InvalidCall, TaskCheck, TaskDraft, TaskSeed, ToolDeclaration, ToolsDraft
from state.records import AnswerCheck, EnvironmentSpec, ReferenceSolution, RowChange, TableSpec, TaskSpec, ToolCall, ToolInfo

DECLARATIONS = "tools.checks.json"
PUBLIC_FILES = ("environment.yaml", "rows", "tools.py", "policy.md")
CALL_TIMEOUT_S = 5.0
MIN_CHECKS = 2
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_GIVEAWAYS = ("infeasible", "abstain", "impossible")
_SECRET = re.compile(r"(^|_)(password|passwd|pwd|secret|token|api_?key|ssn|pin|cvv|card_number|credit_card)(_|$)")


def database_problems(draft: DatabaseDraft) -> list[str]:
    """What is wrong with a drafted database before any file is written: names
    (they become file names and SQL identifiers), duplicates, empty tables."""
    problems = []
    if not _ID.fullmatch(draft.id):
        problems.append(f"id: a kebab-case id like 'city-library' (got {draft.id!r})")
    if not draft.tables:
        problems.append("tables: at least one table")
    seen: set[str] = set()
    for table in draft.tables:
        if not _NAME.fullmatch(table.name):
            problems.append(f"tables.{table.name}: a lower_snake_case name")
        if table.name in seen:
            problems.append(f"tables.{table.name}: declared twice")
        seen.add(table.name)
        names = [c.name for c in table.columns]
        for name in names:
            if not _NAME.fullmatch(name):
                problems.append(f"tables.{table.name}.columns.{name}: a lower_snake_case name")
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"tables.{table.name}.columns.{name}: declared twice")
        for c in table.columns:
            if _SECRET.search(c.name):
                problems.append(f"tables.{table.name}.columns.{c.name}: an environment holds no secrets (passwords, tokens, "
                                "card numbers); drop the column")
            if c.references == f"{table.name}.{c.name}":
                problems.append(f"tables.{table.name}.columns.{c.name}: refers to itself; a reference names another column")
    if draft.tables and not any(t.rows for t in draft.tables):
        problems.append("tables: every table is empty; give the main tables their rows")
    return problems


def coerce_rows(draft: DatabaseDraft) -> tuple[DatabaseDraft, list[str]]:
    """The draft with each value that has the wrong type but one reading in its column's type converted (2 in a text
    column: "2"; "12" in an integer column: 12; 3 in a real column: 3.0; "true" in a boolean column: true), with a
    note per column; anything else is left to the loader's checks."""
    notes, tables = [], []
    for t in draft.tables:
        rows, fixed = [], set()
        for row in t.rows:
            row = dict(row)
            for c in t.columns:
                value, converted = row.get(c.name), _converted(c.type, row.get(c.name))
                if converted is not value:
                    row[c.name] = converted
                    fixed.add(c.name)
            rows.append(row)
        notes += [f"tables.{t.name}.columns.{name}: values of another type converted" for name in sorted(fixed)]
        tables.append(t.model_copy(update={"rows": rows}))
    return draft.model_copy(update={"tables": tables}), notes


def _converted(kind: str, value):
    if value is None:
        return value
    if kind == "text" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if kind == "integer" and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    if kind == "real" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "real" and isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        return float(value)
    if kind == "boolean" and isinstance(value, str) and value.strip().casefold() in ("true", "false"):
        return value.strip().casefold() == "true"
    if kind == "boolean" and value in (0, 1) and not isinstance(value, bool):
        return bool(value)
    return value


def allow_missing(draft: DatabaseDraft) -> tuple[DatabaseDraft, list[str]]:
    """The draft with each column that some rows leave without a value made nullable (a loan not yet returned has no
    return date, which a small model leaves out rather than writing null); keys stay required. A note for each."""
    notes, tables = [], []
    for t in draft.tables:
        columns = []
        for c in t.columns:
            missing = sum(r.get(c.name) is None for r in t.rows)
            if missing and not c.nullable and c.name != t.primary_key:
                c = c.model_copy(update={"nullable": True})
                notes.append(f"tables.{t.name}.columns.{c.name}: no value in {missing} of {len(t.rows)} rows; made nullable")
            columns.append(c)
        tables.append(t.model_copy(update={"columns": columns}))
    return draft.model_copy(update={"tables": tables}), notes


def add_missing_keys(draft: DatabaseDraft) -> tuple[DatabaseDraft, list[str]]:
    """The draft with each primary key that names no column of its table added as its first column (a small model
    declares `customer_id` and leaves it out of the columns): of the rows' own values when each row has a distinct
    one, else counting from 1; a note for each."""
    notes, tables = [], []
    for t in draft.tables:
        if any(c.name == t.primary_key for c in t.columns):
            tables.append(t)
            continue
        values = [r.get(t.primary_key) for r in t.rows]
        own = all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in values) and len(set(values)) == len(values)
        kind = "text" if own and not all(isinstance(v, int) for v in values) else "integer"
        rows = t.rows if own else [{**r, t.primary_key: i + 1} for i, r in enumerate(t.rows)]
        notes.append(f"tables.{t.name}.primary_key: {t.primary_key!r} named no column; added as a column of type {kind}"
                     + ("" if own else ", the rows numbered from 1"))
        tables.append(t.model_copy(update={"columns": [ColumnDraft(name=t.primary_key, type=kind), *t.columns], "rows": rows}))
    return draft.model_copy(update={"tables": tables}), notes


def drop_loose_references(draft: DatabaseDraft) -> tuple[DatabaseDraft, list[str]]:
    """The draft without the references that name no column of its tables (a small model writes a status's values
    there), and a note for each; a reference that names a column is left to the loader's checks."""
    columns = {f"{t.name}.{c.name}" for t in draft.tables for c in t.columns}
    notes, tables = [], []
    for t in draft.tables:
        kept = []
        for c in t.columns:
            if c.references is not None and c.references not in columns:
                notes.append(f"tables.{t.name}.columns.{c.name}: reference {c.references!r} names no column; dropped")
                c = c.model_copy(update={"references": None})
            kept.append(c)
        tables.append(t.model_copy(update={"columns": kept}))
    return draft.model_copy(update={"tables": tables}), notes


def add_implied_references(draft: DatabaseDraft) -> tuple[DatabaseDraft, list[str]]:
    """The draft with a reference added where a column without one is named and typed as another table's primary
    key and every value it holds is a key of that table (a small model writes `rentals.user_id` and declares no
    reference to `users`, so rows would grow with users that do not exist); a note for each."""
    keyed = {}
    for t in draft.tables:
        keyed.setdefault(t.primary_key, []).append(t)
    notes, tables = [], []
    for t in draft.tables:
        columns = []
        for c in t.columns:
            target = keyed.get(c.name, [])
            if c.references is None and c.name != t.primary_key and len(target) == 1 and target[0].name != t.name:
                other = target[0]
                keys = {r.get(other.primary_key) for r in other.rows}
                kind = next((k.type for k in other.columns if k.name == other.primary_key), None)
                if kind == c.type and other.rows and all(r.get(c.name) in keys for r in t.rows if r.get(c.name) is not None):
                    c = c.model_copy(update={"references": f"{other.name}.{other.primary_key}"})
                    notes.append(f"tables.{t.name}.columns.{c.name}: refers to {c.references} (named and typed as its key; "
                                 "every value is one)")
            columns.append(c)
        tables.append(t.model_copy(update={"columns": columns}))
    return draft.model_copy(update={"tables": tables}), notes


def _column(c) -> str:
    return f"{c.type}{'?' if c.nullable else ''}" + (f" -> {c.references}" if c.references else "")


def write_database(draft: DatabaseDraft, directory: Path, theme: str) -> list[str]:
    """Writes `environment.yaml`, `rows/` and `policy.md` for the draft and
    loads them back with the spec loader (types, primary keys, references);
    the problems found, empty when the database is valid."""
    problems = database_problems(draft)
    if problems:
        return problems
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(directory / "rows", ignore_errors=True)
    (directory / "rows").mkdir()
    spec = {"id": draft.id, "theme": theme, "description": draft.description,
            "tables": {t.name: {"primary_key": t.primary_key, "columns": {c.name: _column(c) for c in t.columns}} for t in draft.tables}}
    (directory / "environment.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    for table in draft.tables:
        (directory / "rows" / f"{table.name}.json").write_text(json.dumps(table.rows, indent=1, ensure_ascii=False))
    policy = directory / "policy.md"
    policy.unlink(missing_ok=True)
    if draft.policy.strip():
        policy.write_text(draft.policy.strip() + "\n")
    try:
        load_database(directory)
    except SpecError as exc:
        return [str(exc).replace(f"{directory}/", "")]
    return []


def describe_database(directory: Path, rows_shown: int = 5) -> str:
    """The database as a prompt shows it: description, tables with typed
    columns and references, a few rows each."""
    raw, tables, rows = load_database(directory)
    lines = [f"Environment: {str(raw['description']).strip()}", "", "Tables:"]
    for t in tables:
        columns = ", ".join(f"{c.name}: {c.type}{'?' if c.nullable else ''}" + (f" -> {c.references}" if c.references else "")
                            for c in t.columns)
        lines.append(f"- {t.name} (primary key {t.primary_key}; {len(rows[t.name])} rows): {columns}")
        lines += [f"    {json.dumps(r, ensure_ascii=False)}" for r in rows[t.name][:rows_shown]]
    policy = directory / "policy.md"
    if policy.is_file():
        lines += ["", "Policy:", policy.read_text().strip()]
    return "\n".join(lines)


def _singular(name: str) -> str:
    for plural, single in (("ies", "y"), ("ches", "ch"), ("shes", "sh"), ("sses", "ss"), ("xes", "x"), ("s", "")):
        if name.endswith(plural) and len(name) > len(plural) + 1:
            return name[: -len(plural)] + single
    return f"{name}_record"


def starting_module(directory: Path) -> tuple[str, list[ToolDeclaration]]:
    """A tools module that runs, for the tool coder to start from: for each table with rows a search by words and a
    lookup by key, with their declarations (calls on the table's first row, and one that finds nothing)."""
    _, tables, rows = load_database(directory)
    code, declared = ["from envs.toolkit import ToolError, find, one, read_tool, write_tool", ""], []
    for t in tables:
        if not rows[t.name]:
            continue
        pk, first = t.primary_key, rows[t.name][0]
        key_type = "int" if t.column(pk).type == "integer" else "str"
        text = next((c.name for c in t.columns if c.type == "text" and c.name != pk and isinstance(first.get(c.name), str)), pk)
        word = next(iter(re.findall(r"[A-Za-z]{3,}", str(first.get(text)))), str(first[pk]))
        search, get = f"search_{t.name}", f"get_{_singular(t.name)}"
        code += [
            "", "@read_tool", f"def {search}(db, query: str) -> list[dict]:",
            f'    """The {t.name} whose fields contain every word of `query` (case-insensitive); at most 10.', "",
            "    Args:", f"        query: Words to look for, such as part of a {text.replace('_', ' ')}.", '    """',
            "    words = query.casefold().split()",
            f'    found = [r for r in find(db, "{t.name}") if all(w in " ".join(str(v) for v in r.values()).casefold() for w in words)]',
            "    if not found:", f'        raise ToolError("not_found", f"No {t.name} match {{query!r}}.")', "    return found[:10]",
            "", "", "@read_tool", f"def {get}(db, {pk}: {key_type}) -> dict:",
            f'    """One of the {t.name} by its {pk.replace("_", " ")}.', "", "    Args:", f"        {pk}: The {pk.replace('_', ' ')}.", '    """',
            f'    return one(db, "{t.name}", {pk}={pk})', ""]
        row_schema = {"type": "object", "required": [pk]}
        declared += [
            ToolDeclaration(name=search, read_only=True, returns={"type": "array", "items": row_schema}, valid=[{"query": word}],
                            invalid=[InvalidCall(args={"query": "zzqx nothing matches"}, error_code="not_found")]),
            ToolDeclaration(name=get, read_only=True, returns=row_schema, valid=[{pk: first[pk]}],
                            invalid=[InvalidCall(args={pk: -1 if key_type == "int" else "NO-SUCH-KEY"}, error_code="not_found")])]
    return "\n".join(code).rstrip() + "\n", declared


def example_write_tool(directory: Path) -> tuple[str, ToolDeclaration]:
    """A state-changing tool over this database, for the tool coder to follow: an insert into the table tools would add
    to (an empty one, else one that refers to others), checking that the rows it refers to exist; and its declaration
    (a call with the first row's values, and one it refuses: a reference to no row, else an argument of another type)."""
    _, tables, rows = load_database(directory)
    refers = lambda t: [c for c in t.columns if c.references and c.references.split(".")[0] != t.name]  # noqa: E731
    table = min(tables, key=lambda t: (bool(rows[t.name]), not refers(t)))
    pk, kind = table.primary_key, {"text": "str", "integer": "int", "real": "float", "boolean": "bool", "json": "str"}
    params = sorted((c for c in table.columns if c.name != pk), key=lambda c: c.nullable)  # optional arguments last
    signature = ", ".join(f"{c.name}: {kind[c.type]}" + (" | None = None" if c.nullable else "") for c in params)
    args = [f"        {c.name}: The {c.name.replace('_', ' ')}" + (f" (see {c.references.split('.')[0]})." if c.references else ".") for c in params]
    checks = [f'    one(db, "{c.references.split(".")[0]}", {c.references.split(".")[1]}={c.name})' for c in refers(table)]
    if table.column(pk).type == "integer":
        key = [f'    {pk} = max([r["{pk}"] for r in find(db, "{table.name}")], default=0) + 1']
    else:
        sample = str(rows[table.name][0][pk]) if rows[table.name] else f"{table.name[:3].upper()}-0001"
        head = re.sub(r"\d+$", "", sample) or f"{table.name[:3].upper()}-"
        width = max(len(sample) - len(head), 4)
        key = [f'    taken = {{r["{pk}"] for r in find(db, "{table.name}")}}', "    n = len(taken) + 1",
               f'    while f"{head}{{n:0{width}d}}" in taken:', "        n += 1", f'    {pk} = f"{head}{{n:0{width}d}}"']
    values = ", ".join(f'"{c.name}": {c.name}' for c in table.columns)
    name = f"add_{_singular(table.name)}"
    code = "\n".join(["@write_tool", f"def {name}(db, {signature}) -> dict:",
                      f'    """Records a new {_singular(table.name).replace("_", " ")}.', "", "    Args:", *args, '    """', *checks, *key,
                      f'    db["{table.name}"].insert({{{values}}})', f'    return {{"{pk}": {pk}}}'])
    first = rows[table.name][0] if rows[table.name] else {}
    by_name = {t.name: t for t in tables}
    valid = {}
    for c in params:
        parent, _, column = (c.references or "").partition(".")
        referenced = rows.get(parent) if parent in by_name else None
        valid[c.name] = referenced[0][column] if referenced else first.get(c.name, {"text": "example", "integer": 1, "real": 1.0,
                                                                                     "boolean": True, "json": "{}"}[c.type])
    if refers(table):
        c = refers(table)[0]
        refused = InvalidCall(args={**valid, c.name: -1 if c.type == "integer" else "NO-SUCH-KEY"}, error_code="not_found")
    else:
        c = params[0]
        refused = InvalidCall(args={**valid, c.name: 12345 if c.type == "text" else "not a value"}, error_code="invalid_arguments")
    declaration = ToolDeclaration(name=name, read_only=False, returns={"type": "object", "required": [pk]}, valid=[valid],
                                  invalid=[refused] if params else [], changes=[table.name])
    return code, declaration


def tool_functions(code: str) -> dict[str, str]:
    """The module's functions decorated as tools, each as its syntax tree's dump (empty when the code does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return {}
    return {f.name: ast.dump(f) for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id in ("read_tool", "write_tool") for d in f.decorator_list)}


def without_tools(draft: ToolsDraft, names: set[str]) -> ToolsDraft:
    """The module and declarations without the tool functions `names` (their decorators with them); helpers they
    used stay, unused. Nothing is removed from code that does not parse."""
    try:
        tree = ast.parse(draft.code)
    except SyntaxError:
        return draft
    lines, cut_out = draft.code.splitlines(keepends=True), set()
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name in names:
            start = min([f.lineno, *(d.lineno for d in f.decorator_list)])
            cut_out.update(range(start - 1, f.end_lineno))
    code = "".join(line for i, line in enumerate(lines) if i not in cut_out)
    return ToolsDraft(code=re.sub(r"\n{4,}", "\n\n\n", code), tools=[d for d in draft.tools if d.name not in names])


def module_code(reply: str) -> str:
    """The Python module in a reply: its first fenced block (```python preferred), else the whole reply."""
    blocks = re.findall(r"```[ \t]*(\w*)[^\n]*\n(.*?)```", reply, re.S)
    chosen = next((b for lang, b in blocks if lang.lower() in ("python", "py")), blocks[0][1] if blocks else reply)
    return chosen.strip() + "\n"


def write_tools_module(draft: ToolsDraft, directory: Path) -> None:
    """Writes `tools.py` and the tools' declarations next to it."""
    (directory / "tools.py").write_text(draft.code.rstrip() + "\n")
    (directory / DECLARATIONS).write_text(json.dumps([d.model_dump(mode="json") for d in draft.tools], indent=1))


def read_tools_module(directory: Path) -> ToolsDraft:
    """The tools module and declarations `write_tools_module` wrote (read as text; the code is not run)."""
    declared = json.loads((directory / DECLARATIONS).read_text())
    return ToolsDraft(code=(directory / "tools.py").read_text(), tools=[ToolDeclaration.model_validate(d) for d in declared])


def stage_public(directory: Path, workdir: Path) -> Path:
    """A copy of the environment's public files (no tasks, no construction log) under `workdir`."""
    copy = workdir / "env"
    copy.mkdir()
    for name in PUBLIC_FILES:
        source = directory / name
        if source.is_dir():
            shutil.copytree(source, copy / name)
        elif source.is_file():
            shutil.copy(source, copy / name)
    declarations = directory / DECLARATIONS
    if declarations.is_file():
        shutil.copy(declarations, copy / DECLARATIONS)
    return copy


class CallTimeout(BaseException):
    """A tool call ran past CALL_TIMEOUT_S. A BaseException, so the runtime's
    guard cannot mistake it for the tool's own failure."""


@dataclass(frozen=True)
class CallRun:
    """One call on a fresh instance: its observation (None when the call escaped
    the runtime), the escaping exception, what it left changed and the tables it read."""

    observation: Any
    escaped: str
    changes: tuple[RowChange, ...]
    read: frozenset[str] = frozenset()


def _timeout(signum, frame):
    raise CallTimeout(f"did not finish within {CALL_TIMEOUT_S:g}s")


def run_call(env: EnvironmentSpec, name: str, args: dict[str, Any]) -> CallRun:
    """Runs one tool call on a fresh instance and compares the state before and after."""
    instance = EnvInstance(env)
    timed = threading.current_thread() is threading.main_thread()
    read: set[str] = set()

    def watch(action: int, table: str | None, *_: Any) -> int:
        if action == sqlite3.SQLITE_READ and table:
            read.add(table)
        return sqlite3.SQLITE_OK

    try:
        before = instance.rows()
        if getattr(instance, "conn", None) is not None:  # a local instance (in the sandboxed child)
            instance.conn.set_authorizer(watch)
        if timed:
            previous = signal.signal(signal.SIGALRM, _timeout)
            signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT_S)
        try:
            observation, escaped = instance.call(name, args), ""
        except BaseException as exc:  # whatever gets past the runtime's guard is what this check reports
            observation, escaped = None, f"{type(exc).__name__}: {exc}"
        finally:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            if getattr(instance, "conn", None) is not None:
                instance.conn.set_authorizer(None)
        return CallRun(observation, escaped, diff_rows(env, before, instance.rows()).changes, frozenset(read))
    finally:
        instance.close()


def _shown(changes: tuple[RowChange, ...]) -> str:
    return ", ".join(f"{c.table}[{c.key}]" for c in changes)


def tool_problems(directory: Path | str) -> tuple[list[str], list[ToolInfo], list[str]]:
    """Loads the environment and runs every declared call of every tool (run it
    only in the sandbox); the problems found, the tools' public faces, and the
    names of the tools with a problem of their own."""
    directory = Path(directory)
    try:
        env = load_environment(directory)
    except SpecError as exc:  # one function of tools.py the loader refuses (`name(kwargs)`, `name.__doc__`) is that tool's fault
        own = re.match(r"(\w+)[.(]", exc.field) if exc.path.endswith("tools.py") else None
        return [str(exc).replace(f"{directory}/", "")], [], [own.group(1)] if own else []
    tools = load_tools(env)
    try:
        declared = [ToolDeclaration.model_validate(d) for d in json.loads((directory / DECLARATIONS).read_text())]
    except (OSError, ValueError) as exc:  # a pydantic ValidationError is a ValueError
        return [f"tool declarations: {exc}"], [], []
    by_name = {d.name: d for d in declared}
    failing = sorted(tools.keys() ^ by_name.keys())
    problems = [f"{n}: defined in tools.py but not declared" for n in sorted(tools.keys() - by_name.keys())]
    problems += [f"{n}: declared, but tools.py has no function {n} decorated with @read_tool or @write_tool"
                 for n in sorted(by_name.keys() - tools.keys())]
    used: dict[str, set[str]] = {"read": set(), "changed": set()}
    for name, tool in tools.items():
        if name in by_name and (found := _declared_problems(env, tool, by_name[name], used)):
            problems += found
            failing.append(name)
    for table in env.tables:  # only what a declared call was seen to do counts: a table no tool reads is dead weight
        if env.rows.get(table.name) and table.name not in used["read"]:
            problems.append(f"table {table.name}: no declared call of any tool reads it; add a tool that looks it up, or drop the table")
        elif not env.rows.get(table.name) and table.name not in used["read"] | used["changed"]:
            problems.append(f"table {table.name}: empty, and no declared call of any tool reads or writes it")
    return problems, [t.info for t in tools.values()], failing


def _declared_problems(env: EnvironmentSpec, tool: Tool, decl: ToolDeclaration, used: dict[str, set[str]]) -> list[str]:
    name, out = tool.name, []
    if decl.read_only != tool.read_only:
        out.append(f"{name}: declared {'read-only' if decl.read_only else 'state-changing'} but decorated with "
                   f"@{'read' if tool.read_only else 'write'}_tool")
    validator = None
    if not decl.returns:
        out.append(f"{name}: `returns` is empty; declare the result's type and fields")
    else:
        try:
            Draft202012Validator.check_schema(decl.returns)
            validator = Draft202012Validator(decl.returns)
        except SchemaError as exc:
            out.append(f"{name}: `returns` is not a JSON Schema: {exc.message}")
    if not decl.valid:
        out.append(f"{name}: no valid call declared")
    if tool.params.model_fields and not decl.invalid:
        out.append(f"{name}: no invalid call declared")
    tables = {t.name for t in env.tables}
    out += [f"{name}: `changes` names {t!r}, which is not a table" for t in decl.changes if t not in tables]
    if decl.read_only and decl.changes:
        out.append(f"{name}: a read-only tool cannot change {sorted(decl.changes)}")
    for args in decl.valid:
        run = run_call(env, name, args)
        call, obs = f"{name}({json.dumps(args, ensure_ascii=False)})", run.observation
        if run.escaped or not obs.ok:
            out += _failure_problems(call, run)
            if obs is not None and obs.error_code != "internal_error":
                out.append(f"{call}: declared valid but refused with {obs.error_code}: {obs.message}")
            continue
        if validator is not None and (error := best_match(validator.iter_errors(obs.output))) is not None:
            at = "/".join(map(str, error.absolute_path)) or "the result"
            out.append(f"{call}: the result does not match `returns` at {at}: {error.message}")
        changed = {c.table for c in run.changes}
        used["read"] |= run.read
        used["changed"] |= changed
        if tool.read_only and run.changes:
            out.append(f"{call}: a read-only tool changed the state: {_shown(run.changes)}")
        elif not tool.read_only and changed != set(decl.changes):
            out.append(f"{call}: changed {sorted(changed) or 'nothing'}, declared {sorted(decl.changes) or 'nothing'}")
    for bad in decl.invalid:
        run = run_call(env, name, bad.args)
        call, obs = f"{name}({json.dumps(bad.args, ensure_ascii=False)})", run.observation
        if obs is not None and obs.ok:
            out.append(f"{call}: declared invalid ({bad.error_code}) but succeeded")
            continue
        out += _failure_problems(call, run)
        if obs is not None and obs.error_code not in ("internal_error", bad.error_code):
            out.append(f"{call}: refused with {obs.error_code}, declared {bad.error_code}: {obs.message}")
    return out


def _failure_problems(call: str, run: CallRun) -> list[str]:
    """A failed call must have failed cleanly: refused, not crashed, nothing written."""
    out = []
    if run.escaped:
        out.append(f"{call}: escaped the runtime with {run.escaped}")
    elif run.observation.error_code == "internal_error":
        out.append(f"{call}: crashed: {run.observation.message}")
    if run.changes:
        out.append(f"{call}: a failed call left a partial write: {_shown(run.changes)}")
    return out


def task_problems(draft: TaskDraft, tables: tuple[TableSpec, ...], rows: dict[str, tuple[dict, ...]], tools: list[ToolInfo]) -> list[str]:
    """What makes a proposed task unusable before anyone solves it: rules naming
    tables, columns or tools that do not exist, too few checks, an instruction
    that gives an answer away or names no record of the database."""
    where, out = f"task {draft.id}", []
    if not _names_a_record(draft.instruction, rows):
        out.append(f"{where}: the instruction names no record of the database; name the one the user means (a name, a title "
                   "or an id from the rows shown), as a user would")
    if not _ID.fullmatch(draft.id):
        out.append(f"{where}: id must be kebab-case")
    by_name = {t.name: t for t in tables}
    for i, check in enumerate(draft.state):
        table = by_name.get(check.table)
        if table is None:
            out.append(f"{where}: state.{i}.table {check.table!r} is not a table ({sorted(by_name)})")
            continue
        if not check.match:
            out.append(f"{where}: state.{i}.match is empty")
        out += [f"{where}: state.{i}.match.{col} is not a column of {table.name}" for col in check.match if table.column(col) is None]
    out += [f"{where}: allowed_writes names {t!r}, not a table" for t in draft.allowed_writes or () if t not in by_name]
    names = {t.name for t in tools}
    out += [f"{where}: forbidden names {p.tool!r}, not a tool" for p in draft.forbidden if p.tool not in names]
    if draft.state and all(t.read_only for t in tools):
        out.append(f"{where}: has state checks but the environment has no state-changing tool")
    for i, check in enumerate(draft.answer):
        if check.value is None and not check.any_of:
            out.append(f"{where}: answer.{i} ({check.name}) has no value or any_of")
        elif check.value not in (None, ANY) and states(draft.instruction, AnswerCheck(name=check.name, value=check.value, tolerance=check.tolerance)):
            out.append(f"{where}: the instruction states the answer value {check.name}={check.value!r}")
    if len(draft.answer) + len(draft.state) < MIN_CHECKS:
        out.append(f"{where}: {len(draft.answer) + len(draft.state)} check(s); at least {MIN_CHECKS} answer or state checks")
    out += [f"{where}: the instruction says {w!r}" for w in _GIVEAWAYS if w in draft.instruction.casefold()]
    return out


def request_problems(instruction: str, seed: TaskSeed) -> list[str]:
    """What a request written for a seed lacks or gives away: each record named as its user knows it (by its key when
    it has no name), each detail the call takes, and never a value the user asks to be told."""
    out = []
    for n in seed.named:
        if n.label and not contains_text(instruction, n.label):
            out.append(f"the request does not name {n.label!r}; name it exactly so")
        elif not n.label and not states(instruction, AnswerCheck(name=n.arg, value=n.key)):
            out.append(f"the request does not give the {n.arg.replace('_', ' ')} {n.key}")
    out += [f"the request does not give the {k.replace('_', ' ')} {v}" for k, v in seed.details.items()
            if not states(instruction, AnswerCheck(name=k, value=v))]
    out += [f"the request gives away the {c.name.replace('_', ' ')} ({c.value}); ask for it instead" for c in seed.answer if states(instruction, c)]
    return out


def seed_task_id(seed: TaskSeed) -> str:
    """A kebab-case id for a seed's task: its tool and the records it names."""
    subjects = " ".join(n.label or f"{n.table} {n.key}" for n in seed.named)
    return re.sub(r"[^a-z0-9]+", "-", f"{seed.tool} {subjects}".casefold()).strip("-")[:63].rstrip("-")


def with_details(instruction: str, seed: TaskSeed) -> tuple[str, list[str]]:
    """The request with each detail it leaves out (a date, a quantity, a record named by its key) added as a sentence
    of its own, and what was added."""
    missing = {k: v for k, v in seed.details.items() if not states(instruction, AnswerCheck(name=k, value=v))}
    missing |= {n.arg: n.key for n in seed.named if not n.label and not states(instruction, AnswerCheck(name=n.arg, value=n.key))}
    added = [f"The {k.replace('_', ' ')} is {v}." for k, v in missing.items()]
    return " ".join([instruction.strip(), *added]), added


def _names_a_record(instruction: str, rows: dict[str, tuple[dict, ...]]) -> bool:
    """Whether the instruction names a value of some row (a name, a title, an id: "Ada Park", "BK-1", 103) as a
    whole word; a request about "a specific customer" names none, and no solver can tell which one it means."""
    text = instruction.casefold()
    for table in rows.values():
        for row in table:
            for value in row.values():
                if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and len(value.strip()) < 3):
                    continue
                word = str(value).casefold().strip()
                if word in text and re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text):
                    return True
    return False


def tidy_task(draft: TaskDraft) -> tuple[TaskDraft, list[str]]:
    """The draft with its id made kebab-case and the answer checks its own instruction states dropped (a value the
    request names, such as the id of the record it is about, checks nothing); and what was changed."""
    stated = [c for c in draft.answer if c.value not in (None, ANY) and states(draft.instruction, c)]
    task_id = re.sub(r"[^a-z0-9]+", "-", draft.id.casefold()).strip("-") or draft.id
    notes = [f"answer check {c.name}={c.value!r} dropped: the instruction states it" for c in stated]
    return draft.model_copy(update={"id": task_id, "answer": [c for c in draft.answer if c not in stated]}), notes


def task_spec(draft: TaskDraft, calls: tuple[ToolCall, ...] = (), answer: str = "") -> TaskSpec:
    """The task in the pair file's `task` format, with a reference solution."""
    return TaskSpec(id=draft.id, instruction=draft.instruction, answer=tuple(draft.answer), state=tuple(draft.state),
                    allowed_writes=tuple(draft.allowed_writes) if draft.allowed_writes is not None else None,
                    forbidden=tuple(draft.forbidden), forbidden_values=tuple(draft.forbidden_values),
                    reference=ReferenceSolution(calls=calls, answer=answer))


def task_perturbations(env: EnvironmentSpec, task: TaskSpec) -> list[tuple[str, Outcome]]:
    """Certification's wrong and incomplete outcomes (a value dropped or off,
    the writes left out, an empty answer), plus a text value swapped for
    another record's and an extra change to a table the task may not write."""
    cases = perturbations(env, task)
    ref = task.reference
    full = replay(env, ref.calls, ref.answer)
    for check in task.answer:
        found = spans(ref.answer, check)
        other = _confusable(env, check) if isinstance(check.value, str) and check.value != ANY else None
        if found and other is not None:
            cases.append((f"answer with another {check.name} ({other})", _with(full, answer=cut(ref.answer, found, other))))
    allowed = set(task.allowed_writes if task.allowed_writes is not None else (c.table for c in task.state))
    for table in env.tables:
        if table.name not in allowed and full.final_rows.get(table.name):
            cases.append((f"an extra change to {table.name}", _extra_change(env, full, table)))
            break
    return cases


def _with(outcome: Outcome, **update: Any) -> Outcome:
    return Outcome(**{"answer": outcome.answer, "calls": outcome.calls, "final_rows": outcome.final_rows, "diff": outcome.diff, **update})


def _confusable(env: EnvironmentSpec, check: AnswerCheck) -> str | None:
    """Another value of the column that holds the checked value: the answer a
    solver gets when it picks the wrong record."""
    for table in env.tables:
        for col in (c.name for c in table.columns if c.type == "text"):
            values = [r[col] for r in env.rows.get(table.name, ()) if isinstance(r[col], str)]
            if not any(v.casefold() == str(check.value).casefold() for v in values):
                continue
            for v in values:
                if not states(v, check) and re.search(r"\w", v):
                    return v
    return None


def _extra_change(env: EnvironmentSpec, outcome: Outcome, table: TableSpec) -> Outcome:
    """The outcome with one more row of `table` changed (or, for a table of keys only, deleted)."""
    rows = {name: list(r) for name, r in outcome.final_rows.items()}
    col = next((c for c in table.columns if c.name != table.primary_key), None)
    if col is None:
        rows[table.name] = rows[table.name][1:]
    else:
        row = dict(rows[table.name][0])
        value = row[col.name]
        if col.type == "boolean":
            row[col.name] = not value
        elif col.type in ("integer", "real"):
            row[col.name] = (value or 0) + 1
        else:
            row[col.name] = f"{value or ''} (changed)"
        rows[table.name][0] = row
    return _with(outcome, final_rows=rows, diff=diff_rows(env, initial_rows(env), rows))


def check_task(env: EnvironmentSpec, task: TaskSpec) -> TaskCheck:
    """Replays the task's reference from the initial state and runs the
    verifier on it and on every perturbed outcome (run it only in the sandbox)."""
    outcome = replay(env, task.reference.calls, task.reference.answer)
    failures = [f"call {i + 1} {o.tool} failed: {o.error_code}: {o.message}" for i, o in enumerate(outcome.calls) if not o.ok]
    failures += verify(task, outcome).failures
    cases = [(name, verify(task, perturbed)) for name, perturbed in task_perturbations(env, task)]
    return TaskCheck(observations=tuple(outcome.calls), failures=tuple(failures),
                     accepted_perturbations=tuple(name for name, v in cases if v.passed),
                     rejected_perturbations=tuple(name for name, v in cases if not v.passed))


def public_context(directory: Path) -> str:
    """What a user of the environment is told: its description and policy (as an episode's context)."""
    raw, _, _ = load_database(directory)
    policy = directory / "policy.md"
    parts = [str(raw["description"]).strip()] + (["Policy:\n" + policy.read_text().strip()] if policy.is_file() else [])
    return "\n\n".join(parts)
