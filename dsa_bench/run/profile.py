"""``dsa-bench profile``: one case of one solution under Nsight Compute (or Nsight Systems), and
what its report says per kernel.

The profiled process is :mod:`dsa_bench.run.profile_target`, started as a worker is (a fresh
interpreter in a session of its own, with only the worker's environment and the solution's own
build caches, :class:`dsa_bench.run.runner.WorkerHandle`), but as the harness's user: the profiler
injects itself into it. It runs the case's own call and nothing else; only one call, between
``cudaProfilerStart`` and ``cudaProfilerStop``, is collected.

Nsight Compute runs with ``--clock-control none`` (the GPU keeps the clocks a timed run sees; a
profiler never changes them here) and the sections below; its report is read back with
``ncu --import REPORT --csv --page raw --print-units base`` and each kernel's duration, DRAM and SM
throughput, achieved occupancy and top three stall reasons are printed. Nsight Systems records
the CUDA and NVTX trace of the same window; ``nsys stats --report cuda_gpu_kern_sum`` gives each
kernel's launches and times.
"""

from __future__ import annotations

import csv
import io
import json
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dsa_bench.errors import DsaBenchError
from dsa_bench.paths import safe_file_name
from dsa_bench.run.profile_target import ProfileJob

#: Nsight Compute sections: duration and throughputs (SpeedOfLight), achieved occupancy
#: (Occupancy), launch geometry (LaunchStats), stall reasons (WarpStateStats, SchedulerStats)
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats")

DURATION = "gpu__time_duration.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY_PCT = "sm__warps_active.avg.pct_of_peak_sustained_active"
#: the metrics printed, asked for by name too (the sections hold them; naming them keeps them whatever a section file holds)
NCU_METRICS = (DURATION, DRAM_PCT, SM_PCT, OCCUPANCY_PCT)

#: stall-reason metric families, the first present in a report wins: WarpStateStats' per-issue
#: averages, the sampled stall counts, the average warp latencies
STALL_FAMILIES = (
    re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$"),
    re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$"),
    re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+?)(?:\.\w+)?$"),
)
#: "selected" is the issuing warp, not a stall; the sampled "_not_issued" counts repeat the issued ones
_NOT_STALLS = ("selected",)

_TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}

#: Nsight Systems' kernel summary columns (nsys stats --report cuda_gpu_kern_sum --format csv)
NSYS_COLUMNS = ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Name")


# --------------------------------------------------------------------------- what to run


