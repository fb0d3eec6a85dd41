"""Planning a run from what the command line asked for, and carrying it out.

:func:`plan_run` resolves and checks everything before the first case: the workload (a project
workload or a flashinfer-bench dataset's), the cases, the device and timer, the settings with the
command line's overrides, the solutions (the reference first, names unique, ``reference``
reserved), the results path (never an input or a file of another kind), and whom each worker
runs as. :func:`execute` runs the plan, writing records as they finish, and turns Ctrl-C, SIGTERM
and SIGHUP into an orderly stop.

With ``--resume RESULTS.json`` the plan is checked against the interrupted run's results file
(the workload and its cases' content, the case selection, settings, timer, L2 flush, GPU, the
solutions and their content hashes: :func:`resume_problem`), only the cases it left unfinished
are run, and the union is written back to that file (docs/running.md).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dsa_bench.errors import DsaBenchError
from dsa_bench.paths import safe_file_name
from dsa_bench.project import check_run_solutions, reference_solution, relative_to_root, resolve_solution, resolve_workload
from dsa_bench.results.environment import environment
from dsa_bench.results.records import CaseRecord, ResultsFile, check_results_path, load_results, now_iso
from dsa_bench.results.tables import sagged
from dsa_bench.run.breakdown import PhaseClock
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
    resume: Path | None = None  # an interrupted run's results file, completed in place


@dataclass(frozen=True)
class Resumed:
    """What an interrupted run left: its results document, and the cases it finished (every
    solution of the run has a record there); the other cases are run from their start."""

    document: dict[str, Any]
    finished: frozenset[str]
    sitting_header: dict[str, Any]  # the header this sitting would write (its environment and workers are noted)

    @property
    def superseded(self) -> set[str]:
        """Unfinished cases that have records: replaced when the case runs again."""
        return {r["case"] for r in self.document["records"]} - self.finished

    def header(self) -> dict[str, Any]:
        """The interrupted run's header, with this sitting noted under ``resumed``."""
        kept = {k: v for k, v in self.document.items() if k not in ("records", "complete", "finished", "clock_sagged")}
        sitting = {"started": now_iso(), "records_kept": sum(r["case"] in self.finished for r in self.document["records"]),
                   "environment": self.sitting_header["environment"], "workers": self.sitting_header["workers"]}  # fmt: skip
        return {**kept, "resumed": [*self.document.get("resumed", []), sitting]}


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
    planning_s: float = 0.0  # wall time spent planning, counted in the run's wall-time breakdown
    resumed: Resumed | None = None

    @property
    def pending_cases(self) -> list[Case]:
        """The cases this run executes: all of them, less those a resumed run already finished."""
        finished = self.resumed.finished if self.resumed else frozenset()
        return [c for c in self.cases if c.id not in finished]

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
            "cases_sha256": cases_digest(wl.cases, self.root),
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
            "cases": [c.id for c in self.cases],
        }


def cases_digest(cases: tuple[Case, ...], root: Path) -> str:
    """sha256 of a workload's cases as the run reads them: ids, axes and input sources (a
    safetensors source by its path and size, not its bytes). A resumed run must find the same."""
    digest = hashlib.sha256()
    for case in cases:
        inputs = {
            name: {"kind": src.kind, "params": dict(src.params), "values": src.values, "value": src.value, "tensor_key": src.tensor_key,
                   "path": relative_to_root(src.path, root), "bytes": src.path.stat().st_size if src.path else None}
            for name, src in case.inputs.items()
        }  # fmt: skip
        line = json.dumps({"id": case.id, "axes": dict(case.axes), "inputs": inputs}, sort_keys=True, default=str)
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


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
    started = time.perf_counter()
    check_request(request)
    if request.resume is not None and (request.save is not None or request.no_save):
        raise DsaBenchError("--resume writes the completed run back to its results file; leave out --save and --no-save")
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
    default_save = root / "results" / f"{safe_file_name(workload.name)}-{now_iso().replace(':', '')}.json"
    save_path = None if request.no_save else (request.resume or request.save or default_save)
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
    )
    identities = worker_identities(solutions, options, cases)
    plan = RunPlan(workload, cases, solutions, options, identities, save_path, root, [warning] if warning else [])
    if request.resume is not None:
        plan.resumed = resume_state(request.resume, plan)
    plan.planning_s = time.perf_counter() - started
    return plan


