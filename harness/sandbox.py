"""Run untrusted code (generated tools, harness candidates) in a subprocess
with a CPU-time limit, an address-space limit, a wall-clock timeout, a
scrubbed environment (no API keys) and, where `unshare -n` works, no network.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def network_isolation() -> list[str]:
    """The command prefix that removes network access, or [] where it cannot."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def run_sandboxed(args: list[str], *, timeout_s: float = 30, memory_mb: int = 1024, cwd: Path | None = None) -> subprocess.CompletedProcess:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s), int(timeout_s)))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", "HOME": str(cwd or ROOT)}
    return subprocess.run(
        [*network_isolation(), sys.executable, *args],
        capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd, preexec_fn=limits,
    )
