"""Tools code that is not the project's own, run only in the sandbox.

A custom catalog's or a generated environment's `tools.py` is untrusted: this
process never imports it (`envs.spec.shipped`). `describe` reads its tools'
public faces in a sandboxed child; `ToolProcess` serves one environment
instance (database and tools) from a sandboxed child for as long as the
instance lives, every call answered within `CALL_TIMEOUT_S` or the child is
killed and the call is an environment fault (`internal_error`), never the
agent's.

    python -m envs.tool_child describe SOURCE ORIGIN  one JSON line: {"tools"} | {"field", "expected"}
    python -m envs.tool_child serve SPEC              {"op": "call" | "rows", ...} lines in, {"value"} | {"error"} lines out
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from envs.errors import SpecError
from envs.sandbox import die_with_parent, kill, run_sandboxed, sandbox_command, scratch, workspace
from state.records import EnvironmentSpec, Observation, ToolInfo, lone_surrogate

CALL_TIMEOUT_S = float(os.environ.get("HERA_TOOL_TIMEOUT_S", 30))
STARTUP_S = 60.0  # starting the sandboxed interpreter and building the database, on a loaded machine
LINE_LIMIT = 16 << 20


class EnvironmentFault(RuntimeError):
    """Untrusted tools code crashed, hung or broke the protocol: the environment's fault."""


@lru_cache(maxsize=64)
def describe(source: str, origin: str) -> dict[str, ToolInfo]:
    """The public faces of a tools module, found by importing it in the sandbox;
    a module that does not load raises `SpecError` naming `origin`."""
    with workspace("describe") as tmp:
        (tmp / "tools.py").write_text(source)
        try:
            done = run_sandboxed(["-m", "envs.tool_child", "describe", "tools.py", origin], timeout_s=STARTUP_S, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise SpecError(origin, "(module)", f"a module that loads within {STARTUP_S:g}s in the sandbox (an endless loop at import?)") from None
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SpecError(origin, "(module)", f"a module that loads in the sandbox (exit {done.returncode}): {done.stderr.strip()[-600:]}") from None
    if "tools" not in reply:
        raise SpecError(origin, reply.get("field", "(module)"), reply.get("expected", str(reply)))
    return {t["name"]: ToolInfo.model_validate(t) for t in reply["tools"]}


class ToolProcess:
    """One environment instance whose database and tools live in a sandboxed child."""

    def __init__(self, spec: EnvironmentSpec, call_timeout_s: float | None = None, memory_mb: int = 1024, cpu_s: int = 3600):
        self.call_timeout_s = call_timeout_s or CALL_TIMEOUT_S
        self._workdir = scratch("env")
        (self._workdir / "spec.json").write_text(spec.model_dump_json())
        argv, env = sandbox_command(["-m", "envs.tool_child", "serve", "spec.json"], workdir=self._workdir, cpu_s=cpu_s, memory_mb=memory_mb)
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
                                      cwd=self._workdir, start_new_session=True, preexec_fn=die_with_parent)
        self._buffer = b""
        self.fault: str | None = None
        self._request({"op": "ready"}, STARTUP_S)

    def call(self, name: str, args: dict[str, Any]) -> Observation:
        """One tool call; a fault (now or earlier) is an `internal_error` observation."""
        try:
            reply = self._request({"op": "call", "tool": name, "args": args}, self.call_timeout_s)
            try:
                return Observation.model_validate(reply)
            except ValidationError:
                raise self._gone(f"broke the protocol: answered {json.dumps(reply, default=str)[:200]}, which is no tool result") from None
        except EnvironmentFault as exc:
            return Observation(tool=name, args=args, ok=False, error_code="internal_error", message=f"{name}: {exc}")

    def rows(self) -> dict[str, list[dict]]:
        return self._request({"op": "rows"}, self.call_timeout_s)

    def close(self) -> None:
        kill(self._proc.pid)
        self._proc.wait()
        self._stderr.close()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def _request(self, message: dict, timeout_s: float) -> Any:
        if self.fault:
            raise EnvironmentFault(f"the environment's sandboxed tools process is gone: {self.fault}")
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
            line = self._line(timeout_s)
            reply = json.loads(line)
            if (around := lone_surrogate(line.decode(errors="replace"), reply)) is not None:
                raise EnvironmentFault(f"broke the protocol: sent text that is not Unicode (a lone surrogate, in {around!r})")
        except (BrokenPipeError, OSError, json.JSONDecodeError, EnvironmentFault) as exc:
            raise self._gone(str(exc) if isinstance(exc, EnvironmentFault) else self._death()) from None
        if "error" in reply:
            raise EnvironmentFault(reply["error"])
        return reply.get("value")

    def _gone(self, why: str) -> EnvironmentFault:
        """The child is no longer trusted to answer: killed, and every later call the fault `why`."""
        self.fault = why
        kill(self._proc.pid)
        return EnvironmentFault(why)

    def _line(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise EnvironmentFault(f"did not answer within {timeout_s:g}s (a tool that never returns?)")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EnvironmentFault(self._death())
            self._buffer += chunk
            if len(self._buffer) > LINE_LIMIT:
                raise EnvironmentFault(f"answered over {LINE_LIMIT >> 20} MB")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _death(self) -> str:
        try:
            code = self._proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip()[-1500:]
        why = f"killed by signal {-code} (a CPU, memory or process limit?)" if code is not None and code < 0 else f"exited ({code})"
        return f"the sandboxed tools process {why}" + (f": {tail}" if tail else "")
