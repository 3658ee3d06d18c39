"""Load and validate a harness bundle directory.

A bundle is `manifest.yaml` (id, parent_id, origin, description),
`config.yaml` (turn and token limits), `prompts/*.md` (`system.md` required,
`string.Template` with `$context`), `hooks.py` (a `Harness` subclass of
`BaseHarness`), and optional `components.yaml` (generic control logic from
`harness.components`, by name with parameters), `skills/*.md`, `memory.yaml`
and `subagents/*.yaml`. The content hash covers every file but the manifest,
and the code of the harness library the bundle runs on (`harness/*.py`: hooks'
base class, components, sandbox), so lineage entries name exact versions and a
cached rollout is never reused after a component's code changes. The manifest
(names, lineage and a description) is read by no episode: two bundles that
differ only there run alike and share their cached episodes (in run std20 two
methods' first rounds wrote the same harness with other descriptions, and its
validation and bench episodes were run twice).

Only a built-in bundle (under `harness/bundles/`) is trusted: the code of any
other is never run in this process. Loading it checks `hooks.py` statically;
its hooks run in the sandbox (`harness.remote`), which checks the class itself.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import types
from functools import lru_cache
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from pydantic import ValidationError

from envs.spec import SpecError, files_signature, read_text, read_yaml
from harness.abi import HOOKS, BaseHarness, HarnessConfig
from harness.components import LIBRARY, Stack
from state.evolution import ComponentChoice
from state.records import Record, content_hash

BUNDLES = Path(__file__).parent / "bundles"
# The library's code, part of every bundle's hash: a component that behaves differently is a different harness.
LIBRARY_CODE = content_hash({p.name: p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))})


class Manifest(Record):
    id: str
    parent_id: str | None = None
    origin: str
    description: str


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest
    config: HarnessConfig
    prompts: dict[str, str]
    skills: dict[str, str]
    memory: dict[str, Any]
    subagents: dict[str, Any]
    hooks_source: str
    hash: str
    components: tuple[ComponentChoice, ...] = ()

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def trusted(self) -> bool:
        """A built-in bundle, whose hooks may run in this process; any other
        runs only in the sandbox (`harness.remote`)."""
        return _trusted(self.path)

    def harness(self) -> BaseHarness:
        inner = _harness_class(self.hooks_source, str(self.path / "hooks.py"))()
        if not self.components:
            return inner
        return Stack(inner, [LIBRARY[c.name](c.params) for c in self.components])


def resolve_bundle(name: str | Path) -> Path:
    """A bundle directory from a path or the name of a built-in bundle."""
    path = Path(name)
    if path.is_dir():
        if not (path / "manifest.yaml").is_file():  # before its files are walked: a mistyped path may be a large tree
            raise SpecError(path / "manifest.yaml", "(file)", "a bundle's manifest; it does not exist")
        return path
    if (BUNDLES / str(name)).is_dir():
        return BUNDLES / str(name)
    raise SpecError(name, "(bundle)", f"a bundle directory or one of {sorted(p.name for p in BUNDLES.iterdir())}")


def load_bundle(name: str | Path) -> Bundle:
    """The validated bundle, reloaded only when one of its files changes."""
    path = resolve_bundle(name).resolve()
    bundle = _load_bundle(path, files_signature(path, links=False))
    _hashed[str(name), bundle.hash] = bundle
    return bundle


def hashed_bundle(name: str | Path, digest: str) -> Bundle | None:
    """The bundle `name` as this process last loaded it with the hash `digest`, without looking at its files; None when
    it never did. An episode keyed by a harness hash runs that harness without walking its files again."""
    return _hashed.get((str(name), digest))


_hashed: dict[tuple[str, str], Bundle] = {}


@lru_cache(maxsize=32)
def _load_bundle(path: Path, signature: tuple) -> Bundle:
    manifest = _model(path / "manifest.yaml", Manifest)
    config = _model(path / "config.yaml", HarnessConfig)
    prompts = {p.stem: read_text(p) for p in sorted((path / "prompts").glob("*.md"))}
    if "system" not in prompts:
        raise SpecError(path / "prompts" / "system.md", "(file)", "the system prompt; it does not exist")
    for name_, text in prompts.items():
        try:
            Template(text).substitute(context="")
        except (KeyError, ValueError) as exc:
            raise SpecError(path / "prompts" / f"{name_}.md", "(template)", f"only the placeholder $context (got {exc})") from None
    hooks = path / "hooks.py"
    if not hooks.is_file():
        raise SpecError(hooks, "(file)", "a module defining `class Harness(BaseHarness)`; it does not exist")
    source = read_text(hooks)
    if _trusted(path):
        _harness_class(source, str(hooks))
    else:
        _check_source(source, str(hooks))
    components = _components(path / "components.yaml") if (path / "components.yaml").is_file() else ()
    hashed = {str(p.relative_to(path)): read_text(p) for p in sorted(path.rglob("*"))
              if p.is_file() and "__pycache__" not in p.parts and p != path / "manifest.yaml"}
    return Bundle(
        path=path,
        manifest=manifest,
        config=config,
        prompts=prompts,
        skills={p.stem: read_text(p) for p in sorted((path / "skills").glob("*.md"))},
        memory=read_yaml(path / "memory.yaml") if (path / "memory.yaml").is_file() else {},
        subagents={p.stem: read_yaml(p) for p in sorted((path / "subagents").glob("*.yaml"))},
        hooks_source=source,
        hash=content_hash({**hashed, "(harness library)": LIBRARY_CODE}),
        components=components,
    )


def _model(path: Path, model: type[Record]) -> Any:
    raw = read_yaml(path)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise SpecError(path, field, err["msg"]) from None


def _components(path: Path) -> tuple[ComponentChoice, ...]:
    raw = read_yaml(path) or []
    if not isinstance(raw, list):
        raise SpecError(path, "(root)", "a list of {name, params} entries")
    out = []
    for i, item in enumerate(raw):
        try:
            choice = ComponentChoice.model_validate(item)
        except ValidationError as exc:
            raise SpecError(path, f"[{i}]", exc.errors()[0]["msg"]) from None
        if choice.name not in LIBRARY:
            raise SpecError(path, f"[{i}].name", f"one of {', '.join(LIBRARY)} (got {choice.name!r})")
        try:
            LIBRARY[choice.name].Params.model_validate(choice.params)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SpecError(path, f"[{i}].params." + ".".join(str(p) for p in err["loc"]), err["msg"]) from None
        out.append(choice)
    return tuple(out)


@lru_cache(maxsize=256)
def _trusted(path: Path) -> bool:
    return path.resolve().is_relative_to(BUNDLES.resolve())


def _check_source(source: str, origin: str) -> None:
    """What `_harness_class` checks, read from the syntax tree without running anything."""
    try:
        tree = ast.parse(source, origin)
    except SyntaxError as exc:
        raise SpecError(origin, "(module)", f"an importable module (SyntaxError: {exc})") from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Harness"), None)
    if cls is None:
        raise SpecError(origin, "Harness", "a class Harness(BaseHarness)")
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in HOOKS:
            a = node.args
            got = [p.arg for p in [*a.posonlyargs, *a.args, *filter(None, [a.vararg]), *a.kwonlyargs, *filter(None, [a.kwarg])]]
            want = list(inspect.signature(getattr(BaseHarness, node.name)).parameters)
            if len(got) != len(want):
                raise SpecError(origin, f"Harness.{node.name}", f"parameters ({', '.join(want)}) (got ({', '.join(got)}))")


@lru_cache(maxsize=32)
def _compiled(source: str, origin: str):
    return compile(source, origin, "exec")


_checked: set[tuple[str, str]] = set()  # (origin, source) of the hooks modules whose Harness passed the hook check


def _harness_class(source: str, origin: str) -> type[BaseHarness]:
    """The hooks module's Harness class, from a module of its own each time (no state shared between episodes); only
    the compiled code is kept."""
    module = types.ModuleType("harness_bundle_hooks")
    module.__file__ = origin
    try:
        exec(_compiled(source, origin), module.__dict__)
    except Exception as exc:  # any failure to import is the bundle's defect, reported by file
        raise SpecError(origin, "(module)", f"an importable module ({type(exc).__name__}: {exc})") from None
    cls = module.__dict__.get("Harness")
    if not (isinstance(cls, type) and issubclass(cls, BaseHarness)):
        raise SpecError(origin, "Harness", "a class Harness(BaseHarness)")
    if (origin, source) not in _checked:  # the same source makes the same class: its hooks are read once
        for hook in HOOKS:
            want = list(inspect.signature(getattr(BaseHarness, hook)).parameters)
            got = list(inspect.signature(getattr(cls, hook)).parameters)
            if len(got) != len(want):
                raise SpecError(origin, f"Harness.{hook}", f"parameters ({', '.join(want)}) (got ({', '.join(got)}))")
        _checked.add((origin, source))
    return cls


def bundle_diff(a: str | Path, b: str | Path) -> str:
    """A unified diff of every file of two bundle directories."""
    pa, pb = resolve_bundle(a), resolve_bundle(b)

    def files(root: Path) -> dict[str, list[str]]:
        return {str(p.relative_to(root)): read_text(p).splitlines(keepends=True)
                for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}

    fa, fb = files(pa), files(pb)
    return "".join(
        line for name in sorted(fa.keys() | fb.keys())
        for line in difflib.unified_diff(fa.get(name, []), fb.get(name, []), f"a/{name}", f"b/{name}")
    )
