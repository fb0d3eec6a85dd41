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
import dataclasses
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
from dsa_bench.workloads import TOLERANCES, Case, Workload, setting_problem

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
    gpus: str | None = None  # a count, or "all"; None: 1, or every GPU of a Ray cluster
    executor: str = "local"  # EXECUTORS
    ray_address: str | None = None
    #: the dataset's own solutions (``solutions/**/*.json``) to run: their names, or "all"
    dataset_solutions: list[str] = field(default_factory=list)
    #: tolerances that replace the workload's for this run (None: the workload's)
    atol: float | None = None
    rtol: float | None = None
    lse_atol: float | None = None
    score_rtol: float | None = None

    def tolerance_overrides(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in TOLERANCES if getattr(self, key) is not None}


#: where a run's cases go: this process's devices, or a Ray cluster's GPUs
EXECUTORS = ("local", "ray")


@dataclass
class RunPlan:
    workload: Workload
    cases: list[Case]
    solutions: list[Solution]
    options: RunOptions  # the first device's (the only one's, on a one-device run)
    identities: dict[str, WorkerIdentity]
    save_path: Path | None
    root: Path
    warnings: list[str] = field(default_factory=list)
    #: one per device of a local multi-device run (``--gpus N``); the first is ``options``
    device_options: list[RunOptions] = field(default_factory=list)
    device_identities: list[dict[str, WorkerIdentity]] = field(default_factory=list)
    executor: str = "local"
    ray_address: str | None = None
    ray_gpus: int | None = None  # at most this many Ray actors (None: every GPU of the cluster)
    timer_request: str = "auto"  # what a Ray actor resolves on its own device

    @property
    def mode(self) -> str:
        if self.executor == "ray":
            return "on a Ray cluster (each actor picks its GPU's timer)"
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
        env = _device_environment(options)
        if len(self.device_options) > 1:
            env["gpus"] = [{"index": i, **_device_environment(o)} for i, o in enumerate(self.device_options)]
        return {
            "workload": workload,
            "settings": {**{k: v for k, v in asdict(settings).items() if k != "tolerance"}, "tolerance": asdict(settings.tolerance)},
            "timer": options.timer,
            "l2_flush": options.l2_flush if options.timer else None,
            "environment": env,
            "workers": {name: identity.description for name, identity in self.identities.items()}
            if self.executor == "local" else None,  # Ray actors report theirs under environment.gpus
            "solutions": {s.name: self._solution_header(s) for s in self.solutions},
        }

    def _solution_header(self, solution: Solution) -> dict[str, Any]:
        header = {"path": relative_to_root(solution.path, self.root), "content_hash": content_hash(solution.path)}
        if solution.packed_from is not None:  # the JSON it was run from; its folder is dsa-bench's cache
            header["packed"] = relative_to_root(solution.packed_from, self.root)
        return header


def _device_environment(options: RunOptions) -> dict[str, Any]:
    return environment(options.device) | ({"copy_gbps": options.copy_bytes_per_s / 1e9} if options.copy_bytes_per_s else {})


def gpu_count(value: str, executor: str) -> int | None:
    """``--gpus``: a count >= 1, or "all" (None: every device there is)."""
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise DsaBenchError(f"--gpus {value!r}: expected a count >= 1 or 'all'")
    if executor not in EXECUTORS:
        raise DsaBenchError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    return int(value)


def pick_devices(name: str, count: int | None) -> list[torch.device]:
    """The run's devices: ``--device`` alone, or the first ``count`` CUDA devices (all of them for
    None). Without CUDA, N devices are N parallel CPU workers of a correctness-only run."""
    if count == 1:
        return [pick_device(name)]
    if name not in ("auto", "cuda", "cpu"):
        raise DsaBenchError(f"--gpus takes the devices itself; --device {name!r} names one (use auto, cuda or cpu)")
    first = pick_device(name)
    if first.type == "cpu":
        return [first] * (count or 1)
    available = torch.cuda.device_count()
    if count is not None and count > available:
        raise DsaBenchError(f"--gpus {count}: this machine has {available} CUDA device(s)")
    return [torch.device("cuda", i) for i in range(count or available)]


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
    counts: dict[str, float | None] = {
        "--seed": request.seed,
        "--input-sets": request.input_sets,
        "--warmup": request.warmup,
        "--iterations": request.iterations,
        "--trials": request.trials,
    }
    counts.update({f"--{key.replace('_', '-')}": value for key, value in request.tolerance_overrides().items()})
    for option, value in counts.items():
        problem = None if value is None else setting_problem(option.removeprefix("--").replace("-", "_"), value)
        if problem is not None:
            raise DsaBenchError(f"{option} {value}: {problem}")
    if request.dataset_solutions and request.dataset is None:
        raise DsaBenchError("--dataset-solutions names solutions of a flashinfer-bench dataset; give the dataset with --dataset")
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


