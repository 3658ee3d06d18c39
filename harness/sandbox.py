"""Run untrusted code (generated tools, harness candidates) in a contained child.

The child is started through this file run as a script, the jail: inside
fresh mount, network and PID namespaces it mounts an empty read-only tmpfs
over each private directory (the catalog with its labels, the runs directory
with the ledger, the test fixtures, the model cache), drops to a throwaway
unprivileged uid (or, when the evaluator is not root, into a nested user
namespace, which locks those mounts), sets CPU, memory, process-count and
file-size limits and execs the command with a scrubbed environment. The
project's code stays importable; only data is hidden. Where namespaces are
unavailable the jail falls back to `unshare -n`, then to limits only;
`isolation()` says which is in force, so a report never claims more than it got.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
Isolation = Literal["namespaces", "network", "none"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_PR_SET_NO_NEW_PRIVS = 38


def private_dirs() -> tuple[Path, ...]:
    """What a sandboxed child must not read: the catalog (pair files carry labels),
    the runs directory (the ledger's labels and certifications), the test
    fixtures, the model cache and the repository history (which holds all of them)."""
    # Imported here: the jail runs this file without the project's packages.
    from state.ledger import runs_dir

    return (ROOT / "envs" / "catalog", runs_dir().resolve(), ROOT / "tests" / "fixtures",
            Path.home() / ".cache" / "hera", ROOT / ".git")


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation that works here, probed once: `namespaces` (no
    network, private directories hidden, an unprivileged uid or a locked user
    namespace, a PID namespace that dies with the child), `network` (`unshare -n`
    only) or `none` (resource limits and a scrubbed environment only)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "none"
    with tempfile.TemporaryDirectory(prefix="hera-probe-") as tmp:
        os.chmod(tmp, 0o755)
        visible, secret = Path(tmp) / "work", Path(tmp) / "private" / "label"
        visible.mkdir()
        secret.parent.mkdir()
        secret.write_text("x")
        test = f"import os, sys; sys.exit(not os.path.isdir({str(visible)!r}) or os.path.exists({str(secret)!r}))"
        argv = _command([sys.executable, "-I", "-S", "-c", test], level="namespaces", hidden=[secret.parent],
                        workdir=visible, cpu_s=10, memory_mb=512, max_processes=8)
        if subprocess.run(argv, capture_output=True, env=_env(visible), timeout=30, check=False).returncode == 0:
            return "namespaces"
    if subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=30, check=False).returncode == 0:
        return "network"
    return "none"


def sandbox_command(args: list[str], *, workdir: Path, cpu_s: int, memory_mb: int = 1024, max_processes: int = 32,
                    hidden: list[Path] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run `python *args` in the sandbox, with
    `workdir` as its writable home; start it with `start_new_session=True`."""
    hidden = private_dirs() if hidden is None else hidden
    argv = _command([sys.executable, *args], level=isolation(), hidden=hidden, workdir=workdir,
                    cpu_s=cpu_s, memory_mb=memory_mb, max_processes=max_processes)
    return argv, _env(workdir)


def run_sandboxed(args: list[str], *, timeout_s: float = 30, memory_mb: int = 1024, max_processes: int = 32,
                  cwd: Path | None = None, hidden: list[Path] | None = None) -> subprocess.CompletedProcess:
    """Run `python *args` in the sandbox, in `cwd` (a fresh directory when None);
    raises `subprocess.TimeoutExpired` after `timeout_s`, with every process it started killed."""
    with tempfile.TemporaryDirectory(prefix="hera-sandbox-") as tmp:
        workdir = Path(cwd or tmp)
        argv, env = sandbox_command(args, workdir=workdir, cpu_s=max(1, int(timeout_s)), memory_mb=memory_mb,
                                    max_processes=max_processes, hidden=hidden)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=workdir, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc.pid)
            proc.communicate()
            raise
        finally:
            kill(proc.pid)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)


class ChildError(RuntimeError):
    """A sandboxed child died, hung, stopped reading or broke the JSON-lines protocol."""


