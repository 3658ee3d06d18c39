"""Serving the graphs to LangGraph Studio and over the LangGraph API: `langgraph dev` on the project's
langgraph.json, on 127.0.0.1, with the CLI's analytics and the server's version check off (no outbound calls),
supervised until it exits or Ctrl-C."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

PROJECT = Path(__file__).resolve().parent.parent
CONFIG = PROJECT / "langgraph.json"
STUDIO = "https://smith.langchain.com/studio/?baseUrl="
READY_S = 300.0


def serve_command(port: int, config: Path, reload: bool = True) -> tuple[list[str], dict[str, str]]:
    """The `langgraph dev` command and environment that serve the graphs of
    `config` on 127.0.0.1 with the CLI's analytics and the server's version
    check off, so the server makes no outbound calls."""
    argv = [sys.executable, "-m", "langgraph_cli", "dev", "--config", str(config),
            "--host", "127.0.0.1", "--port", str(port), "--no-browser"]
    if not reload:
        argv.append("--no-reload")
    env = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    return argv, env


def announced_url(line: str) -> str | None:
    """The API URL in a line of `langgraph dev`'s banner: the port it really
    bound, since it takes a free one when the requested port is busy."""
    found = re.search(r"API:\s*(http://\S+)", re.sub(r"\x1b\[[0-9;]*m", "", line))
    return found.group(1) if found else None


def server_ready(url: str, timeout_s: float) -> bool:
    """Whether the server at `url` answers `/ok` within `timeout_s`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with opener.open(f"{url}/ok", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def supervise(port: int, on_ready: Callable[[str], None]) -> int:
    """Runs the dev server, passing its output on to stderr, and calls `on_ready(url)` once it answers on the port
    it really bound; 0 when it exits cleanly or on Ctrl-C, else 1."""
    argv, env = serve_command(port, CONFIG)
    # The graph paths in langgraph.json are relative to the working directory,
    # where the dev server also keeps its threads (.langgraph_api/).
    child = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, encoding="utf-8", errors="replace")

    def announce(url: str) -> None:
        if server_ready(url, READY_S):
            on_ready(url)

    url = None
    try:
        for line in child.stdout:
            sys.stderr.write(line)
            if url is None and (url := announced_url(line)):
                threading.Thread(target=announce, args=(url,), daemon=True).start()
        code = child.wait()
    except KeyboardInterrupt:
        # A terminal's Ctrl-C reaches the server too; a SIGINT sent to `hera` alone does not.
        for stop, grace in ((None, 5), (child.terminate, 15), (child.kill, None)):
            if stop:
                stop()
            try:
                child.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                pass
        return 0
    return 0 if code == 0 else 1
