"""Summaries and the tables a run prints: per-record rows and log lines, per-solution summaries,
the wall-time breakdown, sagged clocks, failures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from dsa_bench.definitions.status import Status
from dsa_bench.results.records import CaseRecord, WallBreakdown
from dsa_bench.results.roofline import record_columns, record_note


@dataclass
class SolutionSummary:
    solution: str
    passed: int
    total: int
    mean_speedup: float | None  # failed cases count as 0
    geomean_speedup: float | None  # over passed, timed cases
    mean_latency_ms: float | None  # over passed, timed cases
    wall_s: float  # the harness's wall time on this solution's records (the records' wall_s summed)
    #: the same over the cases with a peer latency (CaseRecord.peer_speedup), None where there is none
    mean_peer_speedup: float | None = None
    geomean_peer_speedup: float | None = None


def _means(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, geometric mean over the positive values) of speedups where a failure counts 0."""
    good = [v for v in values if v > 0]
    return (statistics.fmean(values) if values else None, math.exp(statistics.fmean(math.log(v) for v in good)) if good else None)


def summarize(records: list[CaseRecord], solution: str) -> SolutionSummary:
    mine = [r for r in records if r.solution == solution and r.status is not Status.SKIPPED]
    passed = [r for r in mine if r.passed]
    timed = [r for r in mine if r.speedup is not None or not r.passed]
    speedups = [r.speedup if (r.passed and r.speedup is not None) else 0.0 for r in timed]
    good = [r.speedup for r in passed if r.speedup is not None and r.speedup > 0]
    latencies = [r.timing.mean_ms for r in passed if r.timing is not None]
    any_timing = any(r.speedup is not None for r in mine)
    mean_peer, geomean_peer = _means([r.peer_speedup if r.passed and r.peer_speedup is not None else 0.0 for r in mine if r.peer])
    return SolutionSummary(
        solution=solution,
        passed=len(passed),
        total=len(mine),
        mean_speedup=statistics.fmean(speedups) if any_timing and speedups else None,
        geomean_speedup=math.exp(statistics.fmean(math.log(s) for s in good)) if good else None,
        mean_latency_ms=statistics.fmean(latencies) if latencies else None,
        wall_s=sum(r.wall_s for r in mine),
        mean_peer_speedup=mean_peer,
        geomean_peer_speedup=geomean_peer,
    )


def _fmt_us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.1f}"


