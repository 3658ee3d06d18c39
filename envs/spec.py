"""Load and validate environment directories and pair files.

An environment directory holds `environment.yaml` (id, theme, description,
tables with typed columns), `rows/<table>.json` (initial rows), `tools.py`
(the tool functions) and optionally `policy.md`. Pair files live in its
`pairs/` folder. Every problem is reported as a `SpecError` naming the file,
the field and what was expected.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Literal

import jsonschema
import yaml
from pydantic import Field, ValidationError, create_model

from envs.errors import SpecError
from envs.match import ANY
from envs.untrusted import describe
from state.paths import ID, ID_RULE
from state.records import Column, EnvironmentSpec, PairSpec, StateOp, TableSpec, ToolInfo, content_hash, lone_surrogate


class _Loader(yaml.SafeLoader):
    """YAML without implicit timestamps ('2026-08-01' stays a string) and without aliases: nine nested aliases of
    nine items each load at once as shared lists, and then hang whatever walks them (validation, hashing) on 9^9
    leaves. No environment, pair or bundle needs one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"found an alias (*{event.anchor}), which these files do not take",
                                              event.start_mark)
        return super().compose_node(parent, index)


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def read_text(path: Path) -> str:
    """A file of an environment, pair or bundle as text; one that is not UTF-8 is an error that names it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(path, "(encoding)", f"UTF-8 text (byte {exc.start} is not)") from None


def read_json(path: Path) -> Any:
    """A JSON file as data; one that does not parse, or nests too deep to, is an error that names it."""
    text = read_text(path)
    try:
        return _unicode_only(path, text, json.loads(text))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SpecError(path, "(syntax)", f"valid JSON ({exc})") from None


def read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise SpecError(path, "(file)", "a YAML file; it does not exist")
    text = read_text(path)
    try:
        return _unicode_only(path, text, yaml.load(text, Loader=_Loader))
    except (yaml.YAMLError, RecursionError) as exc:
        raise SpecError(path, "(syntax)", f"valid YAML ({exc})") from None


def _unicode_only(path: Path, text: str, value: Any) -> Any:
    """`value`, unless an escape in `text` made a lone surrogate of it, which no UTF-8 record, request or log can hold."""
    if (around := lone_surrogate(text, value)) is not None:
        raise SpecError(path, "(syntax)", f"text that is Unicode (an escape makes a lone surrogate, in {around!r})")
    return value


def validation_error(path: Path, exc: ValidationError) -> SpecError:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "(root)"
    return SpecError(path, field, f"{err['msg']} (got {err.get('input')!r:.80})")


_PY_TYPES = {"text": str, "integer": int, "real": (int, float), "boolean": bool, "json": object}


def files_signature(path: Path | str, links: bool = True) -> tuple:
    """What changes when any file under `path` changes: names, sizes, mtimes (one stat a file; `__pycache__` is not
    walked into). Every episode's pair and bundle are checked against it, so it stays cheap. Without `links`, a
    symbolic link under `path` is an error naming it."""
    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return ((path.name, stat.st_size, stat.st_mtime_ns),)
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if not links and (linked := next((n for n in dirs + files if os.path.islink(os.path.join(root, n))), None)):
            raise SpecError(Path(root, linked), "(file)", "a file or folder of its own, not a symbolic link (one could "
                                                          "reach what the sandbox hides)")
        for name in files:
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError as exc:  # a link to nothing, say
                raise SpecError(Path(root, name), "(file)", f"a readable file ({exc.strerror})") from None
            found.append((os.path.relpath(os.path.join(root, name), path), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def load_environment(directory: Path | str) -> EnvironmentSpec:
    """The validated environment of a directory, reloaded only when a file under it changes."""
    directory = Path(directory).resolve()
    return _load_environment(directory, files_signature(directory))


def load_database(directory: Path | str) -> tuple[dict, tuple[TableSpec, ...], dict[str, tuple[dict, ...]]]:
    """`environment.yaml`'s fields, its tables and their validated rows with
    every reference resolved; runs no code from the directory."""
    directory = Path(directory)
    path = directory / "environment.yaml"
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise SpecError(path, "(root)", "a mapping with id, theme, description, tables")
    for key in ("id", "theme", "description", "tables"):
        if key not in raw:
            raise SpecError(path, key, "a required field; it is missing")
    if not isinstance(raw["tables"], dict) or not raw["tables"]:
        raise SpecError(path, "tables", "a non-empty mapping of table name to {primary_key, columns}")
    tables = tuple(_table(path, name, body) for name, body in raw["tables"].items())
    rows = {t.name: _rows(directory / "rows" / f"{t.name}.json", t) for t in tables}
    _check_references(directory, tables, rows)
    return raw, tables, rows


@lru_cache(maxsize=32)
def _load_environment(directory: Path, signature: tuple) -> EnvironmentSpec:
    raw, tables, rows = load_database(directory)
    tools_path = directory / "tools.py"
    if not tools_path.is_file():
        raise SpecError(tools_path, "(file)", "a Python module of tool functions; it does not exist")
    policy_path = directory / "policy.md"
    spec = EnvironmentSpec(
        id=str(raw["id"]),
        theme=str(raw["theme"]),
        description=str(raw["description"]).strip(),
        tables=tables,
        rows=rows,
        tools_source=read_text(tools_path),
        policy=read_text(policy_path).strip() if policy_path.is_file() else "",
    )
    tool_infos(spec, origin=tools_path)
    return spec


# A table's or column's name: what a reference (`-> table.column`) can name, and a rows file's; SQLite keeps sqlite_*
NAME = re.compile(r"(?!sqlite_)\w+", re.IGNORECASE)
NAME_RULE = "letters, digits and '_', not starting with 'sqlite_'"


def _table(path: Path, name: str, body: Any) -> TableSpec:
    where = f"tables.{name}"
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise SpecError(path, where, f"a table name of {NAME_RULE} (got {name!r})")
    if not isinstance(body, dict) or not isinstance(body.get("columns"), dict):
        raise SpecError(path, f"{where}.columns", "a mapping of column name to type")
    columns = []
    for col, decl in body["columns"].items():
        if not isinstance(col, str) or not NAME.fullmatch(col):
            raise SpecError(path, f"{where}.columns.{col}", f"a column name of {NAME_RULE} (got {col!r})")
        match = re.fullmatch(r"(text|integer|real|boolean|json)(\?)?(?:\s*->\s*(\w+\.\w+))?", str(decl).strip())
        if not match:
            raise SpecError(
                path, f"{where}.columns.{col}", f"text|integer|real|boolean|json, '?' if nullable, '-> table.column' for a reference (got {decl!r})"
            )
        columns.append(Column(name=col, type=match[1], nullable=bool(match[2]), references=match[3]))
    pk = body.get("primary_key")
    if pk not in body["columns"]:
        raise SpecError(path, f"{where}.primary_key", f"one of the columns {list(body['columns'])} (got {pk!r})")
    return TableSpec(name=name, primary_key=pk, columns=tuple(columns))


def _rows(path: Path, table: TableSpec) -> tuple[dict, ...]:
    if not path.is_file():
        raise SpecError(path, "(file)", f"a JSON list of {table.name} rows; it does not exist")
    rows = read_json(path)
    if not isinstance(rows, list):
        raise SpecError(path, "(root)", "a JSON list of row objects")
    seen = set()
    for i, row in enumerate(rows):
        check_row(path, f"[{i}]", table, row)
        key = row[table.primary_key]
        if key in seen:
            raise SpecError(path, f"[{i}].{table.primary_key}", f"a unique primary key (duplicate {key!r})")
        seen.add(key)
    return tuple(rows)


def check_row(path: Path | str, where: str, table: TableSpec, row: Any) -> None:
    if not isinstance(row, dict):
        raise SpecError(path, where, f"an object with columns {[c.name for c in table.columns]}")
    names = {c.name for c in table.columns}
    for extra in set(row) - names:
        raise SpecError(path, f"{where}.{extra}", f"a column of {table.name} ({sorted(names)}); it is not")
    for col in table.columns:
        if col.name not in row:
            raise SpecError(path, f"{where}.{col.name}", f"a value of type {col.type}; it is missing")
        value = row[col.name]
        if value is None:
            if not col.nullable:
                raise SpecError(path, f"{where}.{col.name}", f"{col.type}, not null (declare '{col.type}?' to allow null)")
            continue
        ok = isinstance(value, _PY_TYPES[col.type]) and not (col.type not in ("boolean", "json") and isinstance(value, bool))
        if col.type == "json" and not _is_json(value):
            raise SpecError(path, f"{where}.{col.name}", f"a JSON value (got {value!r:.80})")
        if not ok:
            raise SpecError(path, f"{where}.{col.name}", f"a {col.type} (got {value!r})")


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _check_references(directory: Path, tables: tuple[TableSpec, ...], rows: dict) -> None:
    by_name = {t.name: t for t in tables}
    for table in tables:
        for col in table.columns:
            if not col.references:
                continue
            target, target_col = col.references.split(".")
            path = directory / "environment.yaml"
            if target not in by_name or by_name[target].column(target_col) is None:
                raise SpecError(path, f"tables.{table.name}.columns.{col.name}", f"a reference to an existing table.column (got {col.references})")
            known = {r[target_col] for r in rows[target]}
            for i, row in enumerate(rows[table.name]):
                if row[col.name] is not None and row[col.name] not in known:
                    raise SpecError(
                        directory / "rows" / f"{table.name}.json",
                        f"[{i}].{col.name}",
                        f"a value present in {col.references} (got {row[col.name]!r})",
                    )


@dataclass(frozen=True)
class Tool:
    info: ToolInfo
    fn: Callable
    params: type  # pydantic model validating the arguments

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def read_only(self) -> bool:
        return self.info.read_only


_ALLOWED = (str, int, float, bool)


def _annotation_ok(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp in _ALLOWED:
        return True
    if origin is Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return all(a is type(None) or _annotation_ok(a) for a in typing.get_args(tp))
    if origin is list:
        return all(_annotation_ok(a) for a in typing.get_args(tp))
    return False


def _arg_docs(doc: str) -> dict[str, str]:
    match = re.search(r"^\s*Args:\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if not match:
        return {}
    found = re.findall(r"^\s*(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", match[1], re.M)
    return {name: text.strip() for name, text in found}


def _summary(doc: str) -> str:
    return re.split(r"^\s*Args:\s*$", doc, flags=re.M)[0].strip()


ROOT = Path(__file__).resolve().parent.parent
_inside_sandbox = False


def shipped(source: str) -> bool:
    """Whether tools code is the project's own (an environment of its catalog or
    test fixtures), run in process. Any other code (a custom catalog's, a
    generated one's) runs only in the sandbox (`envs.untrusted`)."""
    return _inside_sandbox or _shipped_source(source)


@lru_cache(maxsize=128)
def _shipped_source(source: str) -> bool:
    return content_hash(source) in _shipped()


@lru_cache(maxsize=1)
def _shipped() -> frozenset[str]:
    return frozenset(content_hash(p.read_text()) for top in (ROOT / "envs" / "catalog", ROOT / "tests" / "fixtures")
                     for p in top.rglob("tools.py"))


def run_untrusted_here() -> None:
    """Called by a sandboxed child only: the tools code it is given runs in it."""
    global _inside_sandbox
    _inside_sandbox = True


def write_tools(spec: EnvironmentSpec) -> set[str]:
    """Names of the environment's state-changing tools."""
    return {name for name, info in tool_infos(spec).items() if not info.read_only}


def tool_infos(spec: EnvironmentSpec, origin: Path | str | None = None) -> dict[str, ToolInfo]:
    """The public faces of the environment's tools; code that is not the
    project's own is read by running it in the sandbox, never here."""
    origin = str(origin or f"<tools of {spec.id}>")
    if shipped(spec.tools_source):
        return {name: t.info for name, t in _compile_tools(spec.tools_source, origin).items()}
    return describe(spec.tools_source, origin)


def load_tools(spec: EnvironmentSpec, origin: Path | str | None = None) -> dict[str, Tool]:
    """The environment's tool functions, compiled in this process: the project's own code only."""
    if not shipped(spec.tools_source):
        raise PermissionError(f"{origin or spec.id}: tools code that is not the project's own runs only in the sandbox")
    return _compile_tools(spec.tools_source, str(origin or f"<tools of {spec.id}>"))


@lru_cache(maxsize=64)
def _compile_tools(source: str, origin: str) -> dict[str, Tool]:
    module = types.ModuleType(f"hera_tools_{content_hash(source)}")
    module.__file__ = origin
    try:
        exec(compile(source, origin, "exec"), module.__dict__)
    except Exception as exc:  # a broken tools module is a spec error, reported by file
        raise SpecError(origin, "(module)", f"an importable Python module ({type(exc).__name__}: {exc})") from None
    tools: dict[str, Tool] = {}
    for name, fn in vars(module).items():
        kind = getattr(fn, "__hera_tool__", None)
        if kind is None or name.startswith("_"):
            continue
        tools[name] = _tool(origin, name, fn, kind == "read")
    if not tools:
        raise SpecError(origin, "(module)", "at least one function decorated with @read_tool or @write_tool")
    return tools


def _tool(origin: str, name: str, fn: Callable, read_only: bool) -> Tool:
    doc = inspect.getdoc(fn) or ""
    if not _summary(doc):
        raise SpecError(origin, f"{name}.__doc__", "a docstring describing the tool to the agent")
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        # called, it would hand back a coroutine or a generator: every call an internal_error
        raise SpecError(origin, f"{name}(...)", "a plain function that returns its result (not async def, not a generator)")
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].name != "db":
        raise SpecError(origin, f"{name}(...)", "'db' as the first parameter (the episode database)")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # an annotation naming what the module does not define
        raise SpecError(origin, f"{name}(...)", f"type annotations that resolve ({type(exc).__name__}: {exc})") from None
    docs = _arg_docs(doc)
    fields: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise SpecError(origin, f"{name}({p.name})", "a named parameter, not *args or **kwargs")
        tp = hints.get(p.name)
        if tp is None or not _annotation_ok(tp):
            raise SpecError(origin, f"{name}({p.name})", "a type annotation of str, int, float, bool, Literal, list or Optional of those")
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (tp, Field(default, description=docs.get(p.name)))
    model = create_model(f"{name}_args", __config__={"extra": "forbid"}, **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    info = ToolInfo(name=name, description=_summary(doc), input_schema=schema, read_only=read_only)
    return Tool(info=info, fn=fn, params=model)


_pairs: dict[tuple, PairSpec] = {}


def load_pair(path: Path | str, env: EnvironmentSpec) -> PairSpec:
    """The validated pair file, reloaded only when it or its environment changes."""
    path = Path(path).resolve()
    key = (path, files_signature(path), env.hash)
    if key not in _pairs:
        _pairs[key] = _load_pair(path, env)
    return _pairs[key]


def _load_pair(path: Path, env: EnvironmentSpec) -> PairSpec:
    raw = read_yaml(path)
    if isinstance(raw, dict):
        raw.setdefault("environment", env.id)
        if isinstance(raw.get("task"), dict):
            raw["task"].setdefault("id", raw.get("id"))
    try:
        pair = PairSpec.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(path, exc) from None
    check_pair(path, pair, env)
    return pair


def _args_problem(env: EnvironmentSpec, tool: ToolInfo, args: dict) -> tuple[str, str] | None:
    """(where, what) of the first argument a tool would refuse, or None."""
    if shipped(env.tools_source):
        try:
            load_tools(env)[tool.name].params.model_validate(args)
        except ValidationError as exc:
            err = exc.errors()[0]
            return ".".join(map(str, err["loc"])), err["msg"]
        return None
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(tool.input_schema).iter_errors(args))
    return (".".join(map(str, error.absolute_path)) or "(arguments)", error.message) if error else None