def profiler_refusal(nsys: bool, which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The one-line refusal when the profiler is not on PATH, or None."""
    tool = "nsys" if nsys else "ncu"
    if which(tool) is not None:
        return None
    name = "Nsight Systems" if nsys else "Nsight Compute"
    command = "dsa-bench profile --nsys" if nsys else "dsa-bench profile"
    return f"`{tool}` is not on PATH: `{command}` runs the case under {name}; install it or add it to PATH"


def report_base(root: Path, workload: str, case: str, solution: str) -> Path:
    """``results/profile/<workload>-<case>-<solution>`` (the profiler adds .ncu-rep or .nsys-rep)."""
    return root / "results" / "profile" / safe_file_name(f"{workload}-{case}-{solution}")


def _beside(base: Path, suffix: str) -> Path:
    return base.parent / f"{base.name}{suffix}"  # not with_suffix: a case id may hold a dot


def ncu_command(ncu: str, report: Path, target: list[str]) -> list[str]:
    """Nsight Compute over ``target``: every process it starts, clocks left alone, only the
    cudaProfilerStart/Stop window, the sections of :data:`NCU_SECTIONS`."""
    sections = [arg for name in NCU_SECTIONS for arg in ("--section", name)]
    return [ncu, "--target-processes", "all", "--clock-control", "none", "--profile-from-start", "off", *sections,
            "--metrics", ",".join(NCU_METRICS), "--force-overwrite", "-o", str(report), *target]  # fmt: skip


def ncu_import_command(ncu: str, report: Path) -> list[str]:
    """The report's raw page as CSV: one row per kernel, every collected metric, base units."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


def nsys_command(nsys: str, report: Path, target: list[str]) -> list[str]:
    """Nsight Systems over ``target``: the CUDA and NVTX trace of the cudaProfilerStart/Stop window."""
    return [nsys, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--force-overwrite=true", "-o", str(report), *target]  # fmt: skip


def nsys_stats_command(nsys: str, report: Path) -> list[str]:
    return [nsys, "stats", "--report=cuda_gpu_kern_sum", "--format=csv", "--force-export=true", str(report)]


# --------------------------------------------------------------------------- reading the reports


@dataclass
class KernelProfile:
    """One profiled kernel launch, from Nsight Compute's raw page."""

    name: str
    duration_us: float | None
    dram_pct: float | None
    sm_pct: float | None
    occupancy_pct: float | None
    stalls: list[tuple[str, float]] = field(default_factory=list)  # the top reasons, largest first


def _number(text: str) -> float | None:
    """A value of ncu's CSV ("1,234.5", "n/a", ""): the number, or None."""
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:
        return None


def _csv_from(text: str, first_column: str) -> list[list[str]]:
    """The CSV rows of ``text`` from the header row whose first cell is ``first_column`` (profilers
    print progress and warning lines before it)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith((f'"{first_column}"', f"{first_column},"))), None)
    if start is None:
        raise DsaBenchError(f"no CSV table with a {first_column!r} column in the profiler's output")
    return [row for row in csv.reader(io.StringIO("\n".join(lines[start:]))) if row]


def parse_ncu_raw(text: str, top: int = 3) -> list[KernelProfile]:
    """Kernels of ``ncu --import R --csv --page raw`` output: a header row of metric names, a row of
    their units, then one row per kernel launch."""
    rows = _csv_from(text, "ID")
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        raise DsaBenchError("the profiler's CSV has no 'Kernel Name' column: not an ncu raw page")
    units: list[str] = [""] * len(header)
    body = rows[1:]
    if body and body[0][0].strip() == "":  # the units row
        units, body = body[0], body[1:]
    family = next((f for f in STALL_FAMILIES if any(f.match(h) for h in header)), None)
    kernels = []
    for row in body:
        row = row + [""] * (len(header) - len(row))

        def value(metric: str, row: list[str] = row) -> float | None:
            return _number(row[col[metric]]) if metric in col else None

        duration = value(DURATION)
        if duration is not None:
            duration *= _TIME_UNITS.get(units[col[DURATION]].strip(), 1e-3)  # base unit: nanoseconds
        stalls: list[tuple[str, float]] = []
        if family is not None:
            for name, i in col.items():
                match = family.match(name)
                if match is None or match.group(1) in _NOT_STALLS or match.group(1).endswith("_not_issued"):
                    continue
                amount = _number(row[i])
                if amount is not None and amount > 0:
                    stalls.append((match.group(1), amount))
        stalls.sort(key=lambda s: -s[1])
        kernels.append(KernelProfile(row[col["Kernel Name"]], duration, value(DRAM_PCT), value(SM_PCT), value(OCCUPANCY_PCT), stalls[:top]))
    return kernels


@dataclass
class KernelSummary:
    """One kernel name's launches in the window, from Nsight Systems' cuda_gpu_kern_sum."""

    name: str
    instances: int
    total_us: float
    avg_us: float
    min_us: float
    max_us: float
    time_pct: float


def parse_nsys_kern_sum(text: str) -> list[KernelSummary]:
    """Rows of ``nsys stats --report cuda_gpu_kern_sum --format csv``, after whatever nsys prints first."""
    rows = _csv_from(text, "Time (%)")
    col = {name: i for i, name in enumerate(rows[0])}
    missing = [c for c in ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Min (ns)", "Max (ns)", "Name") if c not in col]
    if missing:
        raise DsaBenchError(f"nsys's kernel summary lacks the column(s) {', '.join(missing)}")
    out = []
    for row in rows[1:]:
        if len(row) < len(rows[0]):
            continue  # a trailing line that is not a kernel

        def ns(name: str, row: list[str] = row) -> float:
            return (_number(row[col[name]]) or 0.0) / 1e3

        out.append(KernelSummary(row[col["Name"]], int(_number(row[col["Instances"]]) or 0), ns("Total Time (ns)"), ns("Avg (ns)"),
                                 ns("Min (ns)"), ns("Max (ns)"), _number(row[col["Time (%)"]]) or 0.0))  # fmt: skip
    return out


def _short(name: str, limit: int = 70) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def kernels_table(kernels: list[KernelProfile]) -> str:
    from tabulate import tabulate

    rows = [[_short(k.name), _fmt(k.duration_us, 2), _fmt(k.dram_pct), _fmt(k.sm_pct), _fmt(k.occupancy_pct),
             ", ".join(f"{reason} {amount:.3g}" for reason, amount in k.stalls) or "-"] for k in kernels]  # fmt: skip
    headers = ["kernel", "duration µs", "DRAM %", "SM %", "achieved occupancy %", "top stall reasons"]
    total = sum(k.duration_us or 0.0 for k in kernels)
    return tabulate(rows, headers=headers, disable_numparse=True) + f"\n{len(kernels)} kernel launch(es), {total:.2f} µs in all"


def timeline_table(kernels: list[KernelSummary]) -> str:
    from tabulate import tabulate

    rows = [[_short(k.name), k.instances, f"{k.total_us:.2f}", f"{k.avg_us:.2f}", f"{k.min_us:.2f}", f"{k.max_us:.2f}",
             f"{k.time_pct:.1f}"] for k in kernels]  # fmt: skip
    headers = ["kernel", "launches", "total µs", "avg µs", "min µs", "max µs", "time %"]
    launches = sum(k.instances for k in kernels)
    return tabulate(rows, headers=headers, disable_numparse=True) + f"\n{launches} kernel launch(es) in the profiled call"


# --------------------------------------------------------------------------- running it


@dataclass(frozen=True)
class ProfileRequest:
    workload: str
    solution: str
    case: str
    nsys: bool = False
    input_set: int = 0
    warmup: int = 3
    seed: int | None = None
    device: str = "auto"
    timeout_s: float = 1800.0


@dataclass
class ProfileOutcome:
    report: Path  # the profiler's report file
    table: str  # what to print
    csv_path: Path  # the parsed CSV, kept beside the report


def _target_env(solution, definition: str, device, root: Path) -> tuple[dict[str, str], list[Path]]:
    """The worker's environment and build caches for ``solution`` (as a run's worker gets them)."""
    from dsa_bench.run import isolation
    from dsa_bench.run.runner import RunOptions, WorkerHandle
    from dsa_bench.workloads import RunSettings

    options = RunOptions(device=device, settings=RunSettings(), timer=None, l2_flush="clean",
                         log_dir=root / ".cache" / "dsa-bench" / "logs", cache_dir=root / ".cache" / "dsa-bench")  # fmt: skip
    handle = WorkerHandle(solution, definition, options, isolation.choose_identity("harness", 0, [], []))
    isolation.give_to(handle.identity, handle.writable)
    return handle._environment(), handle.writable


def profile_device(name: str) -> torch.device:
    """The CUDA device to profile on; a CPU is refused (there is nothing for a GPU profiler to see)."""
    from dsa_bench.run.plan import pick_device

    device = pick_device(name)
    if device.type != "cuda":
        raise DsaBenchError("profile needs a CUDA device (this machine has none, or --device cpu was given)")
    return device


def run_profile(request: ProfileRequest, root: Path, which: Callable[[str], str | None] = shutil.which) -> ProfileOutcome:
    """Profile one case of one solution (see the module's docstring). Refusals raise DsaBenchError."""
    refusal = profiler_refusal(request.nsys, which)
    if refusal is not None:
        raise DsaBenchError(refusal)
    from dsa_bench.project import resolve_solution, resolve_workload
    from dsa_bench.run.case_context import correctness_seeds
    from dsa_bench.run.plan import select_cases

    workload = resolve_workload(request.workload, root)
    cases = select_cases(workload, [request.case])
    if len(cases) != 1:
        raise DsaBenchError(f"--case {request.case!r} matches {len(cases)} cases of {workload.name}; profile takes exactly one")
    case = cases[0]
    solution = resolve_solution(request.solution, root)
    solution.entry_for(workload.definition.name)  # a clear refusal when the solution has no entry for it
    settings = workload.settings.replace(seed=request.seed)
    if not 0 <= request.input_set < settings.input_sets:
        raise DsaBenchError(f"--input-set {request.input_set}: the run builds input sets 0 to {settings.input_sets - 1} for each case")
    device = profile_device(request.device)
    base = report_base(root, workload.name, case.id, solution.name)
    base.parent.mkdir(parents=True, exist_ok=True)
    job_path, status_path = _beside(base, ".job.pkl"), _beside(base, ".status.json")
    status_path.unlink(missing_ok=True)
    job = ProfileJob(solution_path=str(solution.path), packed_from=str(solution.packed_from) if solution.packed_from else None,
                     definition=workload.definition.name, dataset_root=None, case=case,
                     seed=correctness_seeds(settings, case)[request.input_set], warmup=request.warmup, device=str(device),
                     status_path=str(status_path))  # fmt: skip
    job_path.write_bytes(pickle.dumps(job))
    env, _ = _target_env(solution, workload.definition.name, device, root)
    target = [sys.executable, "-m", "dsa_bench.run.profile_target", str(job_path)]
    tool = which("nsys" if request.nsys else "ncu")
    assert tool is not None
    command = nsys_command(tool, base, target) if request.nsys else ncu_command(tool, base, target)
    log_path = _beside(base, ".log")
    try:
        with open(log_path, "w") as log:
            log.write(" ".join(command) + "\n")
            log.flush()
            done = subprocess.run(command, env=env, cwd=root, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, timeout=request.timeout_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DsaBenchError(f"the profiled case did not finish within {request.timeout_s:g} s (log: {log_path})") from None
    finally:
        job_path.unlink(missing_ok=True)
    status = {"ok": False, "error": "the profiled process wrote no status"}
    if status_path.is_file():
        status = json.loads(status_path.read_text())
    status_path.unlink(missing_ok=True)
    if not status["ok"] or done.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise ProfileFailed(f"the profiled run failed (exit code {done.returncode}); log {log_path}:\n{status.get('error') or tail}")
    report = _beside(base, ".nsys-rep" if request.nsys else ".ncu-rep")  # the name the profiler gave it
    read = nsys_stats_command(tool, report) if request.nsys else ncu_import_command(tool, report)
    text = subprocess.run(read, capture_output=True, text=True, check=False, timeout=600, cwd=root).stdout
    csv_path = _beside(base, ".kern_sum.csv" if request.nsys else ".raw.csv")
    csv_path.write_text(text)
    table = timeline_table(parse_nsys_kern_sum(text)) if request.nsys else kernels_table(parse_ncu_raw(text))
    return ProfileOutcome(report, table, csv_path)


class ProfileFailed(Exception):
    """The profiled process failed (the solution raised, the profiler could not run): exit 1, not bad input."""
