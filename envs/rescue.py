"""Bounded rescue search: is there another public route to what a mutation broke?

Starting from the values in the instruction and the reference arguments, the
search calls every read tool with every known value of a fitting kind, adds
each new value it observes, and repeats until nothing new can be called or the
call budget is spent. A parameter's own values are those seen under a key of
the same name or a related one (any `*_id` for an `*_id`); the required
parameters take every combination of their own values, and the untyped ones
(instruction tokens, and those a refusal's message names) are tried one
parameter at a time on top of the first combination, so the search ends on the catalog instead of crossing every
token with every other. A parameter with no own values takes the untyped ones
in the combination; optional parameters are varied one at a time (open
filters on the first combination only). It reports
the first observation containing a witness object; only an exhausted search
shows that no route exists.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Callable

from envs.match import find_object
from envs.runtime import EnvInstance
from state.records import EnvironmentSpec, Observation, Row, TaskSpec

MAX_CALLS = 10000  # the built-in catalog exhausts within 6,000 (median 617)
PER_TOOL_ROUND = 400


@dataclass(frozen=True)
class RescueResult:
    found: Observation | None
    calls: int
    exhausted: bool


class Values:
    def __init__(self) -> None:
        self.by_key: dict[str, list[Any]] = {}
        self.untyped: list[Any] = []
        self._seen: set[tuple[str, Any]] = set()
        self._values: set[Any] = set()

    def add(self, key: str | None, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return
        if isinstance(value, str) and not 0 < len(value) <= 80:
            return
        marker = (key or "", value)
        if marker in self._seen:
            return
        self._seen.add(marker)
        self._values.add(value)
        (self.by_key.setdefault(key, []) if key else self.untyped).append(value)

    def known(self, value: Any) -> bool:
        return value in self._values

    def harvest(self, value: Any, key: str | None = None) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                self.harvest(v, k)
        elif isinstance(value, list):
            for v in value:
                self.harvest(v, key)
        else:
            self.add(key, value)

    def for_param(self, name: str, schema: dict) -> tuple[list[Any], list[Any]]:
        """A parameter's own values and the untyped ones left to try, for
        this JSON schema (a tool's public face)."""
        if "enum" in schema or "const" in schema:
            return list(schema.get("enum", [schema.get("const")])), []
        if "anyOf" in schema:  # Optional[X]
            inner = [s for s in schema["anyOf"] if s.get("type") != "null"]
            return self.for_param(name, inner[0]) if inner else ([], [])
        if schema.get("type") == "boolean":
            return [True, False], []
        if schema.get("type") == "array":
            own, loose = self.for_param(name, schema.get("items", {}))
            return [[v] for v in own], [[v] for v in loose]
        related = [k for k in self.by_key if k != name and _related(k, name)]
        kind = {"integer": int, "number": (int, float)}.get(schema.get("type"), str)
        own = _fitting(self.by_key.get(name, []) + [v for k in related for v in self.by_key[k]], kind)
        return own, [v for v in _fitting(self.untyped, kind) if v not in own]


def _fitting(pool: list[Any], kind) -> list[Any]:
    out = []
    for v in pool:
        if isinstance(v, kind) and v not in out:
            out.append(v)
        elif kind is int and isinstance(v, str) and v.isdigit() and int(v) not in out:
            out.append(int(v))
    return out


def _related(key: str, param: str) -> bool:
    """`id` feeds `order_id`, `patient_id` feeds `id`, and any `*_id` feeds any `*_id`."""
    if key.endswith(param) or param.endswith(key):
        return True
    return key.endswith("_id") and param.endswith("_id")


def tokens(text: str) -> list[str]:
    """Quoted phrases, identifiers (a capital, then a digit somewhere) and ISO dates in prose."""
    return [q or t for q, t in re.findall(r'"([^"]+)"|\b([A-Z][\w-]*\d[\w-]*|\d{4}-\d{2}-\d{2})\b', text)]


def seeds(task: TaskSpec) -> Values:
    values = Values()
    for token in tokens(task.instruction):
        values.add(None, token)
    for call in task.reference.calls:
        for key, value in call.args.items():
            values.harvest(value, key)
            values.harvest(value)
    return values


def arguments(tool, values: Values):
    """Every combination of the required parameters' own values, each
    untyped value in one required parameter on top of the first combination,
    then each optional parameter varied alone: a closed one on top of every
    combination, an open one on top of the first."""
    fields = tool.input_schema.get("properties", {})
    required = [n for n in fields if n in tool.input_schema.get("required", ())]
    pools = {n: values.for_param(n, schema) for n, schema in fields.items()}
    combined = [pools[n][0] or pools[n][1] for n in required]
    if not all(combined):
        return
    first = dict(zip(required, (pool[0] for pool in combined)))
    bases = itertools.chain(
        (dict(zip(required, combo)) for combo in itertools.product(*combined)),
        ({**first, n: v} for n in required if pools[n][0] for v in pools[n][1]),
    )
    optional = [n for n in fields if n not in required]
    for i, base in enumerate(bases):
        yield base
        for name in optional:
            # an open filter only narrows what the unfiltered call shows: varied on the first combination
            if i == 0 or _closed(fields[name]):
                for value in pools[name][0] + pools[name][1]:
                    yield {**base, name: value}


def _closed(schema: dict) -> bool:
    """An enum, constant or boolean: a parameter whose few values may each show something else."""
    inner = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    return any("enum" in s or "const" in s or s.get("type") == "boolean" for s in inner)


def rescue_search(env: EnvironmentSpec, task: TaskSpec, witness: tuple[Row, ...], max_calls: int = MAX_CALLS) -> RescueResult:
    """The first observation showing a witness object, if the search reaches one."""
    return explore(env, task, lambda obs: obs.ok and any(find_object(w, obs.output) for w in witness), max_calls)


def explore(env: EnvironmentSpec, task: TaskSpec, stop: Callable[[Observation], bool], max_calls: int = MAX_CALLS) -> RescueResult:
    """Search the read tools, showing `stop` every observation, until it returns true."""
    instance = EnvInstance(env)
    values = seeds(task)
    tried: set[str] = set()
    read_tools = [t for t in instance.public_tools if t.read_only]
    calls = 0
    try:
        while True:
            progressed = False
            for tool in read_tools:
                made = 0
                for args in arguments(tool, values):
                    signature = f"{tool.name}:{sorted(args.items(), key=str)}"
                    if signature in tried:
                        continue
                    if calls >= max_calls or made >= PER_TOOL_ROUND:
                        break
                    tried.add(signature)
                    calls += 1
                    made += 1
                    progressed = True
                    obs = instance.call(tool.name, args)
                    if stop(obs):
                        return RescueResult(found=obs, calls=calls, exhausted=False)
                    if not obs.ok:
                        # a refusal may name records ("matches 2 points: A-1; B-2"), as it would to an agent
                        for token in tokens(obs.message):
                            if not values.known(token):
                                values.add(None, token)
                        continue
                    values.harvest(obs.output)
            if calls >= max_calls:
                return RescueResult(found=None, calls=calls, exhausted=False)
            if not progressed:
                return RescueResult(found=None, calls=calls, exhausted=True)
    finally:
        instance.close()
