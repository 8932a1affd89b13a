from copy_v1.harness import CopyHarness
from copy_v1.taskset import CopyTaskset

__all__ = ["CopyTaskset", "CopyHarness"]
