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
from pathlib import Path
from typing import Any, Literal

import yaml
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from harness.bundle import Bundle
from harness.check import check_bundle
from harness.components import LIBRARY, ComponentName, catalog_text
from prompts import render
from roles.models import chat_model
from state.evolution import ComponentChoice, FailureRecord, HarnessEdit, ModificationSpec
from state.records import ToolInfo, UsageRecord

EDITABLE = ("prompts", "skills", "subagents", "hooks.py", "components.yaml", "config.yaml", "memory.yaml")
Channel = Literal["structured", "code"]
MAX_STEPS = 12
MIN_TURNS, MAX_TURNS = 5, 30


class EditError(Exception):
    """A file operation the coding agent may not do; reported back to it as the tool's result."""


class _Choice(ComponentChoice):
    name: ComponentName  # type: ignore[valid-type]


class StructuredEdit(HarnessEdit):
    """`HarnessEdit` with component names constrained to the library, for the response format."""

    components: list[_Choice] = []


def describe_bundle(bundle: Bundle) -> str:
    """The harness as the review roles read it."""
    components = ", ".join(f"{c.name}{json.dumps(c.params) if c.params else ''}" for c in bundle.components) or "none"
    skills = "; ".join(bundle.skills) or "none"
    return (f"System prompt:\n<<<\n{bundle.prompts['system'].strip()}\n>>>\nTurn limit: {bundle.config.max_turns}. "
            f"Enabled components: {components}. Skills: {skills}.")


def spec_text(spec: ModificationSpec) -> str:
    return json.dumps(spec.model_dump(), indent=1)


def failure_text(failure: FailureRecord) -> str:
    calls = "\n".join(f"  - {c}" for c in failure.calls) or "  (none)"
    expected = "abstain without changing anything" if failure.side == "abstain" else "complete the request"
    return (f"Task: {failure.instruction}\nExpected: {expected}; failure: {failure.kind.replace('_', ' ')} "
            f"({failure.category.replace('_', ' ')}), ended by {failure.termination}\nTool calls:\n{calls}\nFinal answer: {failure.answer}")


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
        if key in seen or key.startswith(("System prompt:", "Turn limit:")) or key.casefold() in NOTHING:
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
    (staging / "components.yaml").write_text(yaml.safe_dump(unique, sort_keys=False))
    for skill in edit.skills:
        sid = "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in skill.id.lower()).strip("-") or "skill"
        (staging / "skills").mkdir(exist_ok=True)
        (staging / "skills" / f"{sid}.md").write_text(f"{skill.title.strip()}\nWhen: {skill.pattern.strip()}\nDo: {skill.tip.strip()}\n")
    if edit.max_turns is not None:
        config = yaml.safe_load((staging / "config.yaml").read_text()) or {}
        config["max_turns"] = max(MIN_TURNS, min(MAX_TURNS, edit.max_turns))
        (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return notes


async def structured_edit(staging: Path, brief: str, harness: str, model: str, timeout_s: float) -> tuple[list[str], list[UsageRecord]]:
    """Channel (i): one schema-constrained edit, applied to the staging copy."""
    prompt = render("harness_optimizer", harness=harness, brief=brief, components=catalog_text())
    edit, usage = await chat_model(model, role="harness_optimizer", timeout_s=timeout_s).structured([HumanMessage(prompt)], StructuredEdit)
    return await asyncio.to_thread(apply_edit, staging, edit), [usage]


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


async def harness_optimizer(staging: Path, brief: str, harness: str, model: str, channel: Channel,
                            timeout_s: float = 1800.0) -> tuple[list[str], list[UsageRecord]]:
    """Edits the staging bundle from `brief` (a modification spec or one failure); notes and usage."""
    edit = structured_edit if channel == "structured" else code_edit
    return await edit(staging, brief, harness, model, timeout_s)
