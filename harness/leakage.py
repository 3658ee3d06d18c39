"""The leakage lint: a candidate's diff must not carry what only the pool's
private records know — pair and task ids, gold answer values, the values of
reference calls, or entity ids and names quoted in the pool's instructions."""

from __future__ import annotations

import re
from typing import Iterable

from envs.catalog import Entry

_ENTITY = re.compile(r"\b(?:[A-Za-z]*\d[\w-]*|[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+)\b")
_MIN_LEN = 4


def private_terms(entries: Iterable[Entry]) -> set[str]:
    """Strings a generic harness has no reason to contain, from the pool's pairs."""
    terms: set[str] = set()
    for e in entries:
        task = e.pair.task
        terms |= {e.pair.id, task.id}
        for check in task.answer:
            terms |= {str(v) for v in (check.value, *check.any_of) if v is not None}
        terms |= set(task.forbidden_values)
        for call in task.reference.calls:
            terms |= {str(v) for v in call.args.values() if v is not None}
        terms |= {m.group(0) for m in _ENTITY.finditer(task.instruction)}
        for row in e.pair.mutation.witness:
            terms |= {str(v) for v in row.values() if isinstance(v, str)}
    return {t.strip() for t in terms if _specific(t.strip())}


def _specific(term: str) -> bool:
    """Ids, numbers, dates and proper names; plain words are left out, a generic harness may use them."""
    if len(term) < _MIN_LEN:
        return False
    return any(c.isdigit() or c in "-_" for c in term) or (" " in term and any(w[:1].isupper() for w in term.split()))


def quoted(text: str, terms: Iterable[str]) -> list[str]:
    """The `terms` found in `text`, whole-word and case-insensitive."""
    text = text.casefold()
    return sorted(t for t in terms if re.search(rf"(?<![\w-]){re.escape(t.casefold())}(?![\w-])", text))


def leaks(diff: str, entries: Iterable[Entry]) -> list[str]:
    """The private terms found in the lines a diff adds."""
    added = "\n".join(line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    return quoted(added, private_terms(entries))
