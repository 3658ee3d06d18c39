"""H-small: the runtime's hooks; its behaviour is the components of components.yaml."""

from harness.abi import BaseHarness


class Harness(BaseHarness):
    pass
