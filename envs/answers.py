"""Find required values in a free-text final answer.

Numbers are read with thousands separators, currency signs and percent signs
stripped and compared within a tolerance; ISO dates are found in any common
written form ("2026-08-01", "August 1, 2026", "1 Aug 2026", "08/01/2026"), a
timestamp's too ("2026-08-01T12:43:00-05:00");
text matches whole words, ignoring case, punctuation and spacing. Every finder
returns the spans it matched, so a certifier can cut a value out of an answer
to build a perturbed, incomplete one.
"""

from __future__ import annotations

import re
from datetime import date

from state.records import AnswerCheck

Span = tuple[int, int]

_NUMBER = re.compile(r"(?<![\w.])[-−]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MONTHS = {m: i + 1 for i, m in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}
_MONTH = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DATES = [
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:\b|(?=T\d))"), lambda m: (int(m[1]), int(m[2]), int(m[3]))),  # or a timestamp's
    (re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I),
     lambda m: (int(m[3]), _MONTHS[m[1].lower()[:3]], int(m[2]))),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH}\s+(\d{{4}})\b", re.I),
     lambda m: (int(m[3]), _MONTHS[m[2].lower()[:3]], int(m[1]))),
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"), lambda m: (int(m[3]), int(m[1]), int(m[2]))),
]


def numbers(text: str) -> list[tuple[float, Span]]:
    found = []
    for m in _NUMBER.finditer(text):
        raw = m[0].replace(",", "").replace("$", "").replace("−", "-")
        found.append((float(raw), m.span()))
    return found


def dates(text: str) -> list[tuple[date, Span]]:
    found = []
    for pattern, parts in _DATES:
        for m in pattern.finditer(text):
            try:
                found.append((date(*parts(m)), m.span()))
            except ValueError:
                continue
    return found


def _text_pattern(value: str) -> re.Pattern:
    words = re.findall(r"\w+", value)
    body = r"[\W_]*".join(re.escape(w) for w in words)
    return re.compile(rf"(?<![^\W_]){body}(?![^\W_])", re.I)


def spans(text: str, check: AnswerCheck) -> list[Span]:
    """Where in `text` the check's value is stated (empty if nowhere)."""
    value = check.value
    if isinstance(value, bool):
        value = "yes" if value else "no"
    if isinstance(value, (int, float)):
        tol = max(check.tolerance, 1e-9)
        return [s for n, s in numbers(text) if abs(n - value) <= tol]
    if isinstance(value, str) and _ISO.match(value):
        wanted = date.fromisoformat(value)
        return [s for d, s in dates(text) if d == wanted]
    options = [value] if value is not None else []
    options += list(check.any_of)
    found = []
    for option in options:
        if re.search(r"\w", str(option)):
            found += [m.span() for m in _text_pattern(str(option)).finditer(text)]
    return found


def states(text: str, check: AnswerCheck) -> bool:
    return bool(spans(text, check))


def contains_text(text: str, value: str) -> bool:
    return bool(_text_pattern(value).search(text))


def cut(text: str, found: list[Span], replacement: str = "[omitted]") -> str:
    for start, end in sorted(set(found), reverse=True):
        text = text[:start] + replacement + text[end:]
    return text
