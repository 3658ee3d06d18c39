"""Records of harness evolution: failures, their diagnosis, the reviewed
modification spec, the coding agent's edit and the lineage entry of each
candidate (ECDYSIS §3, HERA §3.2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from state.metrics import RunScores
from state.records import Record, UsageRecord

# no_change: a feasible task answered without the change it asks for (envs.verify.MISSING_CHANGE)
FailureKind = Literal["did_not_abstain", "ungrounded_abstain", "over_abstained", "no_change", "wrong_answer", "forbidden_action",
                      "turn_limit", "guessed_identifier", "error"]
Component = Literal["prompts", "config", "components", "skills", "memory", "control_logic", "subagents"]


FEASIBLE = "feasible"  # the category of a failure on a feasible task, whose twin's mutation says nothing about it


class FailureRecord(Record):
    """One failed episode, as the failure analyst reads it."""

    pair_id: str
    task_id: str
    side: Literal["act", "abstain"]
    kind: FailureKind
    category: str
    termination: str
    instruction: str
    calls: tuple[str, ...] = ()
    answer: str = ""
    last_messages: tuple[str, ...] = ()
    guesses: tuple[str, ...] = ()  # calls on ids seen nowhere before them that failed or found nothing

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.category


class GroupCause(Record):
    """The analyst's naming of what one group of failures has in common."""

    cause: str = Field(description="the underlying weakness of the agent, in one or two sentences, without task-specific names or values")
    evidence: str = Field(description="what in the trajectories shows it")


class FailureGroup(Record):
    kind: FailureKind
    category: str
    pair_ids: tuple[str, ...]
    recurring: bool
    cause: str = ""
    evidence: str = ""


def group_key(group: FailureGroup) -> str:
    """A failure group as the roles and the edit checks name it: "kind/category"."""
    return f"{group.kind}/{group.category}"


def pair_halves(groups: Sequence[str]) -> list[str]:
    """The failure groups (keys) an edit answers: the one it starts from (`groups[0]`) and the first group on the
    other side of the pairs, when there is one (a twin's when it starts from a feasible task's, and back). A pair
    counts only when the agent acts on the one side and stops on the other: std17's one candidate answered H0's
    invented ids, on feasible tasks and twins alike, and 13 of its 27 training and validation answers were then wrong
    ones giving values no result held."""
    if not groups:
        return []
    feasible = groups[0].partition("/")[2] == FEASIBLE
    other = next((g for g in groups[1:] if (g.partition("/")[2] == FEASIBLE) != feasible), None)
    return [groups[0]] + ([other] if other else [])


def answered_by(group: str, start: str) -> str:
    """The group whose components (`Component.built_for`) answer `group` in an edit that starts from `start`: the
    group itself, or for a twin's group on the other side of the pairs, the agent going on with that twin
    ("did_not_abstain/<category>"): what it does there once it no longer fails the way it fails now (std17's H0
    failed every training twin by inventing ids; its candidate then answered them with values no result held)."""
    category = group.partition("/")[2]
    return group if group == start or category == FEASIBLE else f"did_not_abstain/{category}"


class Replay(Record):
    """The component library run over the graded training episodes a diagnosis read, as recorded
    (`roles.failure_analyst.replay_library`): how many failed and passed, and per component in how many of each it
    would have stepped in (failed, passed) and how many of them it could not tell without a model (`undecided`)."""

    failed: int = 0
    passed: int = 0
    stepped_in: dict[str, tuple[int, int]] = {}
    undecided: dict[str, int] = {}
    pairs: int = 0  # training pairs whose reference solutions `references` replays (`roles.failure_analyst.replay_references`)
    references: dict[str, tuple[int, int]] = {}  # per component: (twins, feasible sides) of those it steps into

    def net(self, component: str) -> int:
        """Passed minus failed episodes `component` would have stepped into: the lower, the likelier it helps."""
        failed, passed = self.stepped_in.get(component, (0, 0))
        return passed - failed

    def tells_apart(self, component: str) -> bool:
        """Whether it steps into more of the training pairs' twins than of their feasible sides (`references`)."""
        twins, feasible = self.references.get(component, (0, 0))
        return twins > feasible

    def preference(self, component: str, acting: bool = False) -> tuple[int, int]:
        """How the components built for one failure group are ordered for the roles that choose them, lowest first:
        `net`, then feasible sides minus twins of the training pairs' reference solutions it steps into; those two the
        other way round for what the agent will do once it acts (`acting`), which its episodes do not show yet."""
        twins, feasible = self.references.get(component, (0, 0))
        order = (self.net(component), feasible - twins)
        return order[::-1] if acting else order


