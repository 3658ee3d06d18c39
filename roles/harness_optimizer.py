"""The harness optimizer: a coding agent that edits a staging copy of a bundle.

Two channels (ISSUE: structured vs free edits). `structured`: one
schema-constrained `HarnessEdit` — a paragraph for the system prompt, the
complete list of generic components with parameters, skills and the turn
limit — applied by code; a 1.5B model can manage this. `code`: a tool loop
with file tools (list, read, write, replace, check) over the staging copy,
for stronger endpoints. Either way only the editable components of the
bundle can change (prompts, skills, sub-agents, hooks, components, config,
memory); the manifest is written by the caller, and no path may leave the
staging directory.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import Field

from harness.bundle import Bundle
from harness.check import check_bundle
from harness.components import LIBRARY, ComponentName, catalog_text, stops_going_on
from harness.leakage import quoted
from prompts import render
from roles.models import chat_model
from state.evolution import (ComponentChoice, FailureKind, FailureRecord, HarnessEdit, ModificationSpec, Replay, Skill, answered_by,
                             pair_halves)
from state.records import CATEGORIES, ToolInfo, UsageRecord, content_hash

EDITABLE = ("prompts", "skills", "subagents", "hooks.py", "components.yaml", "config.yaml", "memory.yaml")
Channel = Literal["structured", "code"]
MAX_STEPS = 12
MIN_TURNS, MAX_TURNS = 5, 30


class EditError(Exception):
    """A file operation the coding agent may not do; reported back to it as the tool's result."""


MAX_COMPONENT_CHANGES = 2  # K: components one candidate may add, drop or re-parameterise
EDIT_ASKS = 3
# What a prompt addition or a skill must not be: narration of the change, the harness's own internals, first person.
INTERNALS = ("harness", "component", "components", "skill", "skills", "turn limit", "turn budget", "max_turns", "number of turns",
             "the failures", "failure group", "system prompt", "this change", "these changes", "to address", "the prompt",
             # an engineer's words: a 1.5B optimizer wrote "implement a more robust data retrieval mechanism, such as caching"
             "implement", "implementation", "configuration", "parameter", "mechanism", "caching", "overabstention", "over-abstention",
             *(n.replace("_", " ") for n in LIBRARY), *LIBRARY,
             *(k.replace("_", " ") for k in get_args(FailureKind) if k != "error"),
             # the diagnosis's own keys, and the agent in the third person: a 1.5B optimizer wrote a skill "When:
             # guessed_identifier / missing_evidence. Do: ... ensuring that the assistant has access to all the data"
             *(k for k in (*get_args(FailureKind), *CATEGORIES) if "_" in k), "the assistant", "the agent")
FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'd|I'll|me|my|we|we've|we're|we'll|our|us)\b")
QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|'[^']*'(?!\w)")
VAGUE_TRIGGER = re.compile(r"^\s*(?:always|regularly|generally|in general|at all times|whenever possible|every time|any time|usually|often)\b",
                           re.IGNORECASE)


def edit_schema(groups: list[str], most: int | None = None) -> type[HarnessEdit]:
    """`HarnessEdit` for the response format: component names from the library, each tied to one of `groups`, and
    at most `most` of them (the grammar holds a small model to it: asked for the complete list, a 1.5B optimizer
    listed all 18 components three asks in a row)."""
    group = Literal[tuple(groups)] if groups else str  # type: ignore[valid-type]

    class Choice(ComponentChoice):
        name: ComponentName  # type: ignore[valid-type]
        addresses: group = Field(description="the failure group this component addresses")  # type: ignore[valid-type]

    class StructuredEdit(HarnessEdit):
        components: list[Choice] = Field([], max_length=most, description="the complete list of components to enable")

    return StructuredEdit


def narration(text: str) -> list[str]:
    """Why `text` is not an instruction to the agent: it narrates, speaks in the first person or names harness internals."""
    plain = QUOTED.sub("", text)
    found = []
    if FIRST_PERSON.search(plain):
        found.append(f"it speaks in the first person ({FIRST_PERSON.search(plain).group(0)!r})")
    named = sorted({term for term in INTERNALS if re.search(rf"\b{re.escape(term)}\b", plain, re.IGNORECASE)})
    if named:
        found.append(f"it names the harness's internals or the failures ({', '.join(repr(n) for n in named[:4])})")
    return found


