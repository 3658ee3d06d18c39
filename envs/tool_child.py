"""The sandboxed child's side of `envs.untrusted`: serves one environment instance over a line protocol on
stdin/stdout (`serve SPEC`), or lists a tools module's public faces (`describe TOOLS ORIGIN`). It runs only
inside the sandbox, where the tools code it is given runs in it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from envs.runtime import EnvInstance
from envs.sandbox import private_stdio
from envs.spec import SpecError, _compile_tools, run_untrusted_here
from state.records import EnvironmentSpec


def _serve(path: str) -> None:
    lines, out = private_stdio()
    instance = None
    for line in lines:
        request = json.loads(line)
        try:
            if instance is None:
                instance = EnvInstance(EnvironmentSpec.model_validate_json(Path(path).read_text()))
            if request["op"] == "call":
                value = instance.call(request["tool"], request.get("args") or {}).model_dump(mode="json")
            elif request["op"] == "rows":
                value = instance.rows()
            else:
                value = None
            reply = {"value": value}
        except Exception as exc:  # escaped the runtime's guard: report it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


def _describe(path: str, origin: str) -> None:
    _, out = private_stdio()
    try:
        reply = {"tools": [t.info.model_dump(mode="json") for t in _compile_tools(Path(path).read_text(), origin).values()]}
    except SpecError as exc:
        reply = {"field": exc.field, "expected": exc.expected}
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()


if __name__ == "__main__":
    run_untrusted_here()
    {"serve": _serve, "describe": _describe}[sys.argv[1]](*sys.argv[2:])
