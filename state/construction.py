"""Records of environment construction from a theme (HERA §3.1, App. B.1–B.2):
what the builder, the tool coder and the task proposer write, what the solver
did, and each step's recorded decision."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from state.records import AnswerCheck, CallPattern, ColumnType, Observation, Record, Scalar, StateCheck


class ColumnDraft(Record):
    name: str = Field(description="a lower_snake_case column name")
    type: ColumnType
    nullable: bool = False
    references: str | None = Field(None, description="'table.column' this column refers to (a foreign key), or null")


class TableDraft(Record):
    name: str = Field(description="a lower_snake_case table name")
    primary_key: str = Field(description="the column that identifies a row")
    columns: list[ColumnDraft]
    rows: list[dict[str, Scalar]] = Field(description="the initial rows: every column, values of its type")


class DatabaseDraft(Record):
    """The environment builder's database: tables, their rows and a public description."""

    id: str = Field(description="a short kebab-case id of the environment")
    description: str = Field(description="what the environment holds, for its users; say the snapshot's date")
    tables: list[TableDraft]
    policy: str = Field("", description="rules the environment's users must follow, or empty")


class InvalidCall(Record):
    args: dict[str, Any] = Field(description="arguments of a call the tool must refuse")
    error_code: str = Field(description="the ToolError code it refuses with")


class ToolDeclaration(Record):
    """What one tool promises, checked by running it: results of the `returns`
    schema, calls that succeed, calls refused with a code, tables a write changes."""

    name: str
    read_only: bool
    returns: dict[str, Any] = Field(description="a JSON Schema of the tool's result")
    valid: list[dict[str, Any]] = Field(description="argument objects of calls that must succeed")
    invalid: list[InvalidCall] = Field(default_factory=list)
    changes: list[str] = Field(default_factory=list, description="for a write tool, the tables a valid call changes")


class ToolsDraft(Record):
    """The tool coder's module and its declarations."""

    code: str = Field(description="the complete tools.py")
    tools: list[ToolDeclaration]


class TaskDraft(Record):
    """A proposed task with its private verification rules, written before any solving."""

    id: str = Field(description="a short kebab-case id")
    instruction: str = Field(description="the user's request, in the user's words; never the answer values")
    answer: list[AnswerCheck] = Field(default_factory=list, description="values the final answer must state")
    state: list[StateCheck] = Field(default_factory=list, description="rows the final state must hold (or, absent, lack)")
    allowed_writes: list[str] | None = Field(None, description="tables the task may change; null: those of the state checks")
    forbidden: list[CallPattern] = Field(default_factory=list, description="calls that must never succeed")
    forbidden_values: list[str] = Field(default_factory=list)


class TaskDrafts(Record):
    tasks: list[TaskDraft]


class Named(Record):
    """A record a seed's call names by key (`arg`), and how its user names it (`label`; empty: by the key)."""

    arg: str
    table: str
    key: Scalar
    label: str = ""


class TaskSeed(Record):
    """A change a write tool makes on the initial state, for a task to ask for: the successful call, the records it
    names, its other values, and the checks its outcome implies (answer values the call returned, rows it left)."""

    tool: str
    description: str
    args: dict[str, Scalar]
    named: tuple[Named, ...] = ()
    details: dict[str, Scalar] = {}
    answer: tuple[AnswerCheck, ...] = ()
    state: tuple[StateCheck, ...] = ()
    tables: tuple[str, ...] = ()


class TaskRequest(Record):
    instruction: str = Field(description="the user's request, in the user's words")


class SolverAttempt(Record):
    """One solver run on a task: its final answer, every call it made, why it stopped."""

    task_id: str
    answer: str
    observations: tuple[Observation, ...] = ()
    termination: Literal["final_answer", "turn_limit", "context_limit", "harness_error", "environment_error"]
    error: str = ""
    tries: int = 1  # which attempt this is


class Decision(Record):
    """One step's verdict on one subject (the database, the tools, a task)."""

    step: Literal["database", "tools", "task_proposal", "solver", "verification", "task_review", "mutation_menu", "pair"]
    subject: str
    attempt: int = 1
    accepted: bool
    reasons: tuple[str, ...] = ()


class TaskCheck(Record):
    """A task's reference replayed from the initial state: its observations,
    the verifier's failures on it, and which perturbed outcomes it accepted."""

    observations: tuple[Observation, ...] = ()
    failures: tuple[str, ...] = ()
    accepted_perturbations: tuple[str, ...] = ()
    rejected_perturbations: tuple[str, ...] = ()