def edit_problems(edit: HarnessEdit, current: dict[str, dict], groups: list[str], max_changes: int = MAX_COMPONENT_CHANGES,
                  private: frozenset[str] = frozenset(), replay: Replay | None = None) -> list[str]:
    """What makes a structured edit not worth applying, checked by code: too many component changes, a change tied to
    no failure group, components changed of which none is built for the failure group it starts from (`groups[0]`),
    or for the first one on the other side of the pairs, when the harness has none and the library has one (std5's
    optimizer, started from guessed identifiers, added two write-order components), a prompt addition that is not
    an instruction to the agent, a skill without a trigger and an action, a prompt addition or skill that quotes a
    `private` value of the pool (`harness.leakage`)."""
    problems = []
    chosen = {c.name: c for c in edit.components}
    changed = _changed(edit, current)
    if len(changed) > max_changes:
        problems.append(f"it changes {len(changed)} components ({', '.join(changed)}); change at most {max_changes}, "
                        "the ones the failures call for")
    for group, built in unaddressed(edit, current, groups, replay).items():
        problems.append(f"it adds no component built for {_named(group, groups[0])} (one of: {', '.join(built)})")
    for name in changed:
        if name in chosen and groups and chosen[name].addresses not in groups:
            problems.append(f"component {name} does not name the failure group it addresses (one of: {', '.join(groups)})")
    problems += addition_problems(edit.system_prompt_addition, private)
    for skill in edit.skills:
        problems += skill_problems(skill, private)
    return problems


def unaddressed(edit: HarnessEdit, current: dict[str, dict], groups: list[str], replay: Replay | None = None) -> dict[str, list[str]]:
    """Per failure group the edit answers (`pair_halves`: the one it starts from and the first on the other side of
    the pairs) that no component of the harness or of the edit's additions answers (`answers`, each half by one of its
    own), the library's components that would; {} for an edit that changes no components."""
    if not _changed(edit, current):
        return {}
    added = [c.name for c in edit.components if c.name not in current]
    have = _assigned([*current, *added], groups, replay)
    return {g: built for g in pair_halves(groups) if g not in have
            and (built := [n for n in LIBRARY if n not in current and n not in have.values() and answers(n, g, groups[0], replay)])}


def answers(name: str, group: str, start: str, replay: Replay | None = None) -> bool:
    """Whether the library's component `name` answers `group` in an edit that starts from `start`: it is built for it
    (`Component.built_for`), or, for a twin's group on the other side of the pairs, for stopping the agent that goes
    on with that twin (`stops_going_on`)."""
    return name in LIBRARY and (LIBRARY[name].built_for(group) or stops_going_on(name, group, start, replay))


def _assigned(names: list[str], groups: list[str], replay: Replay | None) -> dict[str, str]:
    """The halves (`pair_halves`) that components `names` answer, each by one of its own, the first that does."""
    found: dict[str, str] = {}
    for group in pair_halves(groups):
        if name := next((n for n in names if n not in found.values() and answers(n, group, groups[0], replay)), None):
            found[group] = name
    return found


def _named(group: str, start: str) -> str:
    """A group the edit answers, in words."""
    if group == start:
        return f"{group.partition('/')[0].replace('_', ' ')}, the failure group it starts from"
    target = answered_by(group, start)
    if target == group:
        return f"{group.partition('/')[0].replace('_', ' ')}, the failure group on the other side of the pairs"
    return (f"{group.partition('/')[0].replace('_', ' ')} on the other side of the pairs ({group}), nor for going on with "
            f"{group.partition('/')[2].replace('_', ' ')} twins, besides the one for the group it starts from")


def _changed(edit: HarnessEdit, current: dict[str, dict]) -> list[str]:
    """The components an edit adds, drops or re-parameterises."""
    chosen = {c.name: c for c in edit.components}
    return sorted({n for n in current if n not in chosen} | {n for n, c in chosen.items() if current.get(n) != (c.params or {})})


def specific(text: str, private: frozenset[str]) -> list[str]:
    """Why `text` is not written for any task: the `private` values of the pool it quotes (the leakage lint would turn
    the whole candidate away for them: std13's optimizer wrote a skill around one training task's city)."""
    found = quoted(text, private)
    return [f"it quotes {', '.join(repr(t) for t in found[:4])} from the training tasks; write it for any task"] if found else []


