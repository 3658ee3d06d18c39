"""Run settings every graph reads through `runtime.context`: JSON-plain, no clients."""

from __future__ import annotations

from dataclasses import dataclass

from state.paths import CATALOG
from state.records import Record, Side, content_hash


class ConfigError(ValueError):
    """A request that cannot run as given (a bad setting, an unknown run, a run already being evaluated): the
    caller's to fix, named with the file or field and what was expected. The CLI exits 2 on it."""


TRANSPORTS = ("direct", "memory", "stdio")  # how an episode reaches its environment (`graphs.episode.environment_session`)
PROPOSALS = ("menu", "free")


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass(frozen=True)
class Context:
    agent_model: str = "local"
    judge_model: str = "local"
    analyst_model: str = "local"  # failure analyst and the FDCR review roles
    optimizer_model: str = "local"  # the coding agent that edits harness candidates
    proposer_model: str = "local"  # environment designer and mutation proposers
    proposals: str = "menu"  # "menu": proposers choose from changes derived from the parent; "free": they write whole mutations
    reviewer_model: str = "local"  # semantic and rescue reviewers
    builder_model: str = "local"  # environment builder and tool coder (construction from a theme)
    task_model: str = "local"  # task proposer (or writer)
    task_proposals: str = "menu"  # "menu": a task is a change the write tools make, the model words its request; "free": it writes the rules too
    solver_model: str = "local"  # the independent solver of proposed tasks
    solver_harness: str = "H-small"  # the harness bundle the solver's model runs in
    catalog: str = str(CATALOG)
    ledger: str | None = None
    max_infra_retries: int = 2
    model_timeout_s: float = 1800.0  # a hang guard: 8,192 tokens from the local model on two cores take about 20 minutes
    env_transport: str = "direct"  # tools called in process; "memory": an MCP session in process; "stdio": an MCP server subprocess per episode
    max_turns: int | None = None  # a budget: caps every episode's turns below its harness's own limit
    engine: str | None = None  # where episodes run: None in this process, "local:N" N worker processes, "tcp://HOST:PORT" a cluster

    def __post_init__(self) -> None:
        """Refuses, by field, a setting no run can use: a caller of a graph (Studio, the dev server's API) may hand
        over any JSON as the context."""
        checks = (("proposals", "menu or free", self.proposals in PROPOSALS),
                  ("task_proposals", "menu or free", self.task_proposals in PROPOSALS),
                  ("max_infra_retries", "at least 0", _count(self.max_infra_retries, 0)),
                  ("max_turns", "at least 1, or None", self.max_turns is None or _count(self.max_turns, 1)),
                  ("model_timeout_s", "a number above 0", isinstance(self.model_timeout_s, (int, float)) and self.model_timeout_s > 0),
                  ("env_transport", "direct, memory or stdio", self.env_transport in TRANSPORTS))
        problems = [f"{name}={getattr(self, name)!r} ({what})" for name, what, ok in checks if not ok]
        if problems:
            raise ConfigError("context: " + "; ".join(problems))


class EpisodeRequest(Record):
    """One harness on one side of one pair: the rollout-cache key without the hashes."""

    pair_id: str
    side: Side
    bundle: str
    seed: int = 0
    trial: int = 0

    def sampling_seed(self, turn: int) -> int:
        """The agent's sampling seed at `turn` (31 bits): one for each pair, side, seed, trial and turn, the same for
        every harness. Two harnesses' episodes on a pair then draw alike where their prompts agree, so they differ
        where the harnesses do rather than by the luck of the draw (common random numbers for paired comparisons);
        trials draw apart."""
        return int(content_hash([self.pair_id, self.side, self.seed, self.trial, turn]), 16) >> 33
