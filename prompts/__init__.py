"""Prompt files, one per LLM role, rendered strictly with `string.Template`."""

from pathlib import Path
from string import Template

PROMPTS = Path(__file__).parent


def render(name: str, **values: str) -> str:
    """The prompt `name.md` with its `$placeholders` filled; a missing one raises KeyError."""
    return Template((PROMPTS / f"{name}.md").read_text()).substitute(values)