def addition_problems(addition: str, private: frozenset[str] = frozenset()) -> list[str]:
    addition = addition.strip()
    if not addition or addition.casefold() in NOTHING:
        return []
    return [f"the prompt addition is not an instruction to the agent: {why}" for why in narration(addition)] + [
        f"the prompt addition is not general: {why}" for why in specific(addition, private)]


def skill_problems(skill: Skill, private: frozenset[str] = frozenset()) -> list[str]:
    label, problems = skill.id or skill.title, []
    if len(skill.pattern.split()) < 3 or VAGUE_TRIGGER.match(skill.pattern):
        problems.append(f"skill {label!r} has no concrete trigger: say in which situation it applies")
    if len(skill.tip.split()) < 3:
        problems.append(f"skill {label!r} has no action: say what the agent should do then")
    # the title is a label (a component's name in words is fine there); what the agent is told to do is checked
    return problems + [f"skill {label!r} is not an instruction to the agent: {why}" for why in narration(f"{skill.pattern} {skill.tip}")] + [
        f"skill {label!r} is not general: {why}" for why in specific(f"{skill.id} {skill.title} {skill.pattern} {skill.tip}", private)]


def salvaged(edit: HarnessEdit, current: dict[str, dict], groups: list[str], brief: str = "",
             private: frozenset[str] = frozenset(), replay: Replay | None = None) -> tuple[HarnessEdit, list[str]] | None:
    """The edit without its skills and prompt addition that fail their checks (a note for each); when it changes
    more components than allowed, with the current components it left out put back; and when its components still
    change too many, or add nothing built for a failure group it answers (`unaddressed`), with the harness's
    components as they are, the edit's first addition built for each group it does answer, and for each one it does
    not, the component built for it that `brief` (the diagnosis) names first, else the library's first as the edit
    read it (`catalog_text`, with the `replay`). When the rest passes; None when the components still fail (one that
    names no failure group it addresses). A small model asked again often sends the same reply back (seen on the local
    model: three asks, the last two identical, the candidate lost to one skill's vague trigger; a list of the current
    components and two more that left one current component out, three changes; three times the same two write-order
    components for guessed identifiers, whose diagnosis had named `refuse_failed_repeat`; and in std20 a last ask
    that changed six components, after which the round had no candidate)."""
    skills = [k for k in edit.skills if not skill_problems(k, private)]
    notes = [f"dropped: {p}" for k in edit.skills for p in skill_problems(k, private)]
    addition = edit.system_prompt_addition
    if addition_problems(addition, private):
        notes += [f"dropped: {p}" for p in addition_problems(addition, private)]
        addition = ""
    components, chosen = list(edit.components), {c.name: c for c in edit.components}
    left_out = [n for n in current if n not in chosen]
    if len(_changed(edit, current)) > MAX_COMPONENT_CHANGES and left_out:
        components = [chosen.get(n) or ComponentChoice(name=n, params=current[n]) for n in current] + [
            c for c in components if c.name not in current]
        notes.append(f"kept {', '.join(left_out)}: the edit left {'it' if len(left_out) == 1 else 'them'} out, which made more "
                     f"than {MAX_COMPONENT_CHANGES} component changes")
    kept = edit.model_copy(update={"skills": skills, "system_prompt_addition": addition, "components": components})
    missing, changed = unaddressed(kept, current, groups, replay), _changed(kept, current)
    too_many = len(changed) > MAX_COMPONENT_CHANGES
    if (missing or too_many) and len(edit_problems(kept, current, groups, private=private, replay=replay)) == len(missing) + too_many:
        added = {c.name: c for c in kept.components if c.name not in current}
        chosen = {n: added[n] for n in _assigned(list(added), groups, replay).values()}
        for group, built in missing.items():
            built = [n for n in built if n not in chosen]
            named = [n for n in built if n in brief]
            acting = answered_by(group, groups[0]) != group
            pick = (min(named, key=brief.index) if named else built[0] if not replay
                    else min(built, key=lambda n: replay.preference(n, acting)))
            chosen.setdefault(pick, ComponentChoice(name=pick, addresses=group))
            notes.append(f"enabled {pick}: the edit added no component built for {_named(group, groups[0])}")
        if dropped := sorted(set(changed) - set(chosen)):
            notes.append(f"left out {', '.join(dropped)}: " + (f"{len(changed)} component changes; kept the edit's first addition "
                         "built for each failure group it answers" if too_many else "built for no failure group the edit answers"))
        kept = kept.model_copy(update={"components": [ComponentChoice(name=n, params=p) for n, p in current.items()]
                                       + list(chosen.values())})
    return None if edit_problems(kept, current, groups, private=private, replay=replay) else (kept, notes)


