"""Result records, the environment record, summaries, and the versioned results file.

The results file is one JSON document rewritten atomically after every record, so an
interrupted run keeps everything it finished and the file is always valid JSON.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch

import dsa_bench
from dsa_bench.definitions.base import Status
from dsa_bench.files import check_output_path, has_json_format, write_atomic

RESULTS_FORMAT = "dsa-bench-results"
RESULTS_VERSION = 1


@dataclass
class Timing:
    """Latency of one solution on one case: per-trial medians, their mean, and the raw samples."""

    timer: str
    samples_ms: list[list[float]]
    #: per trial, SM/memory clocks read after warm-up and after the timed calls
    clocks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trial_medians_ms(self) -> list[float]:
        return [statistics.median(s) for s in self.samples_ms]

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.trial_medians_ms)

    @property
    def min_ms(self) -> float:
        return min(min(s) for s in self.samples_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median([x for s in self.samples_ms for x in s])

    @property
    def spread(self) -> float:
        """(max - min) / mean of the trial medians: how much the trials disagree."""
        medians = self.trial_medians_ms
        return (max(medians) - min(medians)) / self.mean_ms if self.mean_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "timer": self.timer,
            "mean_ms": self.mean_ms,
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "spread": self.spread,
            "trial_medians_ms": self.trial_medians_ms,
            "samples_ms": self.samples_ms,
            "clocks": self.clocks,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Timing":
        return cls(timer=data["timer"], samples_ms=data["samples_ms"], clocks=data.get("clocks", []))

    def min_sm_clock_mhz(self) -> int | None:
        readings = [c[k]["sm_mhz"] for c in self.clocks for k in ("after_warmup", "after_timing") if c.get(k)]
        return min(readings) if readings else None


@dataclass
class CaseRecord:
    """One solution on one case."""

    case: str
    solution: str
    axes: dict[str, int]
    status: Status
    message: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    seeds: dict[str, Any] = field(default_factory=dict)
    timing: Timing | None = None
    speedup: float | None = None
    wall_s: float = 0.0
    #: where the harness spent the wall time of this record (worker and checker phases)
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["timing"] = self.timing.to_json() if self.timing else None
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CaseRecord":
        fields = dict(data)
        fields["status"] = Status(fields["status"])
        fields["timing"] = Timing.from_json(fields["timing"]) if fields.get("timing") else None
        return cls(**fields)


@dataclass
class SolutionSummary:
    solution: str
    passed: int
    total: int
    mean_speedup: float | None  # failed cases count as 0
    geomean_speedup: float | None  # over passed, timed cases
    mean_latency_ms: float | None  # over passed, timed cases


def summarize(records: list[CaseRecord], solution: str) -> SolutionSummary:
    mine = [r for r in records if r.solution == solution]
    passed = [r for r in mine if r.passed]
    timed = [r for r in mine if r.speedup is not None or not r.passed]
    speedups = [r.speedup if (r.passed and r.speedup is not None) else 0.0 for r in timed]
    good = [r.speedup for r in passed if r.speedup is not None and r.speedup > 0]
    latencies = [r.timing.mean_ms for r in passed if r.timing is not None]
    any_timing = any(r.speedup is not None for r in mine)
    return SolutionSummary(
        solution=solution,
        passed=len(passed),
        total=len(mine),
        mean_speedup=statistics.fmean(speedups) if any_timing and speedups else None,
        geomean_speedup=math.exp(statistics.fmean(math.log(s) for s in good)) if good else None,
        mean_latency_ms=statistics.fmean(latencies) if latencies else None,
    )


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    """What produced these numbers: machine, versions and, on a GPU, the device's identity."""
    env: dict[str, Any] = {
        "dsa_bench": dsa_bench.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cupti_python": _version("cupti-python"),
        "device": str(device),
        "hostname": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            cuda=torch.version.cuda,
            capability=f"{props.major}.{props.minor}",
        )
        from dsa_bench.timing import driver_info

        env.update(driver_info(device.index if device.index is not None else torch.cuda.current_device()))
    else:
        env["gpu"] = None
    return env


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def check_results_path(path: Path, inputs: Iterable[Path], input_folders: Iterable[Path]) -> None:
    """Refuse a ``--save`` path unless it is new or an earlier results file: never an input of
    the run, a path inside an input folder (a solution, a dataset), or a file of another kind."""
    check_output_path(path, "--save", "dsa-bench results", lambda p: has_json_format(p, RESULTS_FORMAT), inputs, input_folders)


class ResultsFile:
    """A results document kept on disk as records arrive."""

    def __init__(self, path: Path | None, header: dict[str, Any]) -> None:
        self.path = path
        self.document: dict[str, Any] = {
            "format": RESULTS_FORMAT,
            "version": RESULTS_VERSION,
            "created": now_iso(),
            **header,
            "records": [],
            "complete": False,
        }
        self._write()

    def add(self, record: CaseRecord) -> None:
        self.document["records"].append(record.to_json())
        self._write()

    def update(self, **fields: Any) -> None:
        self.document.update(fields)
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            write_atomic(self.path, json.dumps(self.document, indent=1, allow_nan=True), "results")


# --------------------------------------------------------------------------- tables


def _fmt_us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1000:.1f}"


def _fmt_err(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def records_table(records: list[CaseRecord], key_axes: tuple[str, ...]) -> str:
    """One row per (case, solution): key axes, status, error figures and, when timed, latency and speedup."""
    from tabulate import tabulate

    timed = any(r.timing is not None for r in records)
    headers = ["case", *key_axes, "solution", "status", "max abs err", "max rel err"]
    if timed:
        headers += ["timer", "mean µs", "median µs", "min µs", "trial spread", "speedup"]
    rows = []
    for r in records:
        row = [r.case, *[r.axes.get(a, "") for a in key_axes], r.solution, r.status.value, _fmt_err(r.max_abs_error), _fmt_err(r.max_rel_error)]
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
        rows.append(row)
    return tabulate(rows, headers=headers, disable_numparse=True)


def summary_table(records: list[CaseRecord]) -> str:
    from tabulate import tabulate

    names = list(dict.fromkeys(r.solution for r in records))
    rows = []
    for name in names:
        s = summarize(records, name)
        rows.append(
            [
                name,
                f"{s.passed}/{s.total}",
                "-" if s.mean_speedup is None else f"{s.mean_speedup:.2f}x",
                "-" if s.geomean_speedup is None else f"{s.geomean_speedup:.2f}x",
                _fmt_us(s.mean_latency_ms),
            ]
        )
    return tabulate(rows, headers=["solution", "passed", "mean speedup", "geomean speedup", "mean µs"], disable_numparse=True)


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


def failures(records: list[CaseRecord]) -> list[str]:
    return [f"{r.case} [{r.solution}] {r.status.value}: {r.message}" for r in records if not r.passed]
