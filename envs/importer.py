"""Bring your own environment: turn a tool-use suite laid out as a JSON
database of entity collections (`db.json`), tasks with reference tool calls
(`tasks.json`) and OpenAI-style function schemas (`tools.json`) into a catalog
environment directory: tables from collections, nested objects flattened or
made child tables, references where every value is another table's key, a
`tools.py` skeleton to fill, and one feasible task per suite task under
`tasks/`, ready for mutation. Runs no code from the suite.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.spec import SpecError, read_json
from state.records import AnswerCheck, ReferenceSolution, TaskSpec, ToolCall

READ_PREFIXES = ("get", "list", "find", "search", "lookup", "look", "check", "calculate", "compute", "show", "view", "read", "think")
_PY = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


@dataclass
class ImportReport:
    env_id: str
    tables: dict[str, int] = field(default_factory=dict)  # rows per table
    references: list[str] = field(default_factory=list)  # "table.column -> table.column"
    tools: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the import could not carry over


def import_suite(src: Path | str, out: Path | str, env_id: str | None = None, description: str | None = None) -> ImportReport:
    """Writes the catalog environment of the suite at `src` to `out` (`environment.yaml`, `rows/`, `tools.py`, `tasks/`)."""
    src, out = Path(src), Path(out)
    env_id = env_id or _kebab(src.name)
    db, tasks, tools = _read(src / "db.json", dict), _read(src / "tasks.json", list), _read(src / "tools.json", list)
    report = ImportReport(env_id=env_id)
    tables: dict[str, dict] = {}
    for name, collection in db.items():
        _collection(src / "db.json", _snake(name), collection, tables, report)
    _detect_references(tables, report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows").mkdir(exist_ok=True)
    spec = {
        "id": env_id,
        "theme": env_id,
        "description": description or f"Imported from the suite {src.name}: {', '.join(tables)}.",
        "tables": {name: {"primary_key": t["pk"], "columns": _declarations(t)} for name, t in tables.items()},
    }
    (out / "environment.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    for name, t in tables.items():
        rows = [{c: _typed(row.get(c), kind) for c, kind in _types(t).items()} for row in t["rows"]]
        (out / "rows" / f"{name}.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False))
        report.tables[name] = len(rows)
    schemas = [_function(src / "tools.json", i, s) for i, s in enumerate(tools)]
    (out / "tools.py").write_text(tools_skeleton(env_id, schemas))
    report.tools = [s["name"] for s in schemas]
    (out / "tasks").mkdir(exist_ok=True)
    for i, raw in enumerate(tasks):
        task = _task(src / "tasks.json", i, raw, env_id)
        text = yaml.safe_dump(task.model_dump(mode="json", exclude_defaults=True), sort_keys=False, allow_unicode=True)
        (out / "tasks" / f"{task.id}.yaml").write_text(text)
        report.tasks.append(task.id)
        if not task.answer:
            report.notes.append(f"task {task.id}: no outputs, so no answer checks; add state checks once the tools run")
    return report


def _read(path: Path, kind: type) -> Any:
    if not path.is_file():
        raise SpecError(path, "(file)", "a JSON file of the suite; it does not exist")
    value = read_json(path)
    if not isinstance(value, kind):
        raise SpecError(path, "(root)", f"a JSON {'object of collections' if kind is dict else 'list'}")
    return value


def _collection(path: Path, name: str, collection: Any, tables: dict, report: ImportReport,
                parent: tuple[str, str] | None = None) -> None:
    """Adds the table `name` from a mapping of key to object (or a list of objects); `parent` is (table, key) of
    the row a child collection belongs to."""
    if isinstance(collection, dict):
        items = list(collection.items())
    elif isinstance(collection, list):
        items = [(None, obj) for obj in collection]
    else:
        raise SpecError(path, name, "a collection: an object of key to record, or a list of records")
    table = tables.setdefault(name, {"pk": None, "rows": [], "parent": None, "refs": {}})
    for i, (key, obj) in enumerate(items):
        if not isinstance(obj, dict):
            raise SpecError(path, f"{name}.{key if key is not None else i}", "a record (a JSON object)")
        row: dict[str, Any] = {}
        children: list[tuple[str, Any]] = []
        _flatten(obj, "", row, children)
        if table["pk"] is None:
            table["pk"] = _primary_key(key, obj, name)
        pk = table["pk"]
        if pk not in row:
            row[pk] = key if key is not None else (f"{parent[1]}/{i}" if parent else str(i + 1))
        if parent:
            parent_table, parent_key = parent
            column = f"{parent_table}_{tables[parent_table]['pk']}"
            row[column] = parent_key
            table["parent"] = (column, parent_table)
        table["rows"].append(row)
        for child, value in children:
            _collection(path, f"{name}_{child}", value, tables, report, parent=(name, str(row[pk])))


def _flatten(obj: dict, prefix: str, row: dict, children: list) -> None:
    """Scalars become columns; objects of scalars are flattened (`address_city`); mappings of records and
    lists of records become child tables; lists of scalars are kept as JSON text."""
    for key, value in obj.items():
        col = prefix + _snake(key)
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            children.append((col, value))
        elif isinstance(value, dict):
            _flatten(value, col + "_", row, children)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            children.append((col, value))
        elif isinstance(value, list):
            row[col] = json.dumps(value, ensure_ascii=False)
        else:
            row[col] = value


def _primary_key(key: str | None, obj: dict, table: str) -> str:
    for name, value in obj.items():
        if key is not None and value == key and not isinstance(value, (dict, list)):
            return _snake(name)  # the record repeats its own key
    return next(c for c in ("id", f"{table}_id", f"{table}_key") if _snake(c) not in {_snake(k) for k in obj})


def _types(table: dict) -> dict[str, str]:
    columns: dict[str, set[str]] = {}
    for row in table["rows"]:
        for c in row:
            columns.setdefault(c, set())
    for row in table["rows"]:
        for c, seen in columns.items():
            v = row.get(c)
            seen.add("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                           else "real" if isinstance(v, float) else "text")
    kinds = {}
    for c, seen in columns.items():
        found = seen - {"null"}
        kind = next(iter(found)) if len(found) == 1 else "real" if found == {"integer", "real"} else "text"
        kinds[c] = kind + ("?" if "null" in seen or not found else "")
    return kinds


def _declarations(table: dict) -> dict[str, str]:
    return {c: kind + (f" -> {table['refs'][c]}" if c in table["refs"] else "") for c, kind in _types(table).items()}


def _typed(value: Any, kind: str) -> Any:
    if value is None:
        return None
    base = kind.rstrip("?")
    if base == "text" and not isinstance(value, str):
        return json.dumps(value) if isinstance(value, bool) else str(value)
    if base == "real":
        return float(value)
    return value


def _detect_references(tables: dict, report: ImportReport) -> None:
    """A column refers to another table when each of its values is that table's key (a child's parent column always)."""
    keys = {name: {str(r[t["pk"]]) for r in t["rows"]} for name, t in tables.items()}
    for name, t in tables.items():
        if t["parent"]:
            column, parent = t["parent"]
            t["refs"][column] = f"{parent}.{tables[parent]['pk']}"
        for column, kind in _types(t).items():
            if column == t["pk"] or column in t["refs"] or not kind.startswith("text"):
                continue
            values = {r[column] for r in t["rows"] if r.get(column) is not None}
            targets = [other for other in tables if other != name and values and values <= keys[other]]
            if len(targets) == 1:
                t["refs"][column] = f"{targets[0]}.{tables[targets[0]]['pk']}"
        report.references += [f"{name}.{c} -> {target}" for c, target in t["refs"].items()]


def _function(path: Path, i: int, schema: Any) -> dict:
    fn = schema.get("function", schema) if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", fn["name"]):
        raise SpecError(path, f"[{i}]", "an OpenAI-style function schema with a lower_snake_case name")
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(params.get("properties", {}), dict):
        raise SpecError(path, f"[{i}].parameters.properties", "an object of parameter schemas")
    for name in params.get("properties", {}):
        if not name.isidentifier() or keyword.iskeyword(name) or name == "db":
            raise SpecError(path, f"[{i}].parameters.properties.{name}", "a parameter name that is a Python identifier (not a keyword, not 'db')")
    return {"name": fn["name"], "description": str(fn.get("description") or fn["name"].replace("_", " ")).strip(),
            "properties": params.get("properties", {}), "required": list(params.get("required", []))}


def _annotation(schema: dict) -> str:
    if "enum" in schema:
        return f"Literal[{', '.join(repr(v) for v in schema['enum'])}]"
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_annotation(schema.get('items') or {'type': 'string'})}]"
    return _PY.get(kind, "str")  # an object or an untyped value arrives as JSON text


def tools_skeleton(env_id: str, schemas: list[dict]) -> str:
    """A `tools.py` with one function per schema: typed parameters, the schema's descriptions as docstring and
    `Args:`, `@read_tool` for names that read (get_, list_, search_ …) and `@write_tool` otherwise; each body
    raises NotImplementedError until a person or the tool coder writes it."""
    lines = [f'"""Tools of {env_id}, imported from a suite\'s function schemas: write each body (rows are in `db`;',
             'see envs/catalog/README.md), and check each @read_tool / @write_tool guess."""', "",
             "from __future__ import annotations", "", "from typing import Literal, Optional", "",
             "from envs.toolkit import ToolError, find, one, read_tool, write_tool", ""]
    for s in schemas:
        params = []
        for name, p in s["properties"].items():
            annotation = _annotation(p if isinstance(p, dict) else {})
            params.append(f"{name}: {annotation}" if name in s["required"] else f"{name}: Optional[{annotation}] = None")
        required = [p for p in params if "=" not in p]
        optional = [p for p in params if "=" in p]
        kind = "read_tool" if s["name"].split("_")[0] in READ_PREFIXES else "write_tool"
        lines += ["", f"@{kind}", f"def {s['name']}({', '.join(['db', *required, *optional])}):"]
        description = "\n    ".join(s["description"].replace('"""', "'''").splitlines())
        args = [f"        {n}: {' '.join(str((p or {}).get('description') or n.replace('_', ' ')).split())}"
                for n, p in s["properties"].items()]
        lines += [f'    """{description}', *(["", "    Args:", *args] if args else []), '    """',
                  f"    raise NotImplementedError({s['name']!r})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _task(path: Path, i: int, raw: Any, env_id: str) -> TaskSpec:
    if not isinstance(raw, dict) or not isinstance(raw.get("instruction"), str) or not isinstance(raw.get("actions"), list):
        raise SpecError(path, f"[{i}]", "a task with an instruction and a list of actions ({name, arguments})")
    calls = []
    for j, action in enumerate(raw["actions"]):
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            raise SpecError(path, f"[{i}].actions[{j}]", "an action {name, arguments}")
        calls.append(ToolCall(tool=action["name"], args=action.get("arguments") or action.get("kwargs") or {}))
    outputs = [str(o) for o in raw.get("outputs") or []]
    task_id = _kebab(f"{env_id}-{raw.get('id', raw.get('user_id', i))}")
    return TaskSpec(
        id=task_id,
        instruction=raw["instruction"].strip(),
        answer=tuple(AnswerCheck(name=f"output_{k + 1}", value=o) for k, o in enumerate(outputs)),
        reference=ReferenceSolution(calls=tuple(calls), answer="; ".join(outputs) or "Done."),
    )


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", str(name)).lower()).strip("_") or "field"


def _kebab(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-") or "imported"
