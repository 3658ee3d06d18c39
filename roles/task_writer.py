"""The task writer: the request of a task whose change is given (a task seed, `envs.seeds`), in a user's words.

A small model cannot propose a task and its verification rules at once (it wrote answer values the data
contradicts and requests that name no record); the change, the records it names and its checks come from
running the environment's own write tools, so the writer words only the request (HERA App. B.2, task
generation: a natural goal that states the outcome wanted and never the answer)."""

from __future__ import annotations

import json
import re

from langchain_core.messages import HumanMessage

from prompts import render
from roles.models import chat_model
from state.construction import TaskRequest, TaskSeed
from state.records import UsageRecord


def describe_seed(seed: TaskSeed) -> dict[str, str]:
    """The seed as the prompt's parts: the change, the records, the details, what the user asks to be told."""
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in seed.args.items())
    names = [f"- the {_stem(n.arg)} {n.label!r}" if n.label else f"- {_stem(n.arg)} {n.key} (by its id)" for n in seed.named]
    details = [f"- {k.replace('_', ' ')}: {json.dumps(v, ensure_ascii=False)}" for k, v in seed.details.items()]
    return {"change": f"{seed.description.rstrip('.')} ({seed.tool}({args})).", "names": "\n".join(names) or "- (none)",
            "details": ("The details the request gives:\n" + "\n".join(details)) if details else "",
            "asked": " and ".join(f"the {c.name.replace('_', ' ')}" for c in seed.answer) or "that it is done"}


async def write_request(context: str, seed: TaskSeed, feedback: str, model: str, timeout_s: float = 1800.0) -> tuple[TaskRequest, UsageRecord]:
    prompt = render("task_writer", context=context, feedback=feedback or "(first attempt)", **describe_seed(seed))
    return await chat_model(model, role="task_writer", timeout_s=timeout_s).structured([HumanMessage(prompt)], TaskRequest)


def _stem(arg: str) -> str:
    """What a key argument names: `bike_id` a bike."""
    return re.sub(r"[_ ]?(id|key|code|number|no|ref)$", "", arg, flags=re.I).replace("_", " ") or arg
