"""Find, load and check the pairs of a catalog directory.

A catalog is a directory of environment folders, each with a `pairs/` folder.
`catalog_problems` checks what HERA's splits require of the whole set. A
mutation starts from a `Parent`: a pair's feasible side, or a task kept in a
built or imported environment's `tasks/` folder.
"""

from __future__ import annotations

import glob
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from envs.mutation import apply_mutation
from pydantic import ValidationError

from envs.spec import SpecError, load_environment, load_pair, read_yaml, tool_infos, validation_error
from state.paths import CATALOG, ID
from state.records import CATEGORIES, EnvironmentSpec, Mutation, PairSpec, StateOp, TaskSpec, scalars

MIN_PER_CATEGORY = 4
SPLIT_SIZES = {"train": 20, "validation": 15, "bench": 25}  # standard-tier pairs (HERA's protocol); short ones come on top
SHORT_CALLS = (2, 3)  # reference calls of a short-tier pair


@dataclass(frozen=True)
class Entry:
    pair: PairSpec
    env: EnvironmentSpec
    path: Path


@dataclass(frozen=True)
class Parent:
    """A feasible task a mutation starts from, on its environment, with the rows its twins must keep."""

    id: str
    env: EnvironmentSpec
    task: TaskSpec
    control: tuple[StateOp, ...]
    env_dir: Path
    tier: str = "standard"  # a pair's; its twins keep it (the task is the same)
    category: str | None = None  # a pair's: the category of the mutation of its infeasible side

    def twin(self, pair_id: str, mutation: Mutation) -> PairSpec:
        """The training pair of this task and a mutation of its environment."""
        return PairSpec(id=pair_id, split="train", environment=self.env.id, task=self.task, mutation=mutation, control=self.control,
                        tier=self.tier)


def load_parent(parent_id: str, root: Path | str = CATALOG) -> Parent:
    """A pair of the catalog at `root`, else a task in `tasks/` of `root` (an environment directory) or of one of
    its environments."""
    root, named = Path(root), ID.fullmatch(parent_id)  # an id, never a path
    if named and any(root.glob(f"*/pairs/{glob.escape(parent_id)}.yaml")):
        entry = load_entry(parent_id, root)
        return Parent(parent_id, entry.env, entry.pair.task, entry.pair.control, entry.path.parent.parent, entry.pair.tier,
                      entry.pair.mutation.category)
    for path in [root / "tasks" / f"{parent_id}.yaml", *root.glob(f"*/tasks/{glob.escape(parent_id)}.yaml")] if named else ():
        if path.is_file():
            env = load_environment(path.parent.parent)
            try:
                task = TaskSpec.model_validate(read_yaml(path))
            except ValidationError as exc:
                raise validation_error(path, exc) from None
            return Parent(parent_id, env, task, (), path.parent.parent)
    raise KeyError(f"no pair or task {parent_id!r} in {root}")


def split_pairs(split: str, catalog: Path | str = CATALOG, tier: str | None = None) -> list[str]:
    """The split's pairs (of one tier, given one), one theme at a time in turn, and of a theme the pair whose
    mutation category the order has taken least so far (then by id), so that any prefix spans the themes and
    then the categories: the failures a short training pool shows are not all of one kind."""
    by_theme: dict[str, list[Entry]] = {}
    for _, e in sorted(load_catalog(catalog).items()):
        if e.pair.split == split and tier in (None, e.pair.tier):
            by_theme.setdefault(e.env.theme, []).append(e)
    taken: Counter[str] = Counter()
    order: list[str] = []
    while any(by_theme.values()):
        for entries in by_theme.values():
            if entries:
                e = min(entries, key=lambda e: taken[e.pair.mutation.category])  # min keeps the first (by id) of a tie
                entries.remove(e)
                taken[e.pair.mutation.category] += 1
                order.append(e.pair.id)
    return order


def task_ids(env_dir: Path | str) -> list[str]:
    """The tasks in an environment directory's `tasks/`, by id."""
    return sorted(p.stem for p in Path(env_dir, "tasks").glob("*.yaml"))


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


def entry_context(entry: Entry) -> str:
    """What an episode's agent is told besides the request: the environment's description, the task's system prompt
    and the policy."""
    parts = [entry.env.description, entry.pair.task.system_prompt]
    if entry.env.policy:
        parts.append("Policy:\n" + entry.env.policy)
    return "\n\n".join(p.strip() for p in parts if p and p.strip())


def load_entry(pair_id: str, root: Path | str = CATALOG) -> Entry:
    """One pair, loading only its own environment (pair files are named after their id; an id is
    never a pattern, which would load whichever pair it matched first, nor a path)."""
    for path in Path(root).glob(f"*/pairs/{glob.escape(pair_id)}.yaml") if ID.fullmatch(pair_id) else ():
        env = load_environment(path.parent.parent)
        return Entry(pair=load_pair(path, env), env=env, path=path)
    raise KeyError(f"no pair {pair_id!r} in {root}")


