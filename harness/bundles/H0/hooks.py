"""H0: the runtime's defaults, unchanged."""

from harness.abi import BaseHarness


class Harness(BaseHarness):
    pass
