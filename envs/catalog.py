"""Find, load and check the pairs of a catalog directory.

A catalog is a directory of environment folders, each with a `pairs/` folder.
`catalog_problems` checks what HERA's splits require of the whole set.
"""

from __future__ import annotations

import glob
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from envs.mutation import apply_mutation
from envs.spec import SpecError, load_environment, load_pair, tool_infos
from state.records import CATEGORIES, EnvironmentSpec, PairSpec

CATALOG = Path(__file__).parent / "catalog"
MIN_PER_CATEGORY = 4
SPLIT_SIZES = {"train": 20, "validation": 15, "bench": 25}  # standard-tier pairs (HERA's protocol); short ones come on top
SHORT_CALLS = (2, 3)  # reference calls of a short-tier pair


@dataclass(frozen=True)
class Entry:
    pair: PairSpec
    env: EnvironmentSpec
    path: Path


def load_catalog(root: Path | str = CATALOG, errors: list[SpecError] | None = None) -> dict[str, Entry]:
    """Every pair of the catalog by id. A broken environment or pair raises,
    or, when `errors` is given, is appended to it and skipped."""
    entries: dict[str, Entry] = {}

    def attempt(load):
        try:
            return load()
        except SpecError as exc:
            if errors is None:
                raise
            errors.append(exc)

    for env_dir in sorted(p.parent for p in Path(root).glob("*/environment.yaml")):
        env = attempt(lambda: load_environment(env_dir))
        if env is None:
            continue
        for path in sorted((env_dir / "pairs").glob("*.yaml")):
            pair = attempt(lambda: load_pair(path, env))
            if pair is None:
                continue
            if pair.id in entries:
                attempt(lambda: _duplicate(path, pair.id, entries[pair.id].path))
                continue
            entries[pair.id] = Entry(pair=pair, env=env, path=path)
    return entries


def side_env(entry: Entry, side: str) -> EnvironmentSpec:
    """The feasible (`act`) or mutated (`abstain`) environment of a pair."""
    return entry.env if side == "act" else apply_mutation(entry.env, entry.pair.mutation).env


def load_entry(pair_id: str, root: Path | str = CATALOG) -> Entry:
    """One pair, loading only its own environment (pair files are named after their id; an id is
    never a pattern, which would load whichever pair it matched first)."""
    for path in Path(root).glob(f"*/pairs/{glob.escape(pair_id)}.yaml"):
        env = load_environment(path.parent.parent)
        return Entry(pair=load_pair(path, env), env=env, path=path)
    raise KeyError(f"no pair {pair_id!r} in {root}")


def _duplicate(path: Path, pair_id: str, other: Path) -> None:
    raise SpecError(path, "id", f"a unique pair id; {pair_id!r} is also in {other}")


def example_ids(env: EnvironmentSpec) -> list[tuple[str, str]]:
    """(tool, id) where a tool's public description quotes the key of a real row as an example: an agent copies
    such an example instead of looking the record up, and a check that lets public text through lets it pass."""
    keys = {str(r[t.primary_key]) for t in env.tables for r in env.rows.get(t.name, ()) if any(ch.isdigit() for ch in str(r[t.primary_key]))}
    found = []
    for tool in tool_infos(env).values():
        texts = [tool.description, *(p.get("description", "") for p in tool.input_schema.get("properties", {}).values())]
        quoted = {q for text in texts for q in re.findall(r'"([^"]+)"', text)}
        found += [(tool.name, key) for key in sorted(quoted & keys)]
    return found


def catalog_problems(entries: dict[str, Entry]) -> list[str]:
    problems = []
    for env in {e.env.id: e.env for e in entries.values()}.values():
        problems += [f"environment {env.id}: {tool} quotes {key}, the key of a real row, as an example" for tool, key in example_ids(env)]
    splits = Counter(e.pair.split for e in entries.values() if e.pair.tier == "standard")
    for split, size in SPLIT_SIZES.items():
        if split == "bench" and splits[split] < size or split != "bench" and splits[split] != size:
            problems.append(f"split {split} has {splits[split]} pairs; expected {'at least ' if split == 'bench' else ''}{size}")
    themes = {s: {e.env.theme for e in entries.values() if e.pair.split == s} for s in SPLIT_SIZES}
    shared = themes["bench"] & (themes["train"] | themes["validation"])
    if shared:
        problems.append(f"bench themes also in train/validation: {sorted(shared)}")
    for pid, e in sorted(entries.items()):
        calls = len(e.pair.task.reference.calls)
        if e.pair.tier == "short" and not SHORT_CALLS[0] <= calls <= SHORT_CALLS[1]:
            problems.append(f"short-tier pair {pid} has a reference of {calls} calls; expected {SHORT_CALLS[0]}–{SHORT_CALLS[1]}")
    short = {e.env.theme for e in entries.values() if e.pair.tier == "short"}
    problems += [f"theme {t} has no short-tier pair" for t in sorted({e.env.theme for e in entries.values()} - short)]
    categories = Counter(e.pair.mutation.category for e in entries.values())
    problems += [
        f"category {c} has {categories[c]} pairs; expected at least {MIN_PER_CATEGORY}"
        for c in CATEGORIES
        if categories[c] < MIN_PER_CATEGORY
    ]
    return problems
