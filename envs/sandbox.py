"""Run untrusted code (generated tools, harness candidates) in a contained child.

The child is started through this file run as a script, the jail: inside
fresh mount, network and PID namespaces it builds a new root on an empty
tmpfs holding only what the child may see, read-only (the system's programs
and libraries, the interpreter with its packages, the project's code
packages with the catalog covered again), plus its own working directory, a
private /tmp and a few devices; it detaches the host's root (pivot_root),
drops to a throwaway unprivileged uid (or, when the evaluator is not root,
into a nested user namespace, which locks those mounts), sets CPU, memory,
process-count and file-size limits and execs the command with a scrubbed
environment. Home, the host's /tmp, runs, ledgers and every catalog are out
of sight. Where namespaces are unavailable the jail falls back to
`unshare -n`, then to limits only; `isolation()` says which is in force, so a
report never claims more than it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import BinaryIO, Iterator, Literal

ROOT = Path(__file__).resolve().parent.parent
Isolation = Literal["namespaces", "network", "none"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_MS_RELATIME = 1 << 21
_ST_TO_MS = {os.ST_NODEV: _MS_NODEV, os.ST_NOEXEC: _MS_NOEXEC, os.ST_NOATIME: 1024, os.ST_NODIRATIME: 2048,
             os.ST_RELATIME: _MS_RELATIME, os.ST_RDONLY: _MS_RDONLY}


def scratch(kind: str) -> Path:
    """A new working directory for a sandboxed child, named by this process's
    pid so that one left behind by a killed evaluator is removed by the next."""
    _sweep()
    return Path(tempfile.mkdtemp(prefix=f"hera-{kind}-{os.getpid()}-"))


@contextlib.contextmanager
def workspace(kind: str) -> Iterator[Path]:
    """`scratch(kind)`, removed on exit."""
    path = scratch(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@functools.cache
def _sweep() -> None:
    for path in Path(tempfile.gettempdir()).glob("hera-*-*-*"):
        owner = re.fullmatch(r"hera-[a-z]+-(\d+)-\w+", path.name)
        if owner and path.is_dir() and not _alive(int(owner[1])):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def die_with_parent() -> None:
    """In the forked child, before exec: SIGKILL when the evaluator dies, even by SIGKILL."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def private_dirs() -> tuple[Path, ...]:
    """What a sandboxed child must not read, covered again should the new root
    show it: the catalog inside the code packages (pair files carry labels),
    the runs directory, the test fixtures, the model cache and the history."""
    # Imported here: the jail runs this file without the project's packages.
    from state.paths import runs_dir

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
    with workspace("sandbox") as tmp:
        workdir = cwd or tmp
        # The CPU limit sits above the wall-clock timeout, so a busy loop is reported as a timeout, not a kill.
        argv, env = sandbox_command(args, workdir=workdir, cpu_s=int(timeout_s) + 10, memory_mb=memory_mb,
                                    max_processes=max_processes, hidden=hidden)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=workdir, start_new_session=True, preexec_fn=die_with_parent)
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
            env=env, cwd=workdir, start_new_session=True, preexec_fn=die_with_parent, limit=cls.LINE_LIMIT)
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
        from state.records import lone_surrogate  # here: a sandboxed child imports this module, and sees no state/

        if (around := lone_surrogate(line.decode(errors="replace"), reply)) is not None:
            raise ChildError(f"the sandboxed child sent text that is not Unicode (a lone surrogate, in {around!r})")
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


def private_stdio() -> tuple[BinaryIO, BinaryIO]:
    """In a sandboxed child: its protocol's ends, private copies of stdin and stdout. Descriptor 0 then reads nothing
    and descriptor 1 writes to stderr, so that what the untrusted code in it reads or prints (`os.write(1, ...)` too:
    a line shaped like a reply would answer for it) stays out of the protocol."""
    reader, writer = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr  # noqa: SIM115 (for the life of the child)
    return reader, writer


