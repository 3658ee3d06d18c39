"""Load and validate a harness bundle directory.

A bundle is `manifest.yaml` (id, parent_id, origin, description),
`config.yaml` (turn and token limits), `prompts/*.md` (`system.md` required,
`string.Template` with `$context`), `hooks.py` (a `Harness` subclass of
`BaseHarness`), and optional `skills/*.md`, `memory.yaml` and
`subagents/*.yaml`. The content hash covers every file, so lineage entries
name exact versions.
"""

from __future__ import annotations

import inspect
import types
from functools import lru_cache
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from pydantic import ValidationError

from envs.spec import SpecError, files_signature, read_yaml
from harness.abi import HOOKS, BaseHarness, HarnessConfig
from state.records import Record, content_hash

BUNDLES = Path(__file__).parent / "bundles"


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

    @property
    def id(self) -> str:
        return self.manifest.id

    def harness(self) -> BaseHarness:
        return _harness_class(self.hooks_source, str(self.path / "hooks.py"))()


def resolve_bundle(name: str | Path) -> Path:
    """A bundle directory from a path or the name of a built-in bundle."""
    path = Path(name)
    if path.is_dir():
        return path
    if (BUNDLES / str(name)).is_dir():
        return BUNDLES / str(name)
    raise SpecError(name, "(bundle)", f"a bundle directory or one of {sorted(p.name for p in BUNDLES.iterdir())}")


def load_bundle(name: str | Path) -> Bundle:
    """The validated bundle, reloaded only when one of its files changes."""
    path = resolve_bundle(name).resolve()
    return _load_bundle(path, files_signature(path))


@lru_cache(maxsize=32)
def _load_bundle(path: Path, signature: tuple) -> Bundle:
    manifest = _model(path / "manifest.yaml", Manifest)
    config = _model(path / "config.yaml", HarnessConfig)
    prompts = {p.stem: p.read_text() for p in sorted((path / "prompts").glob("*.md"))}
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
    source = hooks.read_text()
    _harness_class(source, str(hooks))
    files = {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}
    return Bundle(
        path=path,
        manifest=manifest,
        config=config,
        prompts=prompts,
        skills={p.stem: p.read_text() for p in sorted((path / "skills").glob("*.md"))},
        memory=read_yaml(path / "memory.yaml") if (path / "memory.yaml").is_file() else {},
        subagents={p.stem: read_yaml(p) for p in sorted((path / "subagents").glob("*.yaml"))},
        hooks_source=source,
        hash=content_hash(files),
    )


def _model(path: Path, model: type[Record]) -> Any:
    raw = read_yaml(path)
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise SpecError(path, field, err["msg"]) from None


def _harness_class(source: str, origin: str) -> type[BaseHarness]:
    module = types.ModuleType("harness_bundle_hooks")
    module.__file__ = origin
    try:
        exec(compile(source, origin, "exec"), module.__dict__)
    except Exception as exc:  # any failure to import is the bundle's defect, reported by file
        raise SpecError(origin, "(module)", f"an importable module ({type(exc).__name__}: {exc})") from None
    cls = module.__dict__.get("Harness")
    if not (isinstance(cls, type) and issubclass(cls, BaseHarness)):
        raise SpecError(origin, "Harness", "a class Harness(BaseHarness)")
    for hook in HOOKS:
        want = list(inspect.signature(getattr(BaseHarness, hook)).parameters)
        got = list(inspect.signature(getattr(cls, hook)).parameters)
        if len(got) != len(want):
            raise SpecError(origin, f"Harness.{hook}", f"parameters ({', '.join(want)}) (got ({', '.join(got)}))")
    return cls
