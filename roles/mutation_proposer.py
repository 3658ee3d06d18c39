"""The mutation proposer: given one training pair's feasible environment and
task, a target category and the harness's diagnosed weakness, it writes a
controlled environment mutation that should make the task infeasible while
the instruction and the public tools stay the same (HERA §3.1, App. B.3).
It sees only the training parent: its schema, a few rows, its tools, the
task and the reference trajectory. The menu proposer, for a small model,
only chooses one of the changes `envs.menu` derived from the parent and
describes it."""

from __future__ import annotations

import json
from typing import Literal

from langchain_core.messages import HumanMessage
from pydantic import Field, create_model

from envs.catalog import Parent
from envs.certify import replay
from envs.menu import Option
from envs.runtime import EnvInstance
from envs.spec import tool_infos
from prompts import render
from roles.models import chat_model
from state.records import Mutation, Record, UsageRecord

ROWS_SHOWN = 3  # of a table the reference solution reads or writes; one row of any other


def _params(schema: dict) -> str:
    """A tool's parameters as `name: type`, `?` marking the optional ones."""
    def kind(p: dict) -> str:
        if "enum" in p:
            return "|".join(json.dumps(v) for v in p["enum"])
        return "|".join(t["type"] for t in p.get("anyOf", [p]) if t.get("type") not in (None, "null")) or "any"

    required = set(schema.get("required", ()))
    return ", ".join(f"{name}{'' if name in required else '?'}: {kind(p)}" for name, p in schema.get("properties", {}).items())


def _sentence(text: str) -> str:
    """The first sentence of a wrapped description."""
    return " ".join(text.split()).split(". ")[0].rstrip(".") + "."


def describe_parent(entry: Parent) -> str:
    """The parent environment and task as a proposer or reviewer reads them."""
    env, task = entry.env, entry.task
    outcome = replay(env, task.reference.calls, task.reference.answer)
    seen = json.dumps([o.visible for o in outcome.calls], default=str)
    tables = []
    for t in env.tables:
        rows = env.rows.get(t.name, ())
        shown = [r for r in rows if str(r.get(t.primary_key)) in seen][:ROWS_SHOWN] or list(rows[:1])
        columns = ", ".join(f"{c.name}: {c.type}{'?' if c.nullable else ''}" for c in t.columns)
        tables.append(f"- {t.name} (primary key {t.primary_key}; {len(rows)} rows): {columns}\n"
                      + "\n".join(f"    {json.dumps(r, default=str)}" for r in shown))
    instance = EnvInstance(env)
    try:
        tools = "\n".join(f"- {t.name} ({'read' if t.read_only else 'write'}): {_sentence(t.description)} "
                          f"({_params(t.input_schema)})" for t in instance.public_tools)
    finally:
        instance.close()
    calls = "\n".join(f"- {o.tool}({json.dumps(o.args)}) -> {o.text[:500]}" for o in outcome.calls)
    return (f"Environment: {env.description.strip()}\n\nTables:\n" + "\n".join(tables) + f"\n\nTools:\n{tools}\n\n"
            f"Task (feasible here): {task.instruction.strip()}\n\nReference solution:\n{calls}\nAnswer: {task.reference.answer}")


async def propose_mutation(parent: str, category: str, idea: str, weakness: str, feedback: str, model: str,
                            timeout_s: float = 1800.0) -> tuple[Mutation, UsageRecord]:
    """One proposed mutation of the parent's environment."""
    prompt = render("mutation_proposer", parent=parent, category=category.replace("_", " "), idea=idea or "(your choice)",
                    weakness=weakness or "(none diagnosed)", feedback=feedback or "(first attempt)")
    return await chat_model(model, role="mutation_proposer", timeout_s=timeout_s).structured([HumanMessage(prompt)], Mutation)


def choice_schema(options: list[Option]) -> type[Record]:
    """The menu proposer's response format: the option ids as an enum, so the grammar admits no other choice."""
    ids = tuple(o.id for o in options)
    return create_model("MenuChoice", __base__=Record, option=(Literal[ids], Field(description="the id of the chosen change")),  # type: ignore[valid-type]
                        description=(str, Field(description="what changed, in one sentence")),
                        requirement=(str, Field(description="which requirement of the request it breaks, in one sentence")))


def describe_task(entry: Parent) -> str:
    """The parent task and its reference calls, as short as a small model reads well."""
    task = entry.task
    outcome = replay(entry.env, task.reference.calls, task.reference.answer)
    calls = "\n".join(f"- {o.tool}({json.dumps(o.args, ensure_ascii=False)}) -> {o.text[:160]}" for o in outcome.calls)
    tools = "\n".join(f"- {t.name} ({'read' if t.read_only else 'write'}) ({_params(t.input_schema)})" for t in tool_infos(entry.env).values())
    return (f"Tools:\n{tools}\n\nTask (feasible now): {task.instruction.strip()}\n\nReference solution:\n{calls}\n"
            f"Answer: {task.reference.answer}")


async def propose_from_menu(task: str, options: list[Option], category: str, idea: str, weakness: str, feedback: str, model: str,
                        timeout_s: float = 1800.0) -> tuple[Option, Mutation, UsageRecord]:
    """One option chosen from the menu, described; its mutation carries the proposer's description and requirement."""
    prompt = render("menu_proposer", task=task, options="\n".join(o.line() for o in options), category=category.replace("_", " "),
                    idea=idea or "(your choice)", weakness=weakness or "(none diagnosed)", feedback=feedback or "(first attempt)")
    choice, usage = await chat_model(model, role="mutation_proposer", timeout_s=timeout_s).structured([HumanMessage(prompt)],
                                                                                                       choice_schema(options))
    option = next(o for o in options if o.id == choice.option)
    mutation = option.mutation.model_copy(update={"description": choice.description.strip() or option.summary,
                                                  "requirement": choice.requirement.strip()})
    return option, mutation, usage
