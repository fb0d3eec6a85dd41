"""Planning a run from what the command line asked for, and carrying it out.

:func:`plan_run` resolves and checks everything before the first case: the workload (a project
workload or a flashinfer-bench dataset's), the cases, the device and timer, the settings with the
command line's overrides, the solutions (the reference first, names unique, ``reference``
reserved), the results path (never an input or a file of another kind), and whom each worker
runs as. :func:`execute` runs the plan, writing records as they finish, and turns Ctrl-C, SIGTERM
and SIGHUP into an orderly stop.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import signal
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dsa_bench.errors import DsaBenchError
from dsa_bench.paths import safe_file_name
from dsa_bench.project import check_run_solutions, reference_solution, relative_to_root, resolve_solution, resolve_workload
from dsa_bench.results.environment import environment
from dsa_bench.results.records import CaseRecord, ResultsFile, check_results_path, now_iso
from dsa_bench.results.tables import sagged
from dsa_bench.run.isolation import WORKER_USER_MODES, WorkerIdentity
from dsa_bench.run.runner import Interrupted, RunOptions, order_solutions, run_workload, worker_identities
from dsa_bench.solution import REFERENCE_SOLUTION, Solution, content_hash, discover, load_solution
from dsa_bench.timing import choose_timer
from dsa_bench.timing.flush import check_l2_flush, measure_copy_bandwidth
from dsa_bench.workloads import Case, Workload, setting_problem

#: Longest --case-timeout and --compile-timeout, in seconds: a day (longer is a typo, not a plan).
MAX_TIMEOUT_S = 86400.0


@dataclass(frozen=True)
class RunRequest:
    """What ``dsa-bench run`` was asked, option by option (None: the workload's own setting)."""

    workload: str
    solutions: list[str] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    device: str = "auto"
    timer: str = "auto"
    l2_flush: str = "clean"
    seed: int | None = None
    input_sets: int | None = None
    warmup: int | None = None
    iterations: int | None = None
    trials: int | None = None
    case_timeout: float = 600.0
    compile_timeout: float = 900.0
    save: Path | None = None
    no_save: bool = False
    dataset: Path | None = None
    worker_user: str = "auto"
    speedup_over: str | None = None  # None: the fastest peer that passed each case


@dataclass
class RunPlan:
    workload: Workload
    cases: list[Case]
    solutions: list[Solution]
    options: RunOptions
    identities: dict[str, WorkerIdentity]
    save_path: Path | None
    root: Path
    warnings: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        if self.options.timer is None:
            return "correctness only (no CUDA device: nothing is timed)"
        return f"timing with {self.options.timer}, {self.options.l2_flush} L2 flush"

    def header(self) -> dict[str, Any]:
        """The results document's header; paths are relative to the project root where they lie in it."""
        wl, settings, options = self.workload, self.options.settings, self.options
        workload = {
            "name": wl.name,
            "path": relative_to_root(wl.path, self.root),
            "trace": relative_to_root(wl.trace_path, self.root),
            "definition": wl.definition.name,
        }
        if options.dataset_root is not None:
            workload["dataset"] = relative_to_root(options.dataset_root, self.root)
        env = environment(options.device) | ({"copy_gbps": options.copy_bytes_per_s / 1e9} if options.copy_bytes_per_s else {})
        return {
            "workload": workload,
            "settings": {**{k: v for k, v in asdict(settings).items() if k != "tolerance"}, "tolerance": asdict(settings.tolerance)},
            "timer": options.timer,
            "l2_flush": options.l2_flush if options.timer else None,
            "environment": env,
            "workers": {name: identity.description for name, identity in self.identities.items()},
            "solutions": {
                s.name: {"path": relative_to_root(s.path, self.root), "content_hash": content_hash(s.path)} for s in self.solutions
            },
            "peers": [s.name for s in self.solutions if s.requires.any],
            "speedup_over": options.speedup_over,
        }


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DsaBenchError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DsaBenchError(f"--device {name} asked for CUDA but no CUDA device is available")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise DsaBenchError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type not in ("cpu", "cuda"):
        raise DsaBenchError(f"--device {name}: only cpu and cuda devices are supported")
    return device


def check_request(request: RunRequest) -> None:
    """Refuse a bad option (``--input-sets 0``, an infinite timeout) before anything is loaded."""
    check_l2_flush(request.l2_flush)
    if request.worker_user not in WORKER_USER_MODES:
        raise DsaBenchError(f"--worker-user {request.worker_user!r}: expected one of {', '.join(WORKER_USER_MODES)}")
    counts = {
        "--seed": request.seed,
        "--input-sets": request.input_sets,
        "--warmup": request.warmup,
        "--iterations": request.iterations,
        "--trials": request.trials,
    }
    for option, value in counts.items():
        problem = None if value is None else setting_problem(option.removeprefix("--").replace("-", "_"), value)
        if problem is not None:
            raise DsaBenchError(f"{option} {value}: {problem}")
    for option, seconds in (("--case-timeout", request.case_timeout), ("--compile-timeout", request.compile_timeout)):
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
            raise DsaBenchError(f"{option} {seconds:g}: expected a finite number of seconds > 0 and <= {MAX_TIMEOUT_S:g}")


def select_cases(workload: Workload, patterns: list[str]) -> list[Case]:
    if not patterns:
        return list(workload.cases)
    chosen = [c for c in workload.cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not chosen:
        raise DsaBenchError(f"no case of workload {workload.name!r} matches {', '.join(patterns)}")
    return chosen


def _solutions(request: RunRequest, workload: Workload, root: Path, timing: bool) -> list[Solution]:
    definition = workload.definition.name
    reference = reference_solution(root)
    reference_folders = [root / "solutions" / REFERENCE_SOLUTION]
    if request.dataset is not None and (reference is None or definition not in reference.entries):
        from dsa_bench.dataset import reference_solution_folder

        # a dataset definition dsa-bench has no reference solution of: run the JSON's own reference
        reference = load_solution(reference_solution_folder(workload.definition, root / ".cache" / "dsa-bench"))
        reference_folders.append(reference.path)
    if request.solutions:
        chosen = [
            reference if request.dataset is not None and s == REFERENCE_SOLUTION and reference else resolve_solution(s, root)
            for s in request.solutions
        ]
        for s in chosen:
            s.entry_for(definition)
    else:
        chosen = [s for s in discover(root / "solutions") if definition in s.entries]
    check_run_solutions(chosen, reference_folders)
    if timing and reference is None:
        raise DsaBenchError(f"timing needs the reference solution at {root / 'solutions' / REFERENCE_SOLUTION}")
    chosen = order_solutions(chosen, timing, reference)
    if not chosen:
        raise DsaBenchError(f"no solution implements {definition}")
    return chosen


def run_inputs(workload: Workload, solutions: list[Solution], dataset: Path | None) -> tuple[list[Path], list[Path]]:
    """The files and folders a run reads, which its results file must not overwrite or enter."""
    files = [p for p in (workload.path, workload.trace_path) if p is not None]
    files += [source.path for case in workload.cases for source in case.inputs.values() if source.path is not None]
    folders = [s.path for s in solutions] + ([dataset] if dataset is not None else [])
    return files, folders


def plan_run(request: RunRequest, root: Path) -> RunPlan:
    """Everything a run needs, checked; raises DsaBenchError on the first problem."""
    check_request(request)
    if request.dataset is None:
        workload = resolve_workload(request.workload, root)
    else:
        from dsa_bench.dataset import load_dataset_workload

        workload = load_dataset_workload(request.dataset, request.workload)
    cases = select_cases(workload, request.cases)
    device = pick_device(request.device)
    timer, warning = choose_timer(request.timer, device)
    settings = workload.settings.replace(
        seed=request.seed, input_sets=request.input_sets, warmup=request.warmup, iterations=request.iterations, trials=request.trials
    )
    if timer is not None and settings.input_sets < 2:
        raise DsaBenchError("timing needs --input-sets >= 2 so consecutive calls never see the same tensors")
    solutions = _solutions(request, workload, root, timer is not None)
    if request.speedup_over is not None and request.speedup_over not in {s.name for s in solutions}:
        raise DsaBenchError(
            f"--speedup-over {request.speedup_over!r} is not a solution of this run (it runs {', '.join(s.name for s in solutions)})"
        )
    default_save = root / "results" / f"{safe_file_name(workload.name)}-{now_iso().replace(':', '')}.json"
    save_path = None if request.no_save else (request.save or default_save)
    if save_path is not None:
        check_results_path(save_path, *run_inputs(workload, solutions, request.dataset))
    options = RunOptions(
        device=device,
        settings=settings,
        timer=timer,
        l2_flush=request.l2_flush,
        compile_timeout_s=request.compile_timeout,
        case_timeout_s=request.case_timeout,
        log_dir=root / ".cache" / "dsa-bench" / "logs",
        cache_dir=root / ".cache" / "dsa-bench",
        dataset_root=request.dataset,
        worker_user=request.worker_user,
        copy_bytes_per_s=measure_copy_bandwidth(device) if timer is not None else None,
        speedup_over=request.speedup_over,
    )
    identities = worker_identities(solutions, options, cases)
    return RunPlan(workload, cases, solutions, options, identities, save_path, root, [warning] if warning else [])


@dataclass
class RunOutcome:
    records: list[CaseRecord]
    results: ResultsFile
    sagged: list[str]
    stopped_by: int | None  # the signal that stopped the run, None when it finished


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP stop a run as Ctrl-C does: workers are ended, finished records kept."""

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def execute(plan: RunPlan, on_record: Callable[[CaseRecord], None] = lambda r: None) -> RunOutcome:
    """Run the plan; the results file is complete only when every case ran."""
    results = ResultsFile(plan.save_path, plan.header())
    stopped_by: int | None = None
    try:
        with _stopped_by_signals():
            records = run_workload(plan.workload, plan.cases, plan.solutions, plan.options, results, on_record, plan.identities)
    except KeyboardInterrupt as stop:
        stopped_by = stop.signum if isinstance(stop, Interrupted) else int(signal.SIGINT)
        records = [CaseRecord.from_json(r) for r in results.document["records"]]
    sag = sagged(records, results.document["environment"].get("max_sm_mhz"))
    results.update(complete=stopped_by is None, finished=now_iso(), clock_sagged=sag)
    return RunOutcome(records, results, sag, stopped_by)