def check_pair(path: Path, pair: PairSpec, env: EnvironmentSpec) -> None:
    """A pair names only tools, tables and columns of its environment; raises SpecError naming the field."""
    if pair.id != path.stem:
        raise SpecError(path, "id", f"{path.stem!r}, the file's name (got {pair.id!r})")
    if not ID.fullmatch(pair.id):  # a file's name, yet no id `hera eval --pairs` or a graph could name
        raise SpecError(path, "id", f"{ID_RULE} (got {pair.id!r})")
    if pair.environment != env.id:
        raise SpecError(path, "environment", f"{env.id!r}, the environment of this folder (got {pair.environment!r})")
    tools = tool_infos(env)
    tables = {t.name: t for t in env.tables}

    def tool(field: str, name: str) -> None:
        if name not in tools:
            raise SpecError(path, field, f"one of the tools {sorted(tools)} (got {name!r})")

    task, mut = pair.task, pair.mutation
    for i, call in enumerate(task.reference.calls):
        tool(f"task.reference.calls.{i}.tool", call.tool)
        if problem := _args_problem(env, tools[call.tool], call.args):
            raise SpecError(path, f"task.reference.calls.{i}.args.{problem[0]}", problem[1])
    for field, patterns in (("task.forbidden", task.forbidden), ("task.commit", task.commit or ())):
        for i, pattern in enumerate(patterns):
            tool(f"{field}.{i}.tool", pattern.tool)
    for i, check in enumerate(task.state):
        if check.table not in tables:
            raise SpecError(path, f"task.state.{i}.table", f"one of the tables {sorted(tables)} (got {check.table!r})")
    if not task.answer and not task.state:
        raise SpecError(path, "task", "at least one answer or state check")
    for i, check in enumerate(task.answer):
        if check.value is None and not check.any_of:
            raise SpecError(path, f"task.answer.{i}", "a value or any_of alternatives")
    for field, ops in (("mutation.state", mut.state), ("control", pair.control)):
        for i, op in enumerate(ops):
            _check_op(path, f"{field}.{i}", op, tables)
    for i, patch in enumerate(mut.tools):
        tool(f"mutation.tools.{i}.tool", patch.tool)
    tool("mutation.evidence.tool", mut.evidence.tool)
    for table in mut.scope.rows:
        if table not in tables:
            raise SpecError(path, f"mutation.scope.rows.{table}", f"one of the tables {sorted(tables)}")
    for name in mut.scope.tools:
        tool("mutation.scope.tools", name)
    if not mut.witness or not all(mut.witness):
        raise SpecError(path, "mutation.witness", "a list of non-empty object patterns, each establishing the broken requirement")
    stars = [k for k, v in (mut.candidates or {}).items() if v == ANY]
    if mut.category == "ambiguous_entity" and not (stars and len(stars) < len(mut.candidates)):
        raise SpecError(path, "mutation.candidates", 'an object pattern of the identifying details with "*" on the keys that tell entities apart')
    if mut.category == "conflicting_records" and (len(mut.conflict) < 2 or not all(mut.conflict)):
        raise SpecError(path, "mutation.conflict", "two or more object patterns, the conflicting observations")


def _check_op(path: Path, where: str, op: StateOp, tables: dict[str, TableSpec]) -> None:
    if op.table not in tables:
        raise SpecError(path, f"{where}.table", f"one of the tables {sorted(tables)} (got {op.table!r})")
    table = tables[op.table]
    if op.op == "insert":
        if op.row is None:
            raise SpecError(path, f"{where}.row", "the full row to insert")
        check_row(path, f"{where}.row", table, op.row)
        return
    if op.key is None:
        raise SpecError(path, f"{where}.key", f"the {table.primary_key} of the row to {op.op}")
    for name in op.fields:
        if table.column(name) is None:
            raise SpecError(path, f"{where}.fields.{name}", f"a column of {table.name}")