def _first_difference(theirs: Any, ours: Any, name: str) -> tuple[str, Any, Any] | None:
    """The first field (dotted name) in which two header values differ, with both values."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            found = _first_difference(theirs.get(key), ours.get(key), f"{name}.{key}")
            if found is not None:
                return found
        return None
    return None if theirs == ours else (name, theirs, ours)


def resume_problem(previous: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why the run described by header ``now`` cannot continue the one whose results document is
    ``previous``, or None: the first field that differs, with both values."""
    if not (previous.get("workload") or {}).get("cases_sha256"):
        return "it records no workload.cases_sha256 (it was written before dsa-bench could resume runs); start a new run"
    theirs_solutions, our_solutions = previous.get("solutions") or {}, now["solutions"]
    if set(theirs_solutions) != set(our_solutions):
        return (f"the solutions differ: {', '.join(sorted(theirs_solutions)) or '(none)'} there, {', '.join(sorted(our_solutions))} "
                f"in this run; give the same --solution options")  # fmt: skip
    for name, info in our_solutions.items():
        if theirs_solutions[name].get("content_hash") != info["content_hash"]:
            return (f"solution {name!r} has changed since: content hash {theirs_solutions[name].get('content_hash')} there, "
                    f"{info['content_hash']} now ({info['path']}); start a new run")  # fmt: skip
    workload_fields = ("name", "definition", "cases_sha256", "dataset")
    checked = [
        ("workload", {k: previous["workload"].get(k) for k in workload_fields}, {k: now["workload"].get(k) for k in workload_fields}),
        ("settings", previous.get("settings"), now["settings"]),
        ("timer", previous.get("timer"), now["timer"]),
        ("l2_flush", previous.get("l2_flush"), now["l2_flush"]),
        ("environment.gpu", (previous.get("environment") or {}).get("gpu"), now["environment"].get("gpu")),
    ]
    for name, theirs, ours in checked:
        found = _first_difference(theirs, ours, name)
        if found is not None:
            field_name, a, b = found
            return f"{field_name} is {a!r} there and {b!r} in this run; give the interrupted run's options"
    theirs_cases, our_cases = previous.get("cases") or [], now["cases"]
    if set(theirs_cases) != set(our_cases):
        differ = sorted(set(theirs_cases) ^ set(our_cases))
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        return (f"the case selection differs: {len(theirs_cases)} cases there, {len(our_cases)} in this run (in one only: {shown}); "
                f"give the same --case patterns")  # fmt: skip
    return None


def resume_state(path: Path, plan: RunPlan) -> Resumed:
    """The interrupted run at ``path``, checked against ``plan``: a refusal names the first difference."""
    previous = load_results(path).document
    now = plan.header()
    problem = resume_problem(previous, now)
    if problem is not None:
        raise DsaBenchError(f"cannot resume this run: {problem}", str(path))
    names = {s.name for s in plan.solutions}
    done: dict[str, set[str]] = {}
    for record in previous["records"]:
        done.setdefault(record["case"], set()).add(record["solution"])
    return Resumed(previous, frozenset(case for case, solutions in done.items() if names <= solutions), now)


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
    """Run the plan; the results file is complete only when every case ran. The outcome's records
    are the whole file's (a resumed run's earlier records too)."""
    resumed = plan.resumed
    clock = PhaseClock(plan.planning_s, resumed.document.get("wall_breakdown") if resumed else None)
    with clock.phase("planning"):  # the header: environment, solutions' content hashes
        header = plan.header() if resumed is None else resumed.header()
    kept, superseded = (resumed.document["records"], resumed.superseded) if resumed else ([], set())
    with clock.phase("results_writes"):
        results = ResultsFile(plan.save_path, header, kept, superseded)
    stopped_by: int | None = None
    try:
        with _stopped_by_signals():
            run_workload(plan.workload, plan.pending_cases, plan.solutions, plan.options, results, on_record, plan.identities, clock)
    except KeyboardInterrupt as stop:
        stopped_by = stop.signum if isinstance(stop, Interrupted) else int(signal.SIGINT)
    records = [CaseRecord.from_json(r) for r in results.document["records"]]
    sag = sagged(records, results.document["environment"].get("max_sm_mhz"))
    results.update(complete=stopped_by is None, finished=now_iso(), clock_sagged=sag, wall_breakdown=clock.breakdown())
    return RunOutcome(records, results, sag, stopped_by)
