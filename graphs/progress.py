"""Progress of long commands: rich's live bars on a terminal; plain, timestamped lines when the output is a file, a
pipe or a CI log, where a live display prints nothing until the end.

A description is "stage · detail": a line is printed when a task starts, whenever its stage changes, at least every
`HEARTBEAT_S` with the latest detail and the count done, and when the command ends.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

HEARTBEAT_S = 30.0


def progress(console: Console, bar: bool = True, transient: bool = False, heartbeat_s: float = HEARTBEAT_S) -> Progress | Lines:
    """A live display on a terminal (with a bar and a count when `bar`), else `Lines`."""
    if not console.is_terminal:
        return Lines(console, heartbeat_s)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()) if bar else (SpinnerColumn(), TextColumn("{task.description}"))
    return Progress(*columns, TimeElapsedColumn(), console=console, transient=transient)


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float = 0.0


class Lines:
    """The part of rich's `Progress` interface the commands use, printing lines instead of a live display."""

    def __init__(self, console: Console, heartbeat_s: float = HEARTBEAT_S):
        self.console, self.heartbeat_s = console, heartbeat_s
        self.tasks: list[_Task] = []
        self.started = time.monotonic()
        self.last_line = self.started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="progress-lines", daemon=True)

    def __enter__(self) -> Lines:
        self._beat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._beat.join()
        with self._lock:
            for task in self.tasks:
                self._line(task, "stopped" if exc[0] else "end")

    def add_task(self, description: str, total: float | None = None, **_) -> int:
        with self._lock:
            self.tasks.append(_Task(description, total))
            self._line(self.tasks[-1], "start")
            return len(self.tasks) - 1

    def update(self, task_id: int, *, description: str | None = None, total: float | None = None,
               completed: float | None = None, advance: float | None = None, **_) -> None:
        with self._lock:
            task = self.tasks[task_id]
            if total is not None:
                task.total = total
            if completed is not None:
                task.completed = completed
            if advance:
                task.completed += advance
            if description is not None:
                stage = _stage(task.description)
                task.description = description
                if _stage(description) != stage:
                    self._line(task, "")

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 1.0)):
            with self._lock:
                if time.monotonic() - self.last_line >= self.heartbeat_s:
                    for task in self.tasks:
                        if not task.total or task.completed < task.total:  # a finished task said so once
                            self._line(task, "")

    def _line(self, task: _Task, event: str) -> None:
        """One line: elapsed time, the event if any, the description and the count."""
        now = time.monotonic()
        self.last_line = now
        elapsed = time.strftime("%H:%M:%S", time.gmtime(now - self.started))
        count = f" ({task.completed:g}/{task.total:g})" if task.total else (f" ({task.completed:g} done)" if task.completed else "")
        self.console.print(escape(f"[{elapsed}] {event + ': ' if event else ''}{task.description}{count}"), soft_wrap=True,
                           highlight=False)


def _stage(description: str) -> str:
    return description.split(" · ", 1)[0]
