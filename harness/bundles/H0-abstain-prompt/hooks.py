"""H0 with an abstention instruction in its system prompt; hooks unchanged."""

from harness.abi import BaseHarness


class Harness(BaseHarness):
    pass
