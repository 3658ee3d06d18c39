"""The error every loader and check of an environment raises: which file, which field, what was expected."""

from __future__ import annotations

from pathlib import Path


class SpecError(ValueError):
    def __init__(self, path: Path | str, field: str, expected: str):
        self.path, self.field, self.expected = str(path), field, expected
        super().__init__(f"{path}: {field}: {expected}")
