"""Summaries and the tables a run prints: per-record rows and log lines, per-solution summaries,
the wall-time breakdown, sagged clocks, failures; and :class:`RunPrinter`, what ``dsa-bench run``
prints as it goes and when it ends.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsa_bench.definitions.status import Status
from dsa_bench.results.records import CaseRecord, ResultsHeader, WallBreakdown
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
    elif record.passed:  # its message, if any, says why it was not timed
        parts.append("correctness only" + (f" ({one_line(record.message)})" if record.message else ""))
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


#: a kernel name is shown cut to this many characters (C++ names run to hundreds)
KERNEL_NAME_WIDTH = 60


def kernels_table(records: list[CaseRecord]) -> str:
    """Per timed record with GPU activity names (CUPTI), each kernel's µs per call (the mean over trials of its
    median) and its share of the call's latency; the shares may add past 100 % where kernels overlap."""
    from tabulate import tabulate

    rows = []
    for record in records:
        if record.timing is None or not record.timing.kernel_ms:
            continue
        latency = record.timing.mean_ms
        for name, ms in record.timing.kernels_mean_ms.items():
            shown = name if len(name) <= KERNEL_NAME_WIDTH else name[: KERNEL_NAME_WIDTH - 3] + "..."
            rows.append([record.case, record.solution, shown, f"{1000 * ms:.1f}", f"{100 * ms / latency:.0f}%" if latency > 0 else "-"])
    if not rows:
        return "no record holds per-kernel times (they come with CUPTI timing: dsa-bench run on a GPU)"
    return tabulate(rows, headers=["case", "solution", "kernel", "µs per call", "of latency"], disable_numparse=True)


def kernel_patterns(patterns: list[str], option: str = "--exclude") -> list[re.Pattern[str]]:
    """``patterns`` compiled as regular expressions; a bad one is refused, naming it and the option."""
    from dsa_bench.errors import DsaBenchError

    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise DsaBenchError(f"not a regular expression: {pattern!r} ({e})", where=option) from None
    return compiled


def kernel_sums_table(records: list[CaseRecord], exclude: list[re.Pattern[str]], against: str | None = None) -> str:
    """Per timed record with GPU activity names: the call's latency, its kernels' summed time, the part of it in
    kernels whose names match ``exclude`` (a regular expression searched in the name), and the rest ("kept").
    With ``against`` (a solution of the same file), also that solution's kept time over this record's, case by
    case: a comparison of two multi-kernel solutions with some of their kernels left out (a step's KV writes,
    say). Kernel times add up where they overlap, so kept times bound the GPU's work, not a latency."""
    from tabulate import tabulate

    def sums(record: CaseRecord) -> tuple[float, float]:
        assert record.timing is not None  # only timed records are summed
        kernels = record.timing.kernels_mean_ms
        left_out = sum(ms for name, ms in kernels.items() if any(p.search(name) for p in exclude))
        return 1000 * sum(kernels.values()), 1000 * left_out

    timed = [(r, *sums(r)) for r in records if r.timing is not None and r.timing.kernel_ms]
    if not timed:
        return "no record holds per-kernel times (they come with CUPTI timing: dsa-bench run on a GPU)"
    kept_by = {(r.case, r.solution): total - left_out for r, total, left_out in timed}
    rows = []
    for record, total, left_out in timed:
        assert record.timing is not None
        row = [record.case, record.solution, f"{1000 * record.timing.mean_ms:.1f}"]
        row += [f"{total:.1f}", f"{left_out:.1f}", f"{total - left_out:.1f}"]
        if against is not None:
            other = kept_by.get((record.case, against))
            row.append(f"{other / (total - left_out):.2f}x" if other is not None and total > left_out else "-")
        rows.append(row)
    headers = ["case", "solution", "latency µs", "kernels µs", "excluded µs", "kept µs"]
    return tabulate(rows, headers=headers + ([f"{against} kept / kept"] if against is not None else []), disable_numparse=True)


def sagged(records: list[CaseRecord], max_sm_mhz: str | float | None, fraction: float = 0.9) -> list[str]:
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


# --------------------------------------------------------------------------- what `dsa-bench run` prints


