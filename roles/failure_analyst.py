"""The failure analyst: turns graded episodes into failure records, groups
them by a structured key (failure kind, abstention category) and asks the
model to name the underlying cause of each group. Groups spanning two or
more distinct tasks are recurring and come first (ECDYSIS §3.2); single-task
groups stay as auxiliary evidence."""

from __future__ import annotations

import asyncio
import json

from langchain_core.messages import HumanMessage

from envs.catalog import Entry, entry_context, side_env
from envs.certify import replay
from envs.spec import tool_infos
from envs.verify import MISSING_CHANGE
from harness.abi import EpisodeView, HarnessConfig
from harness.components import LIBRARY, guessed_calls, stepped_in, without_examples
from prompts import render
from roles.models import chat_model
from state.evolution import FEASIBLE, Diagnosis, FailureGroup, FailureKind, FailureRecord, GroupCause, Replay
from state.records import EpisodeRecord, UsageRecord

MAX_EXAMPLES = 3
MAX_CHARS = 600
MAX_CALLS = 12  # of one example: the first few and the last ones; a runaway trajectory stays a few hundred tokens
GUESSABLE = ("ungrounded_abstain", "over_abstained", "no_change", "wrong_answer", "turn_limit")  # outcomes a guessed id explains


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_kind(record: EpisodeRecord, guesses: tuple[str, ...] = ()) -> FailureKind | None:
    """Why a finished episode failed, or None when it succeeded. A give-up, a wrong answer or a run to the turn
    limit after `guesses` (calls on ids the agent had seen nowhere: `guessed_calls`) is a guessed identifier."""
    kind = _outcome_kind(record)
    return "guessed_identifier" if kind in GUESSABLE and guesses else kind


def _outcome_kind(record: EpisodeRecord) -> FailureKind | None:
    if record.termination == "harness_error":
        return "error"
    grade = record.grade
    if grade is None:
        return None
    if grade.success:
        # A refusal that never saw the blocking evidence is a give-up, not an abstention (the headline scores agree).
        return "ungrounded_abstain" if grade.side == "abstain" and not grade.grounded else None
    if record.termination in ("turn_limit", "context_limit"):
        return "turn_limit"
    if grade.side == "abstain":
        return "forbidden_action" if grade.committed else "did_not_abstain"
    if grade.abstained and not grade.committed:
        return "over_abstained"
    if any(f.startswith(("forbidden call", "unexpected change")) for f in grade.failures):  # envs.verify's wording
        return "forbidden_action"
    # Answering with the change never made was the commonest feasible failure of std15's two adopted candidates on
    # validation (3 of 7 and 3 of 6); read as wrong answers, they pointed the panel at no component that sends the
    # agent back to make it.
    if not grade.committed and any(MISSING_CHANGE.search(f) for f in grade.failures):
        return "no_change"
    return "wrong_answer"


def _given(entry: Entry) -> str:
    """What an episode's agent had read before its first call: the request, its context, the tools' source (their
    descriptions) without the example values it gives."""
    task = entry.pair.task
    return "\n".join([task.instruction, task.system_prompt, entry.env.policy, without_examples(entry.env.tools_source)])


def failure_records(records: list[EpisodeRecord], entries: dict[str, Entry]) -> list[FailureRecord]:
    """The failures among finished episodes; infrastructure errors are not failures."""
    out = []
    for r in records:
        if r.status != "done":
            continue
        entry = entries[r.pair_id]
        guesses = tuple(guessed_calls(_given(entry), list(r.observations)))
        kind = failure_kind(r, guesses)
        if kind is None:
            continue
        calls = tuple(_cut(f"{o.tool}({json.dumps(o.args, default=str)}) -> {o.text}", 300) for o in r.observations)
        last = tuple(_cut(f"{m.get('type', '?')}: {m.get('data', {}).get('content', '')}") for m in r.messages[-3:])
        category = entry.pair.mutation.category if r.key.side == "abstain" else FEASIBLE
        out.append(FailureRecord(
            pair_id=r.pair_id, task_id=r.key.task_id, side=r.key.side, kind=kind, category=category,
            termination=r.termination, instruction=entry.pair.task.instruction.strip(), calls=calls,
            answer=_cut(r.answer), last_messages=last, guesses=guesses[:MAX_EXAMPLES],
        ))
    return out