class Diagnosis(Record):
    """Failure groups, recurring (two or more distinct tasks) first."""

    groups: tuple[FailureGroup, ...] = ()
    episodes: int = 0
    failures: int = 0
    replay: Replay = Replay()

    @property
    def recurring(self) -> tuple[FailureGroup, ...]:
        return tuple(g for g in self.groups if g.recurring)


class ProposedChange(Record):
    component: Component
    description: str
    rationale: str


class Skill(Record):
    id: str = Field(description="a short kebab-case name")
    title: str
    pattern: str = Field(description="the situation in which the skill applies")
    tip: str = Field(description="what the agent should do then")


class Turn(Record):
    """One speaker's turn in an FDCR review of a diagnosis."""

    role: Literal["analyst", "critic", "engineer"]
    round: int
    text: str


class ModificationSpec(Record):
    """The moderator's structured instruction to the coding agent."""

    failure_patterns: list[str]
    changes: list[ProposedChange]
    skills: list[Skill] = []
    implementation_notes: str = ""


class ComponentChoice(Record):
    name: str = Field(description="a control-logic component of the library")
    params: dict[str, Any] = {}
    addresses: str = Field("", description="the failure group (kind/category) this component addresses")


class HarnessEdit(Record):
    """A structured edit (channel i): prompt text, configuration and the selection of generic components."""

    rationale: str
    system_prompt_addition: str = Field("", description="a paragraph appended to the system prompt; empty for none")
    components: list[ComponentChoice] = Field(default_factory=list, description="the complete list of components to enable")
    skills: list[Skill] = Field(default_factory=list)
    max_turns: int | None = Field(None, description="a new turn limit between 5 and 30, or null to keep it")
    action_mode: Literal["text", "structured"] | None = Field(
        None, description="structured: each turn is exactly one tool call or a final answer (helps a small model); null to keep it")


class LineageEntry(Record):
    """One harness in a lineage: adopted or not, with why."""

    id: str
    bundle_id: str
    parent_id: str | None
    run_id: str
    path: str
    mode: str
    spec: ModificationSpec | None = None
    diff: str = ""
    problems: tuple[str, ...] = ()
    train: RunScores | None = None
    validation: RunScores | None = None
    adopted: bool = False
    reason: str = ""
    decision: dict[str, Any] = {}  # the figures the selection used (graphs.selection.judge)
    usage: tuple[UsageRecord, ...] = ()  # every model call that built this candidate: analysis, review, edits
    build_s: float = 0.0  # wall time from the failure analysis to the end of the bundle checks


class ProposalTarget(Record):
    """What one mutation proposer is asked for: a parent pair's feasible task, a category, an idea."""

    id: str
    parent: str
    category: str
    idea: str = ""
    source: str = ""  # the directory the parent is loaded from; empty: the run's catalog


class Review(Record):
    """A reviewer's verdict on one proposed mutation. The reasons come first: a grammar-constrained model
    writes fields in order, and one that decides before it reasons contradicts its own reasons."""

    reasons: str = Field(description="the reasoning; for a rejection, what to change")
    accept: bool = Field(description="true only if the proposal passes this review")


class Feasibility(Record):
    """The semantic reviewer's reading of a derived change, asked with the polarity a model reasons in: a small
    model that writes "this makes it impossible" then answers `accept: false` to "accept if it breaks the task"."""

    reasons: str = Field(description="what the change does to the request")
    still_possible: bool = Field(description="true if the request can still be completed correctly after the change")


class RescueClaim(Record):
    """The rescue reviewer's answer: a route it believes still completes the request, to be run, not believed."""

    reasons: str = Field(description="how the request could still be completed after the change, or why it cannot")
    route_found: bool = Field(description="true if one read-only tool call below still shows what the change took away")
    tool: str = Field("", description="that tool's name; empty when no route is found")
    arguments: dict[str, Any] = Field(default_factory=dict, description="that call's arguments")


class ProposalOutcome(Record):
    target: ProposalTarget
    status: Literal["certified", "rejected"]
    pair_id: str
    mutation: dict[str, Any] | None = None
    rounds: int = 0
    reviews: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    reason: str = ""
    usage: tuple[UsageRecord, ...] = ()
    elapsed_s: float = 0.0  # wall time from the first proposal to the outcome, reviews and certification included
