"""Frozen records for environments, tasks, mutations, pairs and certifications.

These are the nouns of DESIGN.md §3. Everything here is plain data: loading,
validation against files and execution live in `envs/`. Content hashes are
computed over canonical JSON so that row order and key order never matter.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property, lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Scalar = str | int | float | bool | None
Row = dict[str, Any]

ColumnType = Literal["text", "integer", "real", "boolean", "json"]
Category = Literal[
    "missing_evidence",
    "conflicting_records",
    "authorization_revoked",
    "joint_constraints",
    "cumulative_privacy",
    "broken_tool",
    "stale_record",
    "ambiguous_entity",
]
CATEGORIES: tuple[str, ...] = Category.__args__
Split = Literal["train", "validation", "bench"]
Tier = Literal["short", "standard"]  # short: a reference of 2–3 calls
Side = Literal["act", "abstain"]


def scalars(value: Any) -> list[str]:
    """The values in a JSON-like value (dicts, lists and tuples walked), as text; nulls and booleans left out."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in scalars(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in scalars(v)]
    return [] if value is None or isinstance(value, bool) else [str(value)]


def unicode_text(value: Any) -> Any:
    """`value` (dicts, lists and tuples walked, keys too) with every lone surrogate made U+FFFD: what a JSON escape
    such as "\\ud83d" cut from its pair decodes to, which no UTF-8 record, journal, request or log can hold. `value`
    itself when it holds none."""
    if isinstance(value, str):
        if value.isascii():
            return value
        text = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value if text == value else text
    if isinstance(value, dict):
        pairs = [(unicode_text(k), unicode_text(v)) for k, v in value.items()]
        return value if all(a is k and b is v for (a, b), (k, v) in zip(pairs, value.items())) else dict(pairs)
    if isinstance(value, (list, tuple)):
        items = [unicode_text(v) for v in value]
        return value if all(a is v for a, v in zip(items, value)) else type(value)(items)
    return value