async def replay_library(records: list[EpisodeRecord], entries: dict[str, Entry]) -> Replay:
    """Every component of the library, with its default parameters, over the finished episodes as they were recorded
    (`stepped_in`): in how many failed and how many passed episodes it would have stepped in. What the roles that choose
    components read beside each one: one that steps into none of the failures could not have changed them as they
    went, one that steps into passed episodes may break them. std15's adopted candidate had the blocking evidence in
    front of it in all 14 infeasible training and validation episodes it failed, and answered anyway: answer_from_results
    would have stepped into 4 of them and stop_on_indistinct_matches into 2, neither into any of the 6 feasible ones it
    passed, and its panel had picked neither."""
    counts, undecided = {name: [0, 0] for name in LIBRARY}, dict.fromkeys(LIBRARY, 0)
    failed = passed = 0
    tools: dict[str, list] = {}
    for r in records:
        if r.status != "done" or r.grade is None:
            continue
        failure = failure_kind(r) is not None
        failed, passed = failed + failure, passed + (not failure)
        steps = await _library_steps(entries[r.pair_id], r.key.side, list(r.observations), r.answer, tools)
        for name, stepped in steps.items():
            if stepped is None:
                undecided[name] += 1
            elif stepped:
                counts[name][not failure] += 1
    return Replay(failed=failed, passed=passed, stepped_in={n: (f, p) for n, (f, p) in counts.items() if f or p},
                  undecided={n: u for n, u in undecided.items() if u})


async def reference_steps(entry: Entry, tools: dict[str, list] | None = None) -> dict[str, dict[str, bool | None]]:
    """Whether each component of the library, with its default parameters, steps into a pair's reference solution
    (`stepped_in`), replayed with the reference answer on the feasible side ("act") and on the twin ("abstain"); None
    when that turns on a model's answer or a lookup. On the twin that is an agent that goes on as if nothing had
    changed: what a harness taught to act does wrong next, before any episode shows it. `tools` caches the
    environments' tools by hash."""
    tools = {} if tools is None else tools
    task, steps = entry.pair.task, {name: {} for name in LIBRARY}
    for side in ("act", "abstain"):
        replayed = await asyncio.to_thread(replay, side_env(entry, side), task.reference.calls, task.reference.answer)
        for name, stepped in (await _library_steps(entry, side, list(replayed.calls), task.reference.answer, tools)).items():
            steps[name][side] = stepped
    return steps


async def _library_steps(entry: Entry, side: str, observations: list, answer: str, tools: dict[str, list]) -> dict[str, bool | None]:
    """`stepped_in` for every component of the library, with its default parameters, over one side's episode; `tools`
    caches the environments' tools by hash."""
    env = side_env(entry, side)
    if env.hash not in tools:  # another environment's code is described in the sandbox: off the event loop
        tools[env.hash] = list((await asyncio.to_thread(tool_infos, env)).values())
    instruction, context = entry.pair.task.instruction.strip(), entry_context(entry)
    steps = {}
    for name, cls in LIBRARY.items():  # a view of its own each: a component keeps its memory in it
        view = EpisodeView(instruction=instruction, context=context, tools=tools[env.hash], config=HarnessConfig(), prompts={}, skills={})
        steps[name] = await stepped_in(cls(), view, observations, answer)
    return steps


async def replay_references(entries: dict[str, Entry]) -> dict:
    """`Replay.pairs` and `Replay.references`: over the training pairs' reference solutions (`reference_steps`), the
    twins and the feasible sides each component steps into."""
    counts, tools, pairs = {name: [0, 0] for name in LIBRARY}, {}, 0
    for entry in entries.values():
        try:
            steps = await reference_steps(entry, tools)
        except Exception:  # an environment whose reference no longer replays: left out, not counted
            continue
        pairs += 1
        for name, sides in steps.items():
            counts[name][0] += sides["abstain"] is True
            counts[name][1] += sides["act"] is True
    return {"pairs": pairs, "references": {n: (t, f) for n, (t, f) in counts.items() if t or f}}


