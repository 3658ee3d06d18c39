"""The tool coder: a tools module over a database, with the calls each tool
promises to accept and refuse (HERA App. B.1 "Tool generation"). Its tools
are asked for as code, in a fenced block, to be added to a module that runs
(`envs.construct.starting_module`), not as a string inside JSON; the
declarations of the tools it added come in a second, grammar-constrained
call whose tool names are the module's own. On a retry it gets back its
previous functions and the problems found by running them."""

from __future__ import annotations

import ast
from typing import Any, Literal

from langchain_core.messages import HumanMessage
from pydantic import Field, create_model

from envs.construct import module_code
from prompts import render
from roles.models import chat_model
from state.construction import InvalidCall, ToolDeclaration
from state.records import Record, UsageRecord

CODE_MAX_TOKENS = 3000


async def code_tools(database: str, starting: str, example: str, previous: str, feedback: str, model: str, timeout_s: float = 1800.0,
                     temperature: float | None = None) -> tuple[str, UsageRecord]:
    """The functions to add to the starting module (the code of the reply's fenced block)."""
    prompt = render("tool_coder", database=database, starting=starting.rstrip(), example=example, previous=previous.rstrip() or "(none yet)",
                    feedback=feedback or "(first attempt)")
    done = await chat_model(model, role="tool_coder", timeout_s=timeout_s).complete([HumanMessage(prompt)], max_tokens=CODE_MAX_TOKENS,
                                                                                   temperature=temperature)
    return module_code(str(done.message.content)), done.usage


def declarations_schema(tools: dict[str, tuple[bool, bool]], tables: list[str]) -> type[Record]:
    """Declarations of the named tools (`tools`: name → whether it takes arguments, whether it is a read tool), one
    required entry each, read-only as its decorator says, whose changed tables are the database's (a grammar enum:
    none for a read tool, one or more for a write tool) and which, for a tool with arguments, refuse at least one call."""
    fields: dict[str, Any] = {}
    for i, (name, (takes_args, read_only)) in enumerate(tools.items()):
        declared = create_model(f"Declared{i}", __base__=ToolDeclaration, name=(Literal[name], name),  # type: ignore[valid-type]
                                read_only=(Literal[read_only], read_only),  # type: ignore[valid-type]
                                invalid=(list[InvalidCall], Field(min_length=1) if takes_args else Field(default_factory=list)),
                                changes=(list[Literal[tuple(tables)]], Field(max_length=0, default_factory=list) if read_only  # type: ignore[valid-type]
                                         else Field(min_length=1)))
        fields[f"t{i}"] = (declared, Field(alias=name))
    return create_model("ToolDeclarations", __base__=Record, **fields)


def _shapes(code: str, names: list[str]) -> dict[str, tuple[bool, bool]]:
    """Each named function's (takes arguments besides `db`, is decorated as a read tool)."""
    functions = {f.name: f for f in ast.parse(code).body if isinstance(f, ast.FunctionDef)}
    return {n: (len(functions[n].args.args) + len(functions[n].args.kwonlyargs) > 1,
                not any("write_tool" in ast.unparse(d) for d in functions[n].decorator_list)) for n in names}


async def declare_tools(database: str, code: str, names: list[str], tables: list[str], model: str,
                            timeout_s: float = 1800.0) -> tuple[list[ToolDeclaration], UsageRecord]:
    """How each named tool of the module behaves: its result's schema, calls that succeed and calls it refuses."""
    prompt = render("tool_declarations", database=database, code=code.rstrip(), names=", ".join(names))
    reply, usage = await chat_model(model, role="tool_coder", timeout_s=timeout_s).structured(
        [HumanMessage(prompt)], declarations_schema(_shapes(code, names), tables))
    return [ToolDeclaration.model_validate(d.model_dump()) for d in dict(reply).values()], usage