def _fmt_err(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def one_line(message: str, limit: int = 300) -> str:
    """A message for one log line: a traceback's last line (the exception), else the first and
    last lines, cut to ``limit`` characters; the whole message is in the results and the failures."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if any(line.startswith(("Traceback (most recent call last)", 'File "')) for line in lines):
        lines = lines[-1:]
    text = " ... ".join(lines if len(lines) <= 2 else [lines[0], lines[-1]])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def record_line(record: CaseRecord, done: int, total: int) -> str:
    """One finished record as a plain log line: count, case, solution, status, latency (or
    "correctness only") and speedup, its wall time, and for a failure the message."""
    where = "" if record.gpu is None else f" (gpu {record.gpu})"
    parts = [f"[{done}/{total}] {record.case} {record.solution}{where}: {record.status.value}"]
    if record.timing is not None:
        parts.append(f"{_fmt_us(record.timing.mean_ms)} µs" + ("" if record.speedup is None else f" ({record.speedup:.2f}x)"))
        if record.peer_speedup is not None:
            parts.append(f"{record.peer_speedup:.2f}x vs {record.peer}")
        if note := record_note(record):
            parts.append(note)
    elif record.passed:
        parts.append("correctness only")
    parts.append(f"{record.wall_s:.1f} s")
    line = ", ".join(parts)
    return f"{line}: {one_line(record.message)}" if record.message and not record.passed else line


def progress_every(total: int) -> int:
    """A log's progress line comes after every tenth of the run's records, and never more often than every 10th."""
    return max(10, math.ceil(total / 10))


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """How far a run is and, at its pace so far, how long the rest takes (a log has no progress bar)."""
    left = elapsed_s / done * (total - done) if done else 0.0
    return f"progress: {done}/{total} records in {_duration(elapsed_s)}; about {_duration(left)} left at this pace"


def records_table(records: list[CaseRecord], key_axes: tuple[str, ...]) -> str:
    """One row per (case, solution): key axes, status, error figures and, when timed, latency,
    speedup over the reference and (where a peer ran) over the peer it is measured against.
    A skipped solution's records are one row (its cases share one reason)."""
    from tabulate import tabulate

    skipped = {r.solution: sum(s.solution == r.solution for s in records if s.status is Status.SKIPPED)
               for r in records if r.status is Status.SKIPPED}  # fmt: skip
    first_skip = {name: next(r for r in records if r.solution == name and r.status is Status.SKIPPED) for name in skipped}
    records = [r for r in records if r.status is not Status.SKIPPED] + [
        first_skip[name].model_copy(update={"case": f"({n} cases)", "axes": {}}) for name, n in skipped.items()
    ]

    timed = any(r.timing is not None for r in records)
    spread = any(r.gpu is not None for r in records)  # a multi-device run: say where each ran
    headers = ["case", *key_axes, "solution", *(["gpu"] if spread else []), "status", "max abs err", "max rel err"]
    with_peer = any(r.peer is not None for r in records)
    if timed:
        headers += ["timer", "mean µs", "median µs", "min µs", "trial spread", "speedup"]
    if with_peer:
        headers += ["vs peer", "peer"]
    rows = []
    for r in records:
        row = [
            r.case,
            *[r.axes.get(a, "") for a in key_axes],
            r.solution,
            *([r.gpu] if spread else []),
            r.status.value,
            _fmt_err(r.max_abs_error),
            _fmt_err(r.max_rel_error),
        ]
        if timed:
            t = r.timing
            row += [
                t.timer if t else "-",
                _fmt_us(t.mean_ms if t else None),
                _fmt_us(t.median_ms if t else None),
                _fmt_us(t.min_ms if t else None),
                "-" if t is None else f"{100 * t.spread:.1f}%",
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
            ]
        if with_peer:
            row += [_x(r.peer_speedup), r.peer or "-"]
        rows.append(row)
    extra_headers, extra_cells = record_columns(records)  # fraction of the roofline, host time where launch-bound
    rows = [[*row, *cells] for row, cells in zip(rows, extra_cells, strict=True)]
    return tabulate(rows, headers=headers + extra_headers, disable_numparse=True)


def summary_table(records: list[CaseRecord]) -> str:
    from tabulate import tabulate

    names = list(dict.fromkeys(r.solution for r in records))
    with_peer = any(r.peer is not None for r in records)
    rows = []
    for name in names:
        s = summarize(records, name)
        passed = f"{s.passed}/{s.total}" if s.total else "skipped"
        row = [name, passed, _x(s.mean_speedup), _x(s.geomean_speedup), _fmt_us(s.mean_latency_ms), f"{s.wall_s:.1f}"]
        if with_peer:
            row += [_x(s.mean_peer_speedup), _x(s.geomean_peer_speedup)]
        rows.append(row)
    headers = ["solution", "passed", "mean speedup", "geomean speedup", "mean µs", "wall s"]
    if with_peer:
        headers += ["mean vs peer", "geomean vs peer"]
    return tabulate(rows, headers=headers, disable_numparse=True)


def wall_time(breakdown: WallBreakdown) -> str:
    """The run's wall time in words (all sittings of a resumed run together)."""
    sittings = breakdown.sittings
    return f"wall time {breakdown.wall_s:.1f} s" + (f" over {sittings} sittings" if sittings > 1 else "")


def breakdown_table(breakdown: WallBreakdown) -> str:
    """A results file's ``wall_breakdown``: seconds per phase, its share of the wall time, and
    each solution's part of it (phases charged to the harness have none)."""
    from tabulate import tabulate

    wall = breakdown.wall_s
    owners = list(breakdown.by_solution)
    rows = []
    for phase, seconds in breakdown.phases_s.items():
        mine = [breakdown.by_solution[owner].get(phase) for owner in owners]
        rows.append([phase, f"{seconds:.2f}", f"{100 * seconds / wall:.1f}%" if wall > 0 else "-",
                     *("-" if v is None else f"{v:.2f}" for v in mine)])  # fmt: skip
    rows.append(["total", f"{wall:.2f}", "100.0%", *(f"{sum(breakdown.by_solution[o].values()):.2f}" for o in owners)])
    headers = ["phase", "s", "of wall", *(f"{o} s" for o in owners)]
    return wall_time(breakdown) + "\n" + tabulate(rows, headers=headers, disable_numparse=True)


def sagged(records: list[CaseRecord], max_sm_mhz: float | None, fraction: float = 0.9) -> list[str]:
    """Records timed while the SM clock was below ``fraction`` of the device maximum."""
    if not max_sm_mhz:
        return []
    flagged = []
    for r in records:
        low = r.timing.min_sm_clock_mhz() if r.timing else None
        if low is not None and low < fraction * float(max_sm_mhz):
            flagged.append(f"{r.case} [{r.solution}]: SM clock {low} MHz < {fraction:.0%} of max {max_sm_mhz} MHz")
    return flagged


@dataclass(frozen=True)
class Failure:
    """One failed record, as the summary states it: who failed which case, and why in one line."""

    solution: str
    case: str
    status: str
    reason: str  # the checker's (or the error's) message in one line (:func:`one_line`)


def failed_cases(records: list[CaseRecord]) -> list[Failure]:
    """Every failed record (a skip is no failure), in run order."""
    return [Failure(r.solution, r.case, r.status.value, one_line(r.message) or "-") for r in records if r.failed]


def failures_table(records: list[CaseRecord]) -> str:
    """The failed records under the summary: case, solution, status and the one-line reason
    (empty when nothing failed). Peers are judged like every solution: a peer's wrong answer
    is listed here and its case gets no speedup over it."""
    from tabulate import tabulate

    rows = [[f.case, f.solution, f.status, f.reason] for f in failed_cases(records)]
    if not rows:
        return ""
    return tabulate(rows, headers=["failed case", "solution", "status", "reason"], disable_numparse=True)


def failures(records: list[CaseRecord]) -> list[str]:
    return [f"{r.case} [{r.solution}] {r.status.value}: {r.message}" for r in records if r.failed]


def skips(records: list[CaseRecord]) -> list[str]:
    """One line per skipped solution (its cases share one reason), not one per case."""
    reasons: dict[str, tuple[str, int]] = {}
    for r in records:
        if r.status is Status.SKIPPED:
            reason, count = reasons.get(r.solution, (r.message, 0))
            reasons[r.solution] = (reason, count + 1)
    return [f"{name}: {count} case(s) {reason}" for name, (reason, count) in reasons.items()]