@dataclass
class RunPrinter:
    """What ``dsa-bench run`` prints as records finish and when the run ends.

    ``out`` is stdout (the JSON lines of ``--json-lines`` and, without it, the log); ``say`` is
    where human text goes (stderr with ``--json-lines``); ``warn`` and ``err`` print a warning and
    an error. ``live``: a progress display shows the run, so records are not logged line by line.
    """

    out: Callable[[str], None]
    say: Callable[[str], None]
    warn: Callable[[str], None]
    err: Callable[[str], None]
    quiet: bool
    json_lines: bool
    live: bool
    total: int  # the records this sitting will add
    secret: bool
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    skipped_shown: set[str] = field(default_factory=set)  # a skipped solution's first record is printed in a log, its others are not

    def opening(self, lines: list[str], warnings: list[str]) -> None:
        for warning in warnings:
            self.warn(warning)
        if not self.quiet:
            for line in lines:
                self.say(line)

    def record(self, record: CaseRecord) -> None:
        """A finished record, unless a progress display shows it."""
        self.done += 1
        if self.live:
            return
        if self.json_lines:  # a secret run's seeds stay out of its output until it ends
            # stdout flushes: a piped log shows every record as it finishes
            self.out(json.dumps(record.model_dump() | ({"seeds": {}} if self.secret else {})))
        elif not self.quiet:
            if record.status is not Status.SKIPPED or record.solution not in self.skipped_shown:
                self.out(record_line(record, self.done, self.total))
                if record.status is Status.SKIPPED:
                    self.skipped_shown.add(record.solution)
                    self.out(f"  (the other cases of {record.solution} are skipped for the same reason and not listed)")
            if self.done < self.total and self.done % progress_every(self.total) == 0:
                self.out(progress_line(self.done, self.total, time.monotonic() - self.started))

    def ending(self, outcome: RunEnding, key_axes: tuple[str, ...], show_breakdown: bool) -> None:
        """The tables, notes, warnings and errors of a finished (or interrupted) run."""
        from dsa_bench.results.roofline import roofline_table

        records, header = outcome.records, outcome.header
        wall = header.wall_breakdown
        assert wall is not None  # execute records it, interrupted or not
        both_quiet = self.json_lines and self.quiet
        if records and self.live:
            self.out(records_table(records, key_axes))
            self.out("")
        if records and not both_quiet:
            self.say(summary_table(records))
            if any(r.failed for r in records):
                self.say(failures_table(records))
            if any(r.peer is not None for r in records):
                over = f"--speedup-over {header.speedup_over}" if header.speedup_over else "the fastest peer that passed each case"
                self.say(f"vs peer: that solution's latency over each solution's, measured against {over}")
            if roofline := roofline_table(records):  # how close to the hardware, the timer and host time (docs/roofline.md)
                self.say(roofline)
        if not both_quiet:
            self.say(breakdown_table(wall) if show_breakdown else f"{wall_time(wall)} (--breakdown shows where it went)")
        if not self.quiet:
            self._notes(header, records)
        for line in outcome.sagged:
            self.warn(f"clock sagged during timing: {line}")
        for line in failures(records):
            self.err(line)
        if outcome.save_path is not None and not both_quiet:
            self.say(f"results: {outcome.save_path}" + (" (the secret seed is recorded there)" if self.secret else ""))
            if outcome.redacted_path is not None:
                self.say(f"redacted copy: {outcome.redacted_path}")
        if self.json_lines:
            self.out(json.dumps({"summary": run_summary(outcome)}))
        if outcome.stopped_by is not None:
            self.err(f"interrupted by {signal.Signals(outcome.stopped_by).name}: {len(records)} finished records kept")

    def _notes(self, header: ResultsHeader, records: list[CaseRecord]) -> None:
        for name, note in (header.solution_notes or {}).items():
            self.say(f"note [{name}]: {note}")
        for name, packages in (header.solution_packages or {}).items():
            self.say(f"packages [{name}]: " + ", ".join(f"{k} {v}" for k, v in packages.items()))
        walls: dict[str, list[str]] = {}  # solutions by the walls their workers stood in (one line when all agree)
        for name, protections in (header.worker_protections or {}).items():
            walls.setdefault("; ".join(protections), []).append(name)
        for text, holders in walls.items():
            self.say(f"worker walls [{', '.join(holders) if len(walls) > 1 else 'all'}]: {text} (docs/trust.md)")
        for line in skips(records):
            self.say(line)


@dataclass
class RunEnding:
    """How a run ended, as printed: its records (a resumed run's earlier ones too), its header, the
    records timed on a sagging clock, the signal that stopped it (None: it finished) and where it was saved."""

    workload: str
    records: list[CaseRecord]
    header: ResultsHeader
    sagged: list[str]
    stopped_by: int | None
    save_path: Path | None
    redacted_path: Path | None


def run_summary(ending: RunEnding) -> dict[str, Any]:
    """The ``{"summary": ...}`` line of ``run --json-lines``."""
    from dsa_bench.results.roofline import summarize_roofline

    records = ending.records
    names = list(dict.fromkeys(r.solution for r in records))
    wall = ending.header.wall_breakdown
    return {
        "workload": ending.workload,
        "complete": ending.stopped_by is None,
        "interrupted_by": None if ending.stopped_by is None else signal.Signals(ending.stopped_by).name,
        "results": None if ending.save_path is None else str(ending.save_path),
        "solutions": [dataclasses.asdict(summarize(records, name)) for name in names],
        "roofline": [dataclasses.asdict(summarize_roofline(records, name)) for name in names],
        "failures": [dataclasses.asdict(f) for f in failed_cases(records)],
        "wall_breakdown": None if wall is None else wall.model_dump(),
    }
