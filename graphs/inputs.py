"""A graph's input as its `<Graph>Input` schema reads it. LangGraph checks nothing of a TypedDict's input, and Studio,
the dev server's API and `graph.ainvoke` hand over whatever JSON they were given: each graph's entry reads its input
through `checked`, which goes on with the typed values (a diagnosis given as JSON becomes a `Diagnosis`) or stops with
a `ConfigError` naming every field that is wrong before anything runs. The constraints below are part of the schemas,
so Studio's input form shows them too."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any

from pydantic import Field, StringConstraints, TypeAdapter, ValidationError

from state.context import ConfigError
from state.paths import ID_PATTERN, ID_RULE, MAX_ID
from state.records import unicode_text

Id = Annotated[str, StringConstraints(pattern=f"^{ID_PATTERN}$")]  # a pair's: its file's name
Ids = Annotated[list[Id], Field(min_length=1)]
RunId = Annotated[str, StringConstraints(pattern=f"^{ID_PATTERN}$", max_length=MAX_ID)]
Name = Annotated[str, StringConstraints(min_length=1)]
AtLeastOne = Annotated[int, Field(ge=1)]
AtLeastZero = Annotated[int, Field(ge=0)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]
Level = Annotated[float, Field(gt=0.0, le=1.0)]  # a test's level


def checked(schema: type, state: Mapping[str, Any], graph: str) -> dict[str, Any]:
    """The keys of `schema` in `state`, validated and typed."""
    keys = schema.__required_keys__ | schema.__optional_keys__
    given = {k: state[k] for k in keys if k in state}
    if bad := [k for k, v in given.items() if unicode_text(v) is not v]:  # JSON's "\ud83d" alone: no record can hold it
        raise ConfigError(f"{graph} input: " + "; ".join(f"{k}: text that is not Unicode (half of a character)" for k in bad))
    try:
        return _adapter(schema).validate_python(given)
    except ValidationError as exc:
        raise ConfigError(f"{graph} input: " + "; ".join(_problem(e) for e in exc.errors())) from None


@lru_cache(maxsize=None)
def _adapter(schema: type) -> TypeAdapter:
    return TypeAdapter(schema)


def _problem(error: dict) -> str:
    where = ".".join(map(str, error["loc"])) or "(input)"
    if error["type"] == "missing":
        return f"{where}: required"
    got = repr(error["input"])
    what = f"Input should be {ID_RULE}" if error["type"] == "string_pattern_mismatch" else error["msg"]  # the one pattern: `Id`'s
    return f"{where}: {what} (got {got if len(got) <= 60 else got[:59] + '…'})"
