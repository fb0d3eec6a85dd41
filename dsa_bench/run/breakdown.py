"""Where a run's wall time goes: a clock that charges elapsed time to named phases, per owner.

The runner wraps its existing steps in :meth:`PhaseClock.phase` (one ``perf_counter`` pair per
step, a few per record). Phases nest, and time is charged to the innermost open phase only, so
the phases never count a second twice and, with ``other`` (whatever no phase covered), add up to
the run's wall time. An owner is a solution's name or :data:`HARNESS` (work the harness does once
per case for every solution: its own input sets and the reference expectations).

Inside a worker request the harness sees only the round trip; the worker reports how long it
spent building inputs, calling the solution and encoding the reply, and :meth:`PhaseClock.reassign`
moves that much of the round trip from ``traffic`` to those phases (never more than the round
trip: the worker's figures are its own report, and only a diagnostic).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from dsa_bench.results.records import WallBreakdown

HARNESS = "harness"

#: every phase, in the order a record goes through them (docs/running.md says what each holds)
PHASES = (
    "planning",
    "worker_start",
    "worker_inputs",
    "correctness_calls",
    "warmup",
    "timed_calls",
    "encode",
    "traffic",
    "decode",
    "harness_inputs",
    "expectations",
    "checks",
    "results_writes",
    "worker_stop",
    "other",
)

#: the worker's own phase names (protocol replies' ``phase_s``) -> the breakdown's
WORKER_PHASES = {
    "build_inputs": "worker_inputs",
    "calls": "correctness_calls",
    "warmup": "warmup",
    "timed_calls": "timed_calls",
    "encode": "encode",
}

_now = time.perf_counter


class Span:
    """One phase block's length in seconds, inner phases included (set when the block ends)."""

    seconds: float = 0.0


class PhaseClock:
    """Seconds per (owner, phase) since the clock was made, plus ``planning_s`` spent before it
    and a ``previous`` breakdown (a resumed run's earlier sittings) to add to its own."""

    def __init__(self, planning_s: float = 0.0, previous: WallBreakdown | None = None) -> None:
        self.started = _now()
        self.planning_s = planning_s
        self.previous = previous
        self.seconds: dict[tuple[str, str], float] = {}
        self._open: list[list[Any]] = []  # [owner, phase, charged up to]

    def _charge_open(self, now: float) -> None:
        top = self._open[-1]
        self.add(top[1], now - top[2], top[0])
        top[2] = now

    @contextlib.contextmanager
    def phase(self, name: str, owner: str = HARNESS) -> Iterator[Span]:
        """Charge the time spent in the block to ``name`` (less any phase opened inside it)."""
        span = Span()
        now = _now()
        if self._open:
            self._charge_open(now)
        self._open.append([owner, name, now])
        try:
            yield span
        finally:
            end = _now()
            self._charge_open(end)
            self._open.pop()
            if self._open:
                self._open[-1][2] = end
            span.seconds = end - now

    def add(self, name: str, seconds: float, owner: str = HARNESS) -> None:
        self.seconds[(owner, name)] = self.seconds.get((owner, name), 0.0) + seconds

    def reassign(self, reported: Mapping[str, float], owner: str, round_trip_s: float) -> None:
        """Move the worker's reported phases of one request (worker names, see
        :data:`WORKER_PHASES`) out of that request's ``traffic``; unknown names are ignored and
        the total is capped at the round trip the harness measured."""
        known = {WORKER_PHASES[k]: v for k, v in reported.items() if k in WORKER_PHASES and math.isfinite(v) and v > 0}
        total = sum(known.values())
        scale = min(1.0, round_trip_s / total) if total > 0 else 0.0
        for name, seconds in known.items():
            self.add(name, seconds * scale, owner)
        self.add("traffic", -total * scale, owner)

    def breakdown(self) -> WallBreakdown:
        """The ``wall_breakdown`` section of a results file: wall seconds, seconds per phase
        (summed over cases and solutions, ``other`` included), and per solution the phases
        charged to it."""
        wall = self.planning_s + (_now() - self.started)
        phases = dict.fromkeys(PHASES, 0.0)
        phases["planning"] = self.planning_s
        by_solution: dict[str, dict[str, float]] = {}
        for (owner, name), seconds in self.seconds.items():
            phases[name] = phases.get(name, 0.0) + seconds
            if owner != HARNESS:
                mine = by_solution.setdefault(owner, {})
                mine[name] = mine.get(name, 0.0) + seconds
        phases = {k: max(0.0, v) for k, v in phases.items()}  # float rounding of traffic - reported
        by_solution = {owner: {k: max(0.0, v) for k, v in p.items()} for owner, p in by_solution.items()}
        phases["other"] = max(0.0, wall - sum(v for k, v in phases.items() if k != "other"))
        result = WallBreakdown.model_construct(wall_s=wall, sittings=1, phases_s=phases, by_solution=by_solution)
        return _added(result, self.previous) if self.previous else result


def _added(mine: WallBreakdown, previous: WallBreakdown) -> WallBreakdown:
    """Two sittings' breakdowns as one: every figure summed."""
    phases = dict(mine.phases_s)
    for name, seconds in previous.phases_s.items():
        phases[name] = phases.get(name, 0.0) + seconds
    by_solution = {owner: dict(p) for owner, p in mine.by_solution.items()}
    for owner, earlier in previous.by_solution.items():
        mine_owner = by_solution.setdefault(owner, {})
        for name, seconds in earlier.items():
            mine_owner[name] = mine_owner.get(name, 0.0) + seconds
    return WallBreakdown.model_construct(
        wall_s=mine.wall_s + previous.wall_s, sittings=mine.sittings + previous.sittings, phases_s=phases, by_solution=by_solution
    )