def _solutions(request: RunRequest, workload: Workload, root: Path, timing: bool) -> tuple[list[Solution], list[str]]:
    """The solutions to run, reference first, and warnings (dataset solutions dsa-bench cannot run)."""
    definition = workload.definition.name
    cache = root / ".cache" / "dsa-bench"
    reference = reference_solution(root)
    reference_folders = [root / "solutions" / REFERENCE_SOLUTION]
    warnings: list[str] = []
    if request.dataset is not None and (reference is None or definition not in reference.entries):
        from dsa_bench.dataset import reference_solution_folder

        # a dataset definition dsa-bench has no reference solution of: run the JSON's own reference
        reference = load_solution(reference_solution_folder(workload.definition, cache))
        reference_folders.append(reference.path)
    if request.solutions or request.dataset_solutions:
        chosen: list[Solution] = []
        for given in request.solutions:
            if request.dataset is not None and given == REFERENCE_SOLUTION and reference:
                chosen.append(reference)
            elif given.endswith(".json"):
                chosen.append(_packed_solution(Path(given), definition, cache))
            else:
                chosen.append(resolve_solution(given, root))
        for s in chosen:
            s.entry_for(definition)
        if request.dataset_solutions:
            assert request.dataset is not None  # check_request refuses --dataset-solutions without --dataset
            files, warnings = _dataset_solution_files(request.dataset, request.dataset_solutions, definition)
            chosen += [_packed_solution(path, definition, cache) for path in files]
    else:
        chosen = [s for s in discover(root / "solutions") if definition in s.entries]
    check_run_solutions(chosen, reference_folders)
    if timing and reference is None:
        raise DsaBenchError(f"timing needs the reference solution at {root / 'solutions' / REFERENCE_SOLUTION}")
    chosen = order_solutions(chosen, timing, reference)
    if not chosen:
        raise DsaBenchError(f"no solution implements {definition}")
    return chosen, warnings


def _packed_solution(path: Path, definition: str, cache: Path) -> Solution:
    """A packed Solution JSON (``-s FILE.json``, a dataset's solution), laid out and imported as
    flashinfer-bench does (:func:`dsa_bench.pack.flashinfer.materialize`)."""
    from dsa_bench.pack.document import read_solution_document
    from dsa_bench.pack.flashinfer import materialize

    if not path.is_file():
        raise DsaBenchError("packed solution file does not exist", str(path))
    packed_for = read_solution_document(path)["definition"]
    if packed_for != definition:
        raise DsaBenchError(f"this packed solution implements {packed_for!r}, but the workload runs {definition!r}", str(path))
    return materialize(path, cache)


def _dataset_solution_files(dataset: Path, wanted: list[str], definition: str) -> tuple[list[Path], list[str]]:
    """The dataset's solution JSONs for ``definition`` that ``--dataset-solutions`` names (``all``:
    every one dsa-bench can run; the others are named in the warnings)."""
    from dsa_bench.dataset import dataset_solution_files
    from dsa_bench.files import read_json
    from dsa_bench.pack.document import check_solution_document
    from dsa_bench.pack.pack import runnable_problem

    by_name: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in dataset_solution_files(dataset):
        document = read_json(path, "packed solution")
        name = document.get("name") if isinstance(document, dict) else None
        if isinstance(name, str) and name in by_name:
            raise DsaBenchError(f"solution name {name!r} is also used by {by_name[name][0]}", str(path))
        if isinstance(document, dict) and document.get("definition") == definition:
            check_solution_document(document, str(path))  # the others are another run's business
        if isinstance(name, str):
            by_name[name] = (path, document)
    mine = {name: item for name, item in by_name.items() if item[1].get("definition") == definition}
    if "all" in wanted:
        if len(wanted) > 1:
            raise DsaBenchError("--dataset-solutions all runs every dataset solution; give it alone, or give names")
        chosen, warnings = [], []
        for name, (path, document) in sorted(mine.items()):
            problem = runnable_problem(document)
            if problem is None:
                chosen.append(path)
            else:
                warnings.append(f"dataset solution {name!r} ({path}) is not run: {problem}")
        if not chosen:
            raise DsaBenchError(f"the dataset holds no solution of {definition} that dsa-bench can run", str(dataset / "solutions"))
        return chosen, warnings
    files = []
    for name in wanted:
        if name not in mine:
            known = ", ".join(sorted(mine)) or "(none)"
            other = f" (it implements {by_name[name][1].get('definition')!r})" if name in by_name else ""
            problem = f"--dataset-solutions {name}: no dataset solution of {definition} has this name{other}; its solutions: {known}"
            raise DsaBenchError(problem)
        path, document = mine[name]
        problem = runnable_problem(document)
        if problem is not None:
            raise DsaBenchError(problem, str(path))
        files.append(path)
    return files, []