def signature(bundle: Path) -> str:
    """The content of a bundle's editable files: equal for two candidates that carry the same edit."""
    files = {str(p.relative_to(bundle)): p.read_text() for p in sorted(bundle.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts and p.name != "manifest.yaml"}
    return content_hash(files)


def describe_bundle(bundle: Bundle) -> str:
    """The harness as the review roles read it."""
    components = ", ".join(f"{c.name}{json.dumps(c.params) if c.params else ''}" for c in bundle.components) or "none"
    skills = "; ".join(bundle.skills) or "none"
    return (f"System prompt:\n<<<\n{bundle.prompts['system'].strip()}\n>>>\nTurn limit: {bundle.config.max_turns}. "
            f"Action mode: {bundle.config.action_mode}. Enabled components: {components}. Skills: {skills}.")


def spec_text(spec: ModificationSpec) -> str:
    return json.dumps(spec.model_dump(), indent=1)


def failure_text(failure: FailureRecord) -> str:
    calls = "\n".join(f"  - {c}" for c in failure.calls) or "  (none)"
    expected = "abstain without changing anything" if failure.side == "abstain" else "complete the request"
    guessed = f"\nCalls on ids it had seen nowhere (guessed): {'; '.join(failure.guesses)}" if failure.guesses else ""
    return (f"Task: {failure.instruction}\nExpected: {expected}; failure: {failure.kind.replace('_', ' ')} "
            f"({failure.category.replace('_', ' ')}), ended by {failure.termination}\nTool calls:\n{calls}{guessed}\n"
            f"Final answer: {failure.answer}")


def stage(parent: Path, dest: Path, manifest: dict[str, Any]) -> Path:
    """A copy of `parent` at `dest` with a new manifest."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(parent, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return dest


def editable_path(staging: Path, rel: str) -> Path:
    """`staging/rel` when it is an editable file of the bundle; raises EditError otherwise."""
    root = staging.resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or path == root:
        raise EditError(f"{rel}: outside the bundle")
    if path.relative_to(root).parts[0] not in EDITABLE:
        raise EditError(f"{rel}: not an editable component (editable: {', '.join(EDITABLE)})")
    return path


NOTHING = {"none", "null", "n/a", "(none)", "empty", "(empty)"}  # what a small model writes for an empty field


def new_prompt_text(addition: str, shown: str) -> str:
    """What a system-prompt addition really adds to the harness `shown` to the
    model: without the lines it echoes from that view (the prompt, its fences,
    the summary line), repeated lines, the `$context` placeholder, which a
    small model copies into its paragraph, and "None" for nothing."""
    seen = {line.strip() for line in shown.splitlines() if line.strip()}
    kept = []
    for line in re.sub(r"\$+context\b", "", addition).splitlines():
        key = line.strip()
        if key in seen or key.startswith(("System prompt:", "Turn limit:", "Action mode:")) or key.casefold() in NOTHING:
            continue
        if key:
            seen.add(key)
        kept.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()


def apply_edit(staging: Path, edit: HarnessEdit) -> list[str]:
    """Writes a structured edit into the staging bundle; notes on what was dropped."""
    notes = []
    system = staging / "prompts" / "system.md"
    text = system.read_text()
    addition = new_prompt_text(edit.system_prompt_addition, f"<<<\n{text}\n>>>").replace("$", "$$")  # the view describe_bundle gave
    if addition:
        head, marker, tail = text.rpartition("$context")
        system.write_text(f"{head.rstrip()}\n\n{addition}\n\n{marker}{tail}" if marker else f"{text.rstrip()}\n\n{addition}\n")
    chosen = []
    for c in edit.components:
        try:
            if c.name not in LIBRARY:
                raise ValueError("unknown component")
            LIBRARY[c.name].Params.model_validate(c.params)
            chosen.append({"name": c.name, "params": c.params} if c.params else {"name": c.name})
        except ValueError as exc:
            notes.append(f"component {c.name} dropped: {str(exc).splitlines()[0]}")
    unique = list({c["name"]: c for c in chosen}.values())
    if unique or (staging / "components.yaml").exists():  # no file and no component: nothing to write, nothing changed
        (staging / "components.yaml").write_text(yaml.safe_dump(unique, sort_keys=False))
    for skill in edit.skills:
        sid = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in skill.id.lower()).strip("-") or "skill"
        (staging / "skills").mkdir(exist_ok=True)
        (staging / "skills" / f"{sid}.md").write_text(f"{skill.title.strip()}\nWhen: {skill.pattern.strip()}\nDo: {skill.tip.strip()}\n")
    if edit.max_turns is not None or edit.action_mode is not None:
        config = yaml.safe_load((staging / "config.yaml").read_text()) or {}
        if edit.max_turns is not None:
            config["max_turns"] = max(MIN_TURNS, min(MAX_TURNS, edit.max_turns))
        if edit.action_mode is not None:
            config["action_mode"] = edit.action_mode
        (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return notes


def built_for(group: str, current: dict[str, dict]) -> list[str]:
    """The library's components built for a failure group (`Component.built_for`) that the harness (its `current`
    components) lacks."""
    return [c.name for c in LIBRARY.values() if c.built_for(group) and c.name not in current]


def nothing_changed(group: str | None, current: dict[str, dict]) -> str:
    """Why an edit that leaves the harness as it was is rejected, with the components built for the failure group the
    candidate starts from that the harness lacks (the local model, told only that its edit changed nothing, sent the
    same list of current components back)."""
    missing = built_for(group, current) if group else []
    return "it changes nothing in the harness" + (
        f"; components built for {group.split('/')[0].replace('_', ' ')} that it does not have: {', '.join(missing)}" if missing else "")


def _current_components(staging: Path) -> dict[str, dict]:
    raw = yaml.safe_load((staging / "components.yaml").read_text()) if (staging / "components.yaml").is_file() else None
    return {c["name"]: c.get("params") or {} for c in raw or []}


async def structured_edit(staging: Path, brief: str, harness: str, model: str, timeout_s: float, groups: list[str] = (),
                          taken: tuple[str, ...] = (), private: frozenset[str] = frozenset(),
                          replay: Replay | None = None) -> tuple[list[str], list[UsageRecord], list[str]]:
    """Channel (i): one schema-constrained edit, checked by code and applied to the staging copy; a rejected edit is
    asked for again with the reasons, up to EDIT_ASKS times, the last one kept without its failing skills and prompt
    addition when its components pass (`salvaged`). Notes, usage, and the problems of the last ask when none
    passed. An edit that leaves the bundle as it was, or as one of the bundles whose signatures are `taken`, is rejected."""
    llm = chat_model(model, role="harness_optimizer", timeout_s=timeout_s)
    current = await asyncio.to_thread(_current_components, staging)
    schema = edit_schema(list(groups), len(current) + MAX_COMPONENT_CHANGES)
    messages: list[BaseMessage] = [HumanMessage(render("harness_optimizer", harness=harness, brief=brief, components=catalog_text(groups, replay),
                                                       max_changes=str(MAX_COMPONENT_CHANGES)))]
    usage, before = [], await asyncio.to_thread(signature, staging)
    for ask in range(1, EDIT_ASKS + 1):
        edit, used = await llm.structured(messages, schema)
        usage.append(used)
        problems, dropped = edit_problems(edit, current, list(groups), private=private, replay=replay), []
        if problems and ask == EDIT_ASKS and (kept := salvaged(edit, current, list(groups), brief, private, replay)):
            (edit, dropped), problems = kept, []
        if not problems:
            backup = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="hera-edit-"))
            await asyncio.to_thread(shutil.copytree, staging, backup / "b", dirs_exist_ok=True)
            notes = dropped + await asyncio.to_thread(apply_edit, staging, edit)
            after = await asyncio.to_thread(signature, staging)
            if after == before:
                problems = [nothing_changed(groups[0] if groups else None, current)]
            elif after in taken:
                problems = ["it makes the same harness as an earlier candidate of this block; make a different edit"]
            if problems:
                await asyncio.to_thread(_restore, staging, backup / "b")
            await asyncio.to_thread(shutil.rmtree, backup, True)
            if not problems:
                return notes, usage, []
        messages += [AIMessage(edit.model_dump_json()),
                     HumanMessage("This edit was rejected: " + "; ".join(problems) + ". Write the edit again.")]
    return [f"edit rejected after {EDIT_ASKS} asks"], usage, problems


def _restore(staging: Path, backup: Path) -> None:
    shutil.rmtree(staging)
    shutil.copytree(backup, staging)


FILE_TOOLS = [
    ToolInfo(name="list_files", description="Lists the bundle's files.", input_schema={"type": "object", "properties": {}}, read_only=True),
    ToolInfo(name="read_file", description="Reads one file of the bundle.",
             input_schema={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}, read_only=True),
    ToolInfo(name="write_file", description="Writes (creates or replaces) one editable file.", read_only=False,
             input_schema={"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}),
    ToolInfo(name="replace_in_file", description="Replaces one exact occurrence of `old` with `new` in an editable file.", read_only=False,
             input_schema={"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                           "required": ["path", "old", "new"]}),
    ToolInfo(name="run_checks", description="Loads the bundle and drives every hook once in the sandbox; lists the problems.",
             input_schema={"type": "object", "properties": {}}, read_only=True),
    ToolInfo(name="finish", description="Ends the edit.", input_schema={"type": "object", "properties": {"summary": {"type": "string"}}}, read_only=True),
]


def file_tool(staging: Path, name: str, args: dict[str, Any]) -> str:
    """One file tool call on the staging copy; the text the agent sees."""
    if name == "list_files":
        return "\n".join(str(p.relative_to(staging)) for p in sorted(staging.rglob("*")) if p.is_file() and "__pycache__" not in p.parts)
    if name == "run_checks":
        return "\n".join(check_bundle(staging)) or "no problems"
    path = args.get("path", "")
    if name == "read_file":
        target = (staging / path).resolve()
        if not target.is_relative_to(staging.resolve()) or not target.is_file():
            raise EditError(f"{path}: no such file in the bundle")
        return target.read_text()
    target = editable_path(staging, path)
    if name == "write_file":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(args.get("content", ""))
        return f"wrote {path}"
    if name == "replace_in_file":
        text = target.read_text() if target.is_file() else ""
        if text.count(args.get("old", "")) != 1 or not args.get("old"):
            raise EditError(f"{path}: `old` must occur exactly once")
        target.write_text(text.replace(args["old"], args.get("new", ""), 1))
        return f"edited {path}"
    raise EditError(f"unknown tool {name}")


async def code_edit(staging: Path, brief: str, harness: str, model: str, timeout_s: float = 1800.0,
                    max_steps: int = MAX_STEPS) -> tuple[list[str], list[UsageRecord]]:
    """Channel (ii): a tool loop over the staging copy until `finish` or `max_steps`."""
    llm = chat_model(model, role="harness_optimizer", timeout_s=timeout_s)
    messages: list[BaseMessage] = [HumanMessage(render("harness_coder", harness=harness, brief=brief, components=catalog_text(),
                                                       editable=", ".join(EDITABLE)))]
    usage, notes = [], []
    for _ in range(max_steps):
        done = await llm.complete(messages, FILE_TOOLS, max_tokens=4096)
        usage.append(done.usage)
        messages.append(done.message)
        if not done.message.tool_calls:
            break
        finished = False
        for call in done.message.tool_calls:
            try:
                result = await asyncio.to_thread(file_tool, staging, call["name"], call.get("args") or {}) if call["name"] != "finish" else "done"
            except EditError as exc:
                result = f"refused: {exc}"
                notes.append(result)
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
            finished |= call["name"] == "finish"
        if finished:
            break
    else:
        notes.append(f"stopped after {max_steps} steps")
    return notes, usage


async def optimize_harness(staging: Path, brief: str, harness: str, model: str, channel: Channel, timeout_s: float = 1800.0,
                           groups: list[str] = (), taken: tuple[str, ...] = (),
                           private: frozenset[str] = frozenset(), replay: Replay | None = None) -> tuple[list[str], list[UsageRecord], list[str]]:
    """Edits the staging bundle from `brief` (a modification spec or one failure); notes, usage and the edit's
    problems (none when it was applied). A structured edit that quotes a `private` value of the pool is asked for
    again; a code edit is left to the leakage lint. `replay`: the library over the parent's training episodes, shown
    with the components."""
    if channel == "structured":
        return await structured_edit(staging, brief, harness, model, timeout_s, groups, taken, private, replay)
    notes, usage = await code_edit(staging, brief, harness, model, timeout_s)
    return notes, usage, []