def stage(path: Path, workdir: Path, name: str = "bundle") -> Path:
    """A copy of the directory `path` in a sandbox's working directory: the
    original may sit under a hidden directory or one the child cannot enter. A
    symbolic link is copied as a link, never followed: its target stays as
    hidden as it is."""
    copy = workdir / name
    shutil.copytree(path, copy, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def kill(pid: int) -> None:
    """Kill a sandboxed child's process group (its PID namespace dies with it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _env(workdir: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "HOME": str(workdir),
            "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"}


def _command(argv: list[str], *, level: Isolation, hidden, workdir: Path, cpu_s: int, memory_mb: int,
             max_processes: int) -> list[str]:
    root = os.geteuid() == 0
    prefix = {
        "namespaces": ["unshare", *([] if root else ["-r"]), "-m", "-n", "-p", "-f", "--kill-child", "--mount-proc"],
        "network": ["unshare", "-n"],
        "none": [],
    }[level]
    jailed = level == "namespaces"
    spec = {
        "root": _visible() if jailed else None,
        "hide": [str(p) for p in hidden] if jailed else [],
        "lock": jailed and not root,
        # A fresh uid per child: RLIMIT_NPROC counts per uid and is not enforced for root, who
        # also owns the project's files.
        "uid": 100_000 + secrets.randbelow(1_000_000) if root and jailed else None,
        "workdir": str(workdir),
        "limits": {"RLIMIT_CPU": cpu_s, "RLIMIT_AS": memory_mb << 20, "RLIMIT_NPROC": max_processes,
                   "RLIMIT_FSIZE": 64 << 20, "RLIMIT_CORE": 0},
    }
    return [*prefix, sys.executable, "-I", "-S", str(Path(__file__).resolve()), json.dumps(spec), "--", *argv]


_PACKAGES = ("state", "envs", "harness", "roles", "graphs", "prompts")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf",
           "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
_DEVICES = ("null", "zero", "full", "random", "urandom")


@functools.cache
def _visible() -> list[str]:
    """Everything a sandboxed child sees of the host, read-only: the system's
    programs and libraries, the interpreter with its installed packages and the
    project's code packages. Not home, not `/tmp`, not the runs, not any
    catalog (the project's own is hidden again inside `envs`)."""
    import site

    paths = [*_SYSTEM, sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *site.getsitepackages(), *(str(ROOT / name) for name in _PACKAGES)]
    return [p for p in dict.fromkeys(paths) if os.path.lexists(p)]


def _jail(spec: dict, argv: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sandbox: {what}: {os.strerror(err)}")

    def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None, what: str) -> None:
        check(libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, data and data.encode()), what)

    def bind(path: str, target: str, writable: bool = False) -> None:
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        mount(path, target, None, _MS_BIND, None, f"binding {path}")
        # A bind mount keeps the flags it may not lose (in a user namespace) only if they are named again.
        present = os.statvfs(target).f_flag
        kept = sum(ms for st, ms in _ST_TO_MS.items() if present & st)
        flags = kept | _MS_REMOUNT | _MS_BIND | _MS_NOSUID | (0 if writable else _MS_RDONLY)
        mount("none", target, None, flags, None, f"sealing {path}")

    workdir = spec["workdir"]
    if spec["root"] is not None:
        # A new root on an empty tmpfs holding only what the child may see, then the host's root is
        # detached: nothing else of the host (home, /tmp, other checkouts, ledgers) is reachable.
        new = os.path.join(workdir, ".root")
        os.makedirs(new, exist_ok=True)
        mount("none", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=0755", "mounting the new root")
        # The private /tmp first: what is bound below may live under the host's /tmp (a clone, its venv).
        for private in ("/tmp", "/dev/shm"):
            os.makedirs(new + private, exist_ok=True)
            mount("none", new + private, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64m,mode=1777", f"mounting a private {private}")
        for path in spec["root"]:
            target = new + path
            if os.path.islink(path):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(os.readlink(path), target)
            elif not os.path.lexists(target):
                bind(path, target)
        for name in _DEVICES:
            bind(f"/dev/{name}", f"{new}/dev/{name}", writable=True)
        for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(to, f"{new}/dev/{name}")
        os.makedirs(f"{new}/proc")
        mount("proc", f"{new}/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None, "mounting /proc")
        bind(workdir, new + workdir, writable=True)
        os.chdir(new)
        check(libc.syscall(_SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
        check(libc.umount2(b".", _MNT_DETACH), "detaching the host's root")
        os.chdir("/")
        mount("none", "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None, "sealing the new root")
        for path in spec["hide"]:
            if os.path.isdir(path):
                mount("none", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=4k,mode=0555", f"hiding {path}")
    if spec["lock"]:
        # A less privileged user namespace: the mounts above can no longer be removed.
        check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "entering a nested user namespace")
    uid = spec["uid"]
    if uid is not None:
        for top, dirs, files in os.walk(workdir):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.lchown(name, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        # A change of credentials clears the parent-death signal that `unshare --kill-child` set.
        check(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "setting the parent-death signal")
    os.chdir(workdir)
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")
    for name, value in spec["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    _jail(json.loads(sys.argv[1]), sys.argv[3:])
