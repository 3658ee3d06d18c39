"""The environment builder: from a theme, a database of typed tables and
consistent rows (HERA §3.1 "Environment construction", App. B.1 "State
construction"); on a retry it gets back the problems of its last draft. A
table drafted with too few rows to grow from gets more in a second, narrow
call: the rows of that one table, each column typed by the grammar and each
reference limited to keys that exist; a column of names of things (titles,
products) gets a list of new names, which the growth uses one each."""

from __future__ import annotations

import json
from typing import Any, Literal

from langchain_core.messages import HumanMessage
from pydantic import Field, create_model

from prompts import render
from roles.models import chat_model
from state.construction import DatabaseDraft, TableDraft
from state.records import Record, UsageRecord

LETTERS = "ABCDEFGHIJKLMNOPRSTW"  # the initial letters of a round of new names: twenty that begin many words

_TYPES: dict[str, Any] = {"text": str, "integer": int, "real": float, "boolean": bool, "json": str}


async def build_database(theme: str, feedback: str, model: str, timeout_s: float = 1800.0) -> tuple[DatabaseDraft, UsageRecord]:
    prompt = render("environment_builder", theme=theme, feedback=feedback or "(first attempt)")
    return await chat_model(model, role="environment_builder", timeout_s=timeout_s).structured([HumanMessage(prompt)], DatabaseDraft)


def rows_schema(table: TableDraft, keys: dict[str, list], count: int) -> type[Record]:
    """Rows of `table`: every column of its type (fields aliased, so a column may be named like a model attribute),
    each reference one of the referenced table's keys."""
    fields: dict[str, Any] = {}
    for i, c in enumerate(table.columns):
        kind: Any = _TYPES[c.type]
        parent = (c.references or "").partition(".")[0]
        if keys.get(parent):
            kind = Literal[tuple(keys[parent])]  # type: ignore[valid-type]
        fields[f"c{i}"] = (kind | None if c.nullable else kind, Field(alias=c.name))
    row = create_model(f"{table.name.title().replace('_', '')}Row", __base__=Record, **fields)
    return create_model("MoreRows", __base__=Record, rows=(list[row], Field(min_length=1, max_length=count)))


async def more_rows(theme: str, table: TableDraft, keys: dict[str, list], count: int, model: str,
                    timeout_s: float = 1800.0) -> tuple[list[dict], UsageRecord]:
    """Up to `count` more rows for `table`, like the ones it has."""
    prompt = render("more_rows", theme=theme, table=table.name, primary_key=table.primary_key, count=str(count),
                    rows="\n".join(json.dumps(r, ensure_ascii=False) for r in table.rows))
    reply, usage = await chat_model(model, role="environment_builder", timeout_s=timeout_s).structured(
        [HumanMessage(prompt)], rows_schema(table, keys, count))
    return [r.model_dump(by_alias=True) for r in reply.rows], usage


async def more_names(theme: str, table: TableDraft, column: str, count: int, model: str,
                     timeout_s: float = 1800.0) -> tuple[list[str], list[UsageRecord]]:
    """About `count` new values for a column of names of things (titles, products), like the table's, asked in rounds
    of one name per initial letter (a grammar field each, the names so far shown as taken): asked for a list, a 1.5B
    builder repeated the eight famous titles it knew until the list was full."""
    examples = [str(r[column]) for r in table.rows if r.get(column) is not None]
    fields = {f"{column}_{letter.lower()}": (str, Field(pattern=f"^{letter}[A-Za-z0-9' ,.&:!?-]{{1,60}}$")) for letter in LETTERS}
    schema = create_model("Names", __base__=Record, **fields)
    names: list[str] = []
    usages = []
    for _ in range(-(-count // len(LETTERS))):
        taken = examples + names
        prompt = render("more_names", theme=theme, table=table.name, column=column, examples="\n".join(f"- {e}" for e in taken))
        reply, usage = await chat_model(model, role="environment_builder", timeout_s=timeout_s).structured([HumanMessage(prompt)], schema)
        usages.append(usage)
        names += [v.strip() for v in reply.model_dump().values() if v.strip() and v.strip().casefold() not in {t.casefold() for t in taken}]
    return list(dict.fromkeys(names)), usages