# An escape of a UTF-16 surrogate (JSON's \ud800, YAML's \U0000d800 too): how data read from UTF-8 text holds one
SURROGATE_ESCAPE = re.compile(r"\\(?:u|U0000)[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(text: str, value: Any) -> str | None:
    """The text around a lone surrogate in `value`, the data read from the JSON or YAML `text`; None when it holds
    none (an escaped pair is one character, and fine)."""
    if not SURROGATE_ESCAPE.search(text):
        return None
    try:
        json.dumps(value, ensure_ascii=False, default=str).encode()
    except UnicodeEncodeError as exc:
        return exc.object[max(0, exc.start - 30):exc.end + 30]
    return None


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def merge(left: dict, right: dict) -> dict:
    """The reducer of maps keyed by id: later entries replace earlier ones."""
    return {**left, **right}


def content_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Column(Record):
    name: str
    type: ColumnType
    nullable: bool = False
    references: str | None = None


class TableSpec(Record):
    name: str
    primary_key: str
    columns: tuple[Column, ...]

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


class ToolInfo(Record):
    """The public face of one tool: what an agent and the MCP server see."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool


class StateOp(Record):
    """One declarative row edit. `key` is the primary-key value of the row."""

    op: Literal["set", "delete", "insert"]
    table: str
    key: Scalar = None
    fields: Row = Field(default_factory=dict)
    row: Row | None = None


class ToolPatch(Record):
    """A change of tool behaviour layered over the tools module.

    `fail`: calls whose arguments match `when` return the error instead of
    running. `redact`: in the output, every object matching `where` has each of
    `fields` replaced by an unavailable marker.
    """

    op: Literal["fail", "redact"]
    tool: str
    when: Row = Field(default_factory=dict)
    error_code: str = "unavailable"
    message: str = ""
    where: Row = Field(default_factory=dict)
    fields: tuple[str, ...] = ()


class EnvironmentSpec(Record):
    id: str
    theme: str
    description: str
    tables: tuple[TableSpec, ...]
    rows: dict[str, tuple[Row, ...]]
    tools_source: str
    policy: str = ""
    tool_patches: tuple[ToolPatch, ...] = ()
    parent_hash: str | None = None

    def table(self, name: str) -> TableSpec:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(f"no table {name!r} in environment {self.id!r}")  # not StopIteration: it would hang a to_thread await

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "EnvironmentSpec":
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("hash", None)  # the cached hash belongs to the original
        return copy

    @cached_property
    def hash(self) -> str:
        rows = {
            t.name: sorted(self.rows.get(t.name, ()), key=lambda r, pk=t.primary_key: canonical_json(r.get(pk)))
            for t in self.tables
        }
        return content_hash(
            {
                "tables": [t.model_dump() for t in self.tables],
                "rows": rows,
                "tools": self.tools_source,
                "policy": self.policy,
                "patches": [p.model_dump() for p in self.tool_patches],
            }
        )


class CallPattern(Record):
    """Matches a tool call by name and (a subset of) its arguments."""

    tool: str
    args: Row = Field(default_factory=dict)


class ToolCall(Record):
    tool: str
    args: Row = Field(default_factory=dict)


class AnswerCheck(Record):
    """A value the final answer must state. Numbers match within `tolerance`,
    ISO dates match any common written form, text matches case- and
    punctuation-insensitively; `any_of` lists accepted alternatives."""

    name: str
    value: Scalar = None
    any_of: tuple[str, ...] = ()
    tolerance: float = 0.0


class StateCheck(Record):
    """The final state holds (or, with `absent`, lacks) a row of `table` whose
    fields include `match`."""

    table: str
    match: dict[str, Scalar]  # a grammar over drafts then cannot write a schema fragment as a value
    absent: bool = False


class ReferenceSolution(Record):
    calls: tuple[ToolCall, ...]
    answer: str


class TaskSpec(Record):
    id: str
    instruction: str
    system_prompt: str = ""
    answer: tuple[AnswerCheck, ...] = ()
    forbidden_values: tuple[str, ...] = ()
    state: tuple[StateCheck, ...] = ()
    allowed_writes: tuple[str, ...] | None = None
    forbidden: tuple[CallPattern, ...] = ()
    commit: tuple[CallPattern, ...] | None = None
    reference: ReferenceSolution


class Evidence(Record):
    """What an agent can observe that blocks the task: an observation of
    `tool` whose JSON text contains `contains` (case-insensitive)."""

    tool: str
    contains: str


class Scope(Record):
    rows: dict[str, tuple[Scalar, ...]] = Field(default_factory=dict)
    tools: tuple[str, ...] = ()


class Mutation(Record):
    category: Category
    description: str
    requirement: str
    state: tuple[StateOp, ...] = ()
    tools: tuple[ToolPatch, ...] = ()
    scope: Scope
    evidence: Evidence
    witness: tuple[Row, ...]
    # ambiguous_entity: the instruction's identifying details, "*" on the keys that tell entities apart
    candidates: Row | None = None
    # conflicting_records: the conflicting observations, the feasible side's consistent one among them
    conflict: tuple[Row, ...] = ()
    reportable: tuple[str, ...] = ()


class PairSpec(Record):
    id: str
    split: Split
    tier: Tier = "standard"
    environment: str
    task: TaskSpec
    mutation: Mutation
    control: tuple[StateOp, ...] = ()


class CheckResult(Record):
    name: str
    passed: bool
    detail: str


class Certification(Record):
    pair_id: str
    feasible_hash: str
    infeasible_hash: str
    checks: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


class Observation(Record):
    """One tool call as the agent saw it."""

    tool: str
    args: Row
    ok: bool
    output: Any = None
    error_code: str | None = None
    message: str = ""
    read_only: bool = True
    source: Literal["agent", "harness"] = "agent"  # harness: a lookup a hook made itself (`view.lookup`)
    shown: str | None = None  # what the model was shown when the harness presented it otherwise (None: `text`)

    @property
    def seen(self) -> str:
        """The text the model saw of this result."""
        return self.text if self.shown is None else self.shown

    @property
    def visible(self) -> Any:
        if self.ok:
            return self.output
        return {"error": {"code": self.error_code, "message": self.message}}

    @property
    def text(self) -> str:
        return json.dumps(self.visible, ensure_ascii=False, default=str)


class RowChange(Record):
    table: str
    key: Scalar
    before: Row | None
    after: Row | None


class StateDiff(Record):
    changes: tuple[RowChange, ...] = ()

    def tables(self) -> set[str]:
        return {c.table for c in self.changes}


class UsageRecord(Record):
    """One model call's cost, attributed to the role that made it."""

    role: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float | None = None


class JudgeVerdict(Record):
    """The abstention judge's reading of a final response."""

    abstained: bool
    scope: Literal["none", "part", "all"]
    quote: str
    reason: str


class Grade(Record):
    side: Side
    success: bool
    abstained: bool
    committed: bool
    grounded: bool
    quote: str = ""
    failures: tuple[str, ...] = ()
    judge: str = ""  # the judge that read the answer (`abstention_judge.judge_id`); "" before judges had versions


# Characters kept of any one text a harness hands back (an answer, a result as shown, guidance, a message) or of an
# error, before it is stored, shown to a model or judged: a real answer is a few thousand; past this only cost grows
# (one 40 MB answer was stored twice and sent the judge 10.5M tokens).
MAX_TEXT = 65_536


def capped(text: str, limit: int = MAX_TEXT) -> str:
    """`text`, or its first `limit` characters and a marker saying how much there was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... truncated by hera: {len(text):,} characters, the first {limit:,} kept]"


class EpisodeKey(Record):
    harness_hash: str
    env_hash: str
    task_id: str
    side: Side
    model: str
    seed: int
    trial: int
    max_turns: int | None = None  # the run's cap on turns, when it has one
    # The agent's sampling seeds: "turn" when each turn's comes from the request (`EpisodeRequest.sampling_seed`);
    # None for an episode sampled unseeded, which a seeded run does not reuse (its draws are not another harness's).
    sampling: Literal["turn"] | None = None

    @property
    def id(self) -> str:
        return _key_id(self)


@lru_cache(maxsize=4096)
def _key_id(key: EpisodeKey) -> str:
    """An episode key's id (made a few times for each episode: claim, attempts, records), by its fields."""
    return content_hash(key.model_dump(exclude_none=True))


class EpisodeRecord(Record):
    key: EpisodeKey
    pair_id: str
    bundle: str
    status: Literal["done", "infrastructure_error"]
    termination: str = ""
    answer: str = ""
    messages: tuple[dict, ...] = ()
    observations: tuple[Observation, ...] = ()
    usage: tuple[UsageRecord, ...] = ()
    error: str = ""
    grade: Grade | None = None
    latency_s: float = 0.0
