"""The outcome of one solution on one case (Status), and what a checker concluded (CheckResult).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(str, enum.Enum):
    """Outcome of one solution on one case."""

    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_INDICES = "INCORRECT_INDICES"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"
    #: the reported times are impossible (below the physical floor, or more than the wall time)
    TIMING_SUSPECT = "TIMING_SUSPECT"
    #: not run: the solution needs a package or a GPU this machine lacks (its manifest's ``requires``);
    #: neither a pass nor a failure
    SKIPPED = "SKIPPED"


@dataclass
class CheckResult:
    """What a checker concluded about one set of outputs."""

    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED
