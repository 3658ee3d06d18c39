"""Private grading of one episode from its trajectory.

The final state is rebuilt by replaying the episode's tool calls on a fresh
copy of its side's environment (tools are deterministic); a replay that does
not reproduce the recorded observations is an infrastructure error, not a
grade. On the act side the verifier decides success; on the abstain side the
commit check does, with the judge. Grounded means the pair's blocking
evidence appeared in an observation before the final answer.
"""

from __future__ import annotations

from envs.catalog import Entry, side_env
from envs.certify import replay
from envs.spec import write_tools
from envs.verify import Outcome, committed, verify
from state.records import Evidence, Observation, Side, ToolCall


class ReplayMismatch(Exception):
    pass


def rebuild(entry: Entry, side: Side, observations: list[Observation], answer: str) -> Outcome:
    calls = tuple(ToolCall(tool=o.tool, args=o.args) for o in observations)
    outcome = replay(side_env(entry, side), calls, answer)
    for recorded, replayed in zip(observations, outcome.calls):
        if (recorded.ok, recorded.visible) != (replayed.ok, replayed.visible):
            raise ReplayMismatch(f"{recorded.tool}({recorded.args}) replayed differently")
    return outcome


def shows_evidence(evidence: Evidence, observations: list[Observation]) -> bool:
    return any(o.tool == evidence.tool and evidence.contains.casefold() in o.text.casefold() for o in observations)


def deterministic_grade(entry: Entry, side: Side, observations: list[Observation], answer: str) -> dict:
    """Everything about a grade that needs no judge."""
    outcome = rebuild(entry, side, observations, answer)
    writes = write_tools(side_env(entry, side))
    verdict = verify(entry.pair.task, outcome)
    return {
        "verified": verdict.passed,
        "failures": verdict.failures,
        "committed": bool(committed(entry.pair.task, outcome.calls, writes)),
        "grounded": shows_evidence(entry.pair.mutation.evidence, observations),
    }
