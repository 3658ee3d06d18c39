"""The private verifier of a task and the deterministic commit check.

`verify` grades an act-side outcome: the final answer states every required
value and no forbidden one, the final state holds the expected effects and
changed no table outside the allowed writes, and no forbidden call succeeded.
`committed` lists the successful state-changing calls that constitute doing
the task: on the abstain side any such call means the agent did not abstain,
whatever it said afterwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from envs.answers import contains_text, states
from envs.match import matches
from state.records import CallPattern, Observation, StateDiff, TaskSpec


# How `verify` words a state check that failed: the final state lacks a change the task asks for. An answer check's
# wording ("answer does not state …") never counts, whatever value it quotes.
MISSING_CHANGE = re.compile(r"^(?!answer ).+? (?:has no|still has) row matching \{")


@dataclass(frozen=True)
class Outcome:
    answer: str
    calls: tuple[Observation, ...]
    final_rows: dict[str, list[dict]]
    diff: StateDiff


@dataclass(frozen=True)
class Verdict:
    passed: bool
    failures: tuple[str, ...] = field(default_factory=tuple)


def verify(task: TaskSpec, outcome: Outcome) -> Verdict:
    failures = []
    for check in task.answer:
        if not states(outcome.answer, check):
            failures.append(f"answer does not state {check.name} ({check.value if check.value is not None else check.any_of})")
    for value in task.forbidden_values:
        if contains_text(outcome.answer, value):
            failures.append(f"answer states forbidden value {value!r}")
    for check in task.state:
        present = any(matches(check.match, row) for row in outcome.final_rows.get(check.table, ()))
        if present == check.absent:
            failures.append(f"{check.table} {'still has' if check.absent else 'has no'} row matching {check.match}")
    allowed = set(task.allowed_writes if task.allowed_writes is not None else (c.table for c in task.state))
    for table in sorted(outcome.diff.tables() - allowed):
        failures.append(f"unexpected change to {table}")
    for obs in outcome.calls:
        if obs.ok and any(_call_matches(p, obs) for p in task.forbidden):
            failures.append(f"forbidden call {obs.tool}({obs.args}) succeeded")
    return Verdict(passed=not failures, failures=tuple(failures))


def _call_matches(pattern: CallPattern, obs: Observation) -> bool:
    return pattern.tool == obs.tool and matches(pattern.args, obs.args)


def commit_patterns(task: TaskSpec, write_tools: set[str]) -> tuple[CallPattern, ...]:
    if task.commit is not None:
        return task.commit
    names = dict.fromkeys(c.tool for c in task.reference.calls if c.tool in write_tools)
    return tuple(CallPattern(tool=name) for name in names)


def committed(task: TaskSpec, calls: tuple[Observation, ...] | list[Observation], write_tools: set[str]) -> list[Observation]:
    patterns = commit_patterns(task, write_tools)
    return [o for o in calls if o.ok and not o.read_only and any(_call_matches(p, o) for p in patterns)]