def run_inputs(workload: Workload, solutions: list[Solution], dataset: Path | None) -> tuple[list[Path], list[Path]]:
    """The files and folders a run reads, which its results file must not overwrite or enter."""
    files = [p for p in (workload.path, workload.trace_path) if p is not None]
    files += [source.path for case in workload.cases for source in case.inputs.values() if source.path is not None]
    files += [s.packed_from for s in solutions if s.packed_from is not None]
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
    gpus = gpu_count(request.gpus or ("all" if request.executor == "ray" else "1"), request.executor)
    on_ray = request.executor == "ray"
    if on_ray:
        from dsa_bench.run.ray_executor import ray_module

        ray_module()  # a clear error now when Ray is missing
    elif request.ray_address is not None:
        raise DsaBenchError("--ray-address needs --executor ray")
    devices = [pick_device("cpu")] if on_ray else pick_devices(request.device, gpus)
    device = devices[0]
    timer, warning = (None, None) if on_ray else choose_timer(request.timer, device)
    device = pick_device(request.device)
    timer, warning = choose_timer(request.timer, device)
    tolerance = dataclasses.replace(workload.settings.tolerance, **request.tolerance_overrides())
    settings = workload.settings.replace(
        seed=request.seed, input_sets=request.input_sets, warmup=request.warmup, iterations=request.iterations, trials=request.trials,
        tolerance=tolerance,
    )  # fmt: skip
    if timer is not None and settings.input_sets < 2:
        raise DsaBenchError("timing needs --input-sets >= 2 so consecutive calls never see the same tensors")
    solutions, warnings = _solutions(request, workload, root, timer is not None or on_ray)
    if warning:
        warnings.insert(0, warning)
    changed = [f"{k} {v:g} (the workload's: {getattr(workload.settings.tolerance, k):g})" for k, v in request.tolerance_overrides().items()]
    if changed:
        warnings.append(f"tolerances set on the command line judge cases differently from the workload's settings: {', '.join(changed)}")
    default_save = root / "results" / f"{safe_file_name(workload.name)}-{now_iso().replace(':', '')}.json"
    save_path = None if request.no_save else (request.save or default_save)
    if save_path is not None:
        check_results_path(save_path, *run_inputs(workload, solutions, request.dataset))
    template = RunOptions(
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
    )
    device_options = [
        dataclasses.replace(template, device=d, copy_bytes_per_s=measure_copy_bandwidth(d) if timer is not None else None)
        for d in devices
    ]
    device_identities = [worker_identities(solutions, o, cases, first_slot=i * len(solutions)) for i, o in enumerate(device_options)]
    return RunPlan(
        workload, cases, solutions, device_options[0], device_identities[0], save_path, root, warnings,
        device_options=device_options, device_identities=device_identities, executor=request.executor,
        ray_address=request.ray_address, ray_gpus=gpus, timer_request=request.timer,
    )  # fmt: skip


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
            records = _run(plan, results, on_record)
    except KeyboardInterrupt as stop:
        stopped_by = stop.signum if isinstance(stop, Interrupted) else int(signal.SIGINT)
        records = [CaseRecord.from_json(r) for r in results.document["records"]]
    sag = _sagged(records, results.document["environment"])
    results.update(complete=stopped_by is None, finished=now_iso(), clock_sagged=sag)
    return RunOutcome(records, results, sag, stopped_by)


def _run(plan: RunPlan, results: ResultsFile, on_record: Callable[[CaseRecord], None]) -> list[CaseRecord]:
    if plan.executor == "ray":
        from dsa_bench.run.ray_executor import run_on_ray

        def record_actors(descriptions: list[dict[str, Any]]) -> None:
            timers = {d["timer"] for d in descriptions}
            results.update(
                environment={**results.document["environment"], "gpus": [{"index": i, **d} for i, d in enumerate(descriptions)]},
                timer=timers.pop() if len(timers) == 1 else "mixed",
                l2_flush=plan.options.l2_flush if any(d["timer"] for d in descriptions) else None,
            )

        return run_on_ray(
            plan.workload, plan.cases, plan.solutions, plan.options, plan.timer_request, plan.root, results, on_record,
            address=plan.ray_address, max_actors=plan.ray_gpus, on_start=record_actors,
        )  # fmt: skip
    if len(plan.device_options) > 1:
        from dsa_bench.run.executor import run_on_devices

        return run_on_devices(
            plan.workload, plan.cases, plan.solutions, plan.device_options, plan.device_identities, results, on_record
        )
    return run_workload(plan.workload, plan.cases, plan.solutions, plan.options, results, on_record, plan.identities)


def _sagged(records: list[CaseRecord], env: dict[str, Any]) -> list[str]:
    """Records timed below 90 % of their own device's maximum SM clock."""
    devices = env.get("gpus")
    if not devices:
        return sagged(records, env.get("max_sm_mhz"))
    return [line for i, d in enumerate(devices) for line in sagged([r for r in records if r.gpu == i], d.get("max_sm_mhz"))]
