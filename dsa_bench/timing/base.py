"""The timer interface: a step protocol and the binding rule every timer follows.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

Step = Callable[[int], None]


class Timer(abc.ABC):
    """Times calls. Every timer binds the functions it calls when it is constructed (the clock,
    the synchronisation, its own helpers), so a patch of its class or of the modules it uses made
    after construction does not change what it measures; the worker constructs it before it
    imports a solution."""

    #: how results name this timer
    name: str

    @abc.abstractmethod
    def time_iterations(self, call: Step, count: int, prepare: Step, after: Step) -> list[float]:
        """Latency in ms of ``call(i)`` for ``i in range(count)``."""