class Child:
    """A sandboxed child that speaks JSON lines on its stdin and stdout. The
    last few kilobytes of its stderr are kept to say why it died; it is killed,
    with everything it started, by `close` or when its owner is collected."""

    LINE_LIMIT = 64 << 20

    def __init__(self, proc: asyncio.subprocess.Process, owner: object):
        self.proc = proc
        self.stderr = b""
        self._reaper = weakref.finalize(owner, kill, proc.pid)
        self._drain = asyncio.create_task(self._keep_stderr())

    @classmethod
    async def start(cls, args: list[str], *, workdir: Path, cpu_s: int, memory_mb: int, owner: object) -> Child:
        """`python *args` started in the sandbox, with `workdir` as its home."""
        argv, env = await asyncio.to_thread(sandbox_command, args, workdir=workdir, cpu_s=cpu_s, memory_mb=memory_mb)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=workdir, start_new_session=True, limit=cls.LINE_LIMIT)
        return cls(proc, owner)

    async def send(self, message: dict, timeout_s: float) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            await asyncio.wait_for(self.proc.stdin.drain(), timeout_s)
        except (BrokenPipeError, ConnectionResetError):
            raise ChildError(await self.death()) from None
        except TimeoutError:
            raise ChildError("the sandboxed child stopped reading") from None

    async def receive(self, timeout_s: float) -> dict:
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise ChildError(f"did not finish within {timeout_s:g}s") from None
        except (ValueError, asyncio.LimitOverrunError):
            raise ChildError(f"sent a reply over {self.LINE_LIMIT >> 20} MB") from None
        if not line:
            raise ChildError(await self.death())
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = None
        if not isinstance(reply, dict):
            raise ChildError(f"the sandboxed child sent garbage: {line[:200]!r}")
        return reply

    async def death(self) -> str:
        """Why the child is gone: its exit and the tail of its stderr."""
        try:
            code = await asyncio.wait_for(self.proc.wait(), 5)
        except TimeoutError:
            code = None
        await asyncio.wait([self._drain], timeout=1)
        why = f"killed by signal {-code} (a CPU, memory or process limit?)" if code is not None and code < 0 else f"exited ({code})"
        tail = self.stderr.decode(errors="replace").strip()
        return f"the sandboxed child {why}" + (f": {tail[-1500:]}" if tail else "")

    async def close(self) -> None:
        self._reaper.detach()
        kill(self.proc.pid)
        await self.proc.wait()
        await asyncio.wait([self._drain], timeout=1)
        self._drain.cancel()

    async def _keep_stderr(self) -> None:
        while chunk := await self.proc.stderr.read(4096):
            self.stderr = (self.stderr + chunk)[-4000:]


def stage(path: Path, workdir: Path, name: str = "bundle") -> Path:
    """A copy of the directory `path` in a sandbox's working directory: the
    original may sit under a hidden directory or one the child cannot enter."""
    copy = workdir / name
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def kill(pid: int) -> None:
    """Kill a sandboxed child's process group (its PID namespace dies with it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _env(workdir: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8",
            "HOME": str(workdir), "PYTHONDONTWRITEBYTECODE": "1"}


def _command(argv: list[str], *, level: Isolation, hidden, workdir: Path, cpu_s: int, memory_mb: int,
             max_processes: int) -> list[str]:
    root = os.geteuid() == 0
    prefix = {
        "namespaces": ["unshare", *([] if root else ["-r"]), "-m", "-n", "-p", "-f", "--kill-child", "--mount-proc"],
        "network": ["unshare", "-n"],
        "none": [],
    }[level]
    spec = {
        "hide": [str(p) for p in hidden] if level == "namespaces" else [],
        "lock": level == "namespaces" and not root,
        # A fresh uid per child: RLIMIT_NPROC counts per uid and is not enforced for root, who
        # also owns the project's files. It needs a mount namespace to reach the interpreter.
        "uid": 100_000 + secrets.randbelow(1_000_000) if root and level == "namespaces" else None,
        "expose": _exposed() if root and level == "namespaces" else [],
        "workdir": str(workdir),
        "limits": {"RLIMIT_CPU": cpu_s, "RLIMIT_AS": memory_mb << 20, "RLIMIT_NPROC": max_processes,
                   "RLIMIT_FSIZE": 64 << 20, "RLIMIT_CORE": 0},
    }
    return [*prefix, sys.executable, "-I", "-S", str(Path(__file__).resolve()), json.dumps(spec), "--", *argv]


def _exposed() -> list[tuple[str, str]]:
    """(A, D) pairs: the child needs directory D (the interpreter, the venv, the
    project), but only root may enter its ancestor A (a pyenv under /root)."""
    pairs = []
    for need in dict.fromkeys(Path(p).resolve() for p in (sys.base_prefix, sys.prefix, ROOT)):
        for ancestor in reversed(need.parents):
            if not os.stat(ancestor).st_mode & 0o001:
                pairs.append((str(ancestor), str(need)))
                break
    return pairs


def _jail(spec: dict, argv: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sandbox: {what}: {os.strerror(err)}")

    for path in spec["hide"]:
        if os.path.isdir(path):
            check(libc.mount(b"none", path.encode(), b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                             b"size=4k,mode=0555"), f"hiding {path}")
    for blocked, need in spec["expose"]:
        # Replace A by an empty tmpfs holding only D, bound back in: the rest of A stays hidden.
        stage = tempfile.mkdtemp(prefix="hera-stage-")
        check(libc.mount(need.encode(), stage.encode(), None, _MS_BIND | _MS_REC, None), f"binding {need}")
        check(libc.mount(b"none", blocked.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=64k,mode=0755"),
              f"covering {blocked}")
        target = os.path.join(blocked, os.path.relpath(need, blocked))
        os.makedirs(target, exist_ok=True)
        check(libc.mount(stage.encode(), target.encode(), None, _MS_MOVE, None), f"exposing {need}")
        os.rmdir(stage)
        check(libc.mount(b"none", blocked.encode(), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None),
              f"sealing {blocked}")
    if spec["lock"]:
        # A less privileged user namespace: the tmpfs mounts above can no longer be removed.
        check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "entering a nested user namespace")
    uid = spec["uid"]
    if uid is not None:
        for top, dirs, files in os.walk(spec["workdir"]):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.lchown(name, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")
    for name, value in spec["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    _jail(json.loads(sys.argv[1]), sys.argv[3:])