@lru_cache(maxsize=4096)
def run_entry(run: str, pair_id: str, root: Path | str = CATALOG) -> Entry:
    """`load_entry` as the first episode of run `run` in this process read it: every episode of a run is keyed by the
    same files, and they are not walked again for each."""
    return load_entry(pair_id, root)


def _duplicate(path: Path, pair_id: str, other: Path) -> None:
    raise SpecError(path, "id", f"a unique pair id; {pair_id!r} is also in {other}")


_QUOTED = re.compile(r'"([^"\n]+)"|`([^`\n]+)`')
_ID_SHAPED = re.compile(r"(?<![\w-])(?:(?=[\w-]*\d)[A-Za-z0-9][\w-]*[A-Za-z0-9]|[A-Z]{2,}(?:-[A-Za-z0-9]+)+)(?![\w-])")
_VOCABULARY = re.compile(r"[a-z0-9_ ]+|\d{1,3}|[A-Z]{1,3}")  # words of a closed vocabulary (a decision, a status, a currency)


@dataclass(frozen=True)
class Finding:
    """`value` appears in the public text at `where` and is data: a row's key or a value a pair's reference,
    answer or witness uses (`source`)."""

    env: str
    where: str
    value: str
    source: str

    def __str__(self) -> str:
        return f"environment {self.env}: {self.where} shows {self.value!r}, {self.source}; an example must resolve to no row"


def public_texts(env: EnvironmentSpec) -> list[tuple[str, str]]:
    """(where, text) for everything an agent reads about the environment before it calls a tool."""
    texts = [("environment.yaml description", env.description), ("policy.md", env.policy)]
    for tool in tool_infos(env).values():
        texts.append((f"tool {tool.name}", tool.description))
        texts += [(f"tool {tool.name}({arg})", p.get("description") or "") for arg, p in tool.input_schema.get("properties", {}).items()]
    return texts


def pair_values(pair: PairSpec) -> list[str]:
    """The data a pair's reference calls, answer checks and witness use, less closed-vocabulary words."""
    values = scalars([c.args for c in pair.task.reference.calls]) + scalars([[a.value, *a.any_of] for a in pair.task.answer])
    values += scalars(list(pair.mutation.witness))
    return [v for v in values if v.strip() and not _VOCABULARY.fullmatch(v)]


def public_text_findings(env: EnvironmentSpec, pairs: list[PairSpec] = ()) -> list[Finding]:
    """Examples in the environment's public text (quoted or id-shaped) that are real data: an agent copies such an
    example instead of looking the record up, and a check that lets public text through lets it pass."""
    data = {str(r[t.primary_key]).casefold(): f"the key of a {t.name} row" for t in env.tables for r in env.rows.get(t.name, ())}
    for pair in pairs:
        for value in pair_values(pair):
            data.setdefault(value.casefold(), f"a value of pair {pair.id}")
    for choice in _choices(env):  # a closed set of choices the schema enforces is the tool's vocabulary, not data
        data.pop(choice.casefold(), None)
    words = {v: src for v, src in data.items() if len(v) >= 4}
    found = []
    for where, text in public_texts(env):
        quoted = {a or b for a, b in _QUOTED.findall(text)}
        shown = quoted | set(_ID_SHAPED.findall(text))
        found += [Finding(env.id, where, value, data[value.casefold()]) for value in sorted(shown) if value.casefold() in data]
        for example in sorted(q for q in quoted if q.casefold() not in data):  # a search example made of a pair's words
            inside = [v for v in words if re.search(r"(?<![\w-])" + re.escape(v) + r"(?![\w-])", example.casefold())]
            found += [Finding(env.id, where, example, f"holding {v!r}, {words[v]}") for v in inside]
    return found


def _choices(env: EnvironmentSpec) -> set[str]:
    def walk(schema) -> list[str]:
        if isinstance(schema, dict):
            return [str(v) for v in schema.get("enum", ())] + [c for v in schema.values() for c in walk(v)]
        return [c for v in schema for c in walk(v)] if isinstance(schema, list) else []

    return {c for tool in tool_infos(env).values() for c in walk(tool.input_schema)}


def catalog_findings(entries: dict[str, Entry]) -> list[Finding]:
    """The public-text findings of every environment of the catalog, against all of its pairs."""
    envs = {e.env.id: e.env for e in entries.values()}
    return [f for env in envs.values() for f in public_text_findings(env, [e.pair for e in entries.values() if e.env.id == env.id])]


def catalog_problems(entries: dict[str, Entry], quotas: bool = True) -> list[str]:
    """Public text showing data, and, with `quotas`, what HERA's protocol requires of the built-in catalog: split
    sizes, themes kept apart, short tiers and categories (a small custom catalog is held to the first only)."""
    problems = [str(f) for f in catalog_findings(entries)]
    if not quotas:
        return problems
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