def group_failures(failures: list[FailureRecord]) -> list[tuple[FailureGroup, list[FailureRecord]]]:
    """Groups by (kind, category): recurring groups first, then larger groups, then by key. A failure on a feasible
    task has the category FEASIBLE, not its twin's mutation: filed under the mutation, the seven failures of std6's
    harness-only block on four training pairs made seven groups of one, the alphabet put did_not_abstain first, and
    its candidate (read_before_write) lost the one feasible task H0 completed."""
    grouped: dict[tuple[str, str], list[FailureRecord]] = {}
    for f in failures:
        grouped.setdefault(f.key, []).append(f)
    groups = []
    for (kind, category), members in grouped.items():
        pairs = tuple(sorted({f.pair_id for f in members}))
        groups.append((FailureGroup(kind=kind, category=category, pair_ids=pairs, recurring=len({f.task_id for f in members}) >= 2), members))
    groups.sort(key=lambda g: (not g[0].recurring, -len(g[1]), g[0].kind, g[0].category))
    return groups


def _calls_shown(calls: tuple[str, ...]) -> list[str]:
    """The calls with runs of identical ones folded, at most MAX_CALLS of them (the first third and the end)."""
    folded: list[list] = []
    for call in calls:
        if folded and folded[-1][0] == call:
            folded[-1][1] += 1
        else:
            folded.append([call, 1])
    shown = [c if n == 1 else f"{c} (the same call {n} times in a row)" for c, n in folded]
    if len(shown) <= MAX_CALLS:
        return shown
    head = MAX_CALLS // 3
    return [*shown[:head], f"({len(shown) - MAX_CALLS + 1} more calls)", *shown[-(MAX_CALLS - head - 1):]]


def describe(members: list[FailureRecord]) -> str:
    """A few members of a group as the analyst reads them."""
    parts = []
    for f in members[:MAX_EXAMPLES]:
        calls = "\n".join(f"  - {c}" for c in _calls_shown(f.calls)) or "  (no tool calls)"
        guessed = f"\nCalls on ids it had seen nowhere (guessed), which failed or found nothing: {'; '.join(f.guesses)}" if f.guesses else ""
        parts.append(f"Task: {f.instruction}\nSide: {'should abstain' if f.side == 'abstain' else 'should complete'}; "
                     f"ended by {f.termination}\nTool calls:\n{calls}{guessed}\nFinal answer: {f.answer or '(none)'}")
    return "\n\n".join(parts)


async def analyse_failures(failures: list[FailureRecord], episodes: int, model: str, timeout_s: float = 1800.0) -> tuple[Diagnosis, list[UsageRecord]]:
    """The typed diagnosis of `failures` out of `episodes` graded episodes, one model call per group."""
    llm = chat_model(model, role="failure_analyst", timeout_s=timeout_s)
    groups, usage = [], []
    for group, members in group_failures(failures):
        prompt = render("failure_analyst", kind=group.kind.replace("_", " "), category=group.category.replace("_", " "),
                        count=str(len(members)), tasks=str(len(group.pair_ids)), examples=describe(members))
        cause, used = await llm.structured([HumanMessage(prompt)], GroupCause)
        usage.append(used)
        groups.append(group.model_copy(update={"cause": cause.cause, "evidence": cause.evidence}))
    return Diagnosis(groups=tuple(groups), episodes=episodes, failures=len(failures)), usage


def diagnosis_text(diagnosis: Diagnosis) -> str:
    """A diagnosis as the roles that act on it read it: its failure groups, recurring ones marked."""
    lines = [f"{diagnosis.failures} failures in {diagnosis.episodes} episodes."]
    for g in diagnosis.groups:
        label = "recurring" if g.recurring else "single task"
        lines.append(f"- [{label}, {len(g.pair_ids)} tasks] {g.kind.replace('_', ' ')} / {g.category.replace('_', ' ')}: "
                     f"{g.cause} Evidence: {g.evidence}")
    return "\n".join(lines)
