"""Planning a run from what the command line asked for (a :class:`~dsa_bench.run.request.RunRequest`).

:func:`plan_run` resolves and checks everything before the first case: the workload (a project
workload or a flashinfer-bench dataset's), the cases, the device and timer, the settings with the
command line's overrides, the solutions (the reference first, names unique, ``reference``
reserved), the results path (never an input or a file of another kind), whom each worker runs
as, and with ``--resume`` the interrupted run it continues (:mod:`dsa_bench.run.resume`).
:func:`dsa_bench.run.execute.execute` carries the plan out.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from dsa_bench.errors import DsaBenchError, did_you_mean
from dsa_bench.paths import safe_file_name
from dsa_bench.project import check_run_solutions, reference_solution, relative_to_root, resolve_solution, resolve_workload
from dsa_bench.results.environment import environment
from dsa_bench.results.records import (
    Environment,
    RecordedSettings,
    RecordedTolerance,
    ResultsHeader,
    SolutionHeader,
    WorkloadHeader,
    check_results_path,
    launch_mode,
    now_iso,
    redacted_path,
)
from dsa_bench.run.isolation import WorkerIdentity
from dsa_bench.run.request import RunRequest, recorded_options
from dsa_bench.run.resume import Resumed, resume_state, secret_seed
from dsa_bench.run.runner import RunOptions, order_solutions, worker_identities
from dsa_bench.solution import REFERENCE_SOLUTION, Solution, content_hash, discover, load_solution
from dsa_bench.timing import choose_timer
from dsa_bench.timing.flush import measure_copy_bandwidth
from dsa_bench.workloads import Case, Workload


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
    ray_cpu: bool = False  # --device cpu: CPU actors (no GPU needed), correctness only
    timer_request: str = "auto"  # what a Ray actor resolves on its own device
    planning_s: float = 0.0  # wall time spent planning, counted in the run's wall-time breakdown
    resumed: Resumed | None = None
    redacted_path: Path | None = None  # where the redacted copy goes (run --redact)
    recorded: dict[str, Any] = field(default_factory=dict)  # the request's options the header records (run.request.Recorded)

    @property
    def secret(self) -> bool:
        return self.options.settings.secret

    @property
    def pending_cases(self) -> list[Case]:
        """The cases this run executes: all of them, less those a resumed run already finished."""
        finished = self.resumed.finished if self.resumed else frozenset()
        return [c for c in self.cases if c.id not in finished]

    @property
    def mode(self) -> str:
        if self.executor == "ray" and self.ray_cpu:
            return "correctness only (--device cpu: nothing is timed)"
        if self.executor == "ray":
            return "on a Ray cluster (each actor picks its GPU's timer)"
        if self.options.timer is None:
            return "correctness only (no CUDA device: nothing is timed)"
        launch = ", CUDA-graph replay" if self.options.cuda_graph else ""
        return f"timing with {self.options.timer}, {self.options.l2_flush} L2 flush{launch}"

    def header(self) -> ResultsHeader:
        """The results document's header; paths are relative to the project root where they lie in it."""
        wl, settings, options = self.workload, self.options.settings, self.options
        workload: dict[str, Any] = {
            "name": wl.name,
            "path": relative_to_root(wl.path, self.root),
            "trace": relative_to_root(wl.trace_path, self.root),
            "definition": wl.definition.name,
            "cases_sha256": cases_digest(wl.cases, self.root),
        }
        if options.dataset_root is not None:
            workload["dataset"] = relative_to_root(options.dataset_root, self.root)
        env = _device_environment(options)
        if len(self.device_options) > 1:
            env["gpus"] = [Environment.model_construct(index=i, **_device_environment(o)) for i, o in enumerate(self.device_options)]
        # why not CUPTI: never silent (absent when CUPTI timed)
        optional: dict[str, Any] = {"timer_fallback": options.timer_fallback} if options.timer_fallback else {}
        return ResultsHeader.new(
            workload=WorkloadHeader.model_construct(**workload),
            settings=RecordedSettings.model_construct(
                **{k: v for k, v in asdict(settings).items() if k not in ("tolerance", "secret")},
                tolerance=RecordedTolerance.model_construct(**asdict(settings.tolerance)),
            ),
            timer=options.timer,
            **optional,
            l2_flush=options.l2_flush if options.timer else None,
            # every flush first resets the persisting-L2 carve-out (timing.flush.PersistingL2Reset)
            l2_persisting_reset=True if options.timer else None,
            launch=launch_mode(options.cuda_graph) if options.timer else None,
            environment=Environment.model_construct(**env),
            workers={name: identity.description for name, identity in self.identities.items()}
            if self.executor == "local" else None,  # Ray actors report theirs under environment.gpus
            solutions={s.name: self._solution_header(s) for s in self.solutions},
            cases=[c.id for c in self.cases],
            peers=[s.name for s in self.solutions if s.requires.any],
            **self.recorded,  # the options recorded as given (run.request.Recorded)
            **({"secret": True} if settings.secret else {}),
        )  # fmt: skip

    def _solution_header(self, solution: Solution) -> SolutionHeader:
        header: dict[str, Any] = {"path": relative_to_root(solution.path, self.root), "content_hash": content_hash(solution.path)}
        if solution.packed_from is not None:  # the JSON it was run from; its folder is dsa-bench's cache
            header["packed"] = relative_to_root(solution.packed_from, self.root)
        return SolutionHeader.model_construct(**header)


def _device_environment(options: RunOptions) -> dict[str, Any]:
    return environment(options.device) | ({"copy_gbps": options.copy_bytes_per_s / 1e9} if options.copy_bytes_per_s else {})


def gpu_count(value: str) -> int | None:
    """``--gpus``: a count >= 1, or "all" (None: every device there is)."""
    if value == "all":
        return None
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise DsaBenchError(f"--gpus {value!r}: expected a count >= 1 or 'all'")
    if len(value) > 6:  # more than any machine or cluster has; checked against the devices present later
        raise DsaBenchError(f"--gpus {value[:12]}{'...' if len(value) > 12 else ''}: expected at most 999999 devices")
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
        cores = os.cpu_count() or 1
        if count is not None and count > cores:
            raise DsaBenchError(f"--gpus {count}: there is no CUDA device here, and without one --gpus N runs N correctness-only "
                                f"workers side by side, at most one per CPU core ({cores})")  # fmt: skip
        return [first] * (count or 1)
    available = torch.cuda.device_count()
    if count is not None and count > available:
        raise DsaBenchError(f"--gpus {count}: this machine has {available} CUDA device(s)")
    return [torch.device("cuda", i) for i in range(count or available)]


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


def select_cases(workload: Workload, patterns: list[str]) -> list[Case]:
    if not patterns:
        return list(workload.cases)
    chosen = [c for c in workload.cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    if not chosen:
        hint = did_you_mean(patterns[0], [c.id for c in workload.cases]) if len(patterns) == 1 else ""
        raise DsaBenchError(f"no case of workload {workload.name!r} matches {', '.join(patterns)}{hint}")
    return chosen


def _solutions(request: RunRequest, workload: Workload, root: Path, timing: bool) -> tuple[list[Solution], list[str]]:
    """The solutions to run, reference first, and warnings (dataset solutions dsa-bench cannot run)."""
    definition = workload.definition.name
    cache = root / ".cache" / "dsa-bench"
    reference = reference_solution(root)
    reference_folders = [root / "solutions" / REFERENCE_SOLUTION]
    warnings: list[str] = []
    if request.dataset is not None and (reference is None or definition not in reference.entries):
        from dsa_bench.flashinfer_bench.dataset import reference_solution_folder

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
    flashinfer-bench does (:func:`dsa_bench.flashinfer_bench.packed.materialize`)."""
    from dsa_bench.flashinfer_bench.packed import materialize
    from dsa_bench.pack.document import read_solution_document

    if not path.is_file():
        raise DsaBenchError("packed solution file does not exist", str(path))
    packed_for = read_solution_document(path)["definition"]
    if packed_for != definition:
        raise DsaBenchError(f"this packed solution implements {packed_for!r}, but the workload runs {definition!r}", str(path))
    return materialize(path, cache)


def _dataset_solution_files(dataset: Path, wanted: list[str], definition: str) -> tuple[list[Path], list[str]]:
    """The dataset's solution JSONs for ``definition`` that ``--dataset-solutions`` names (``all``:
    every one dsa-bench can run; the others are named in the warnings)."""
    from dsa_bench.files import read_json
    from dsa_bench.flashinfer_bench.dataset import dataset_solution_files
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
    started = time.perf_counter()  # the request's own options were checked when it was made
    if request.dataset is None:
        workload = resolve_workload(request.workload, root)
    else:
        from dsa_bench.flashinfer_bench.dataset import load_dataset_workload

        workload = load_dataset_workload(request.dataset, request.workload)
    cases = select_cases(workload, request.cases)
    gpus = gpu_count(request.gpus or ("all" if request.executor == "ray" else "1"))
    on_ray = request.executor == "ray"
    if on_ray:
        from dsa_bench.run.ray_executor import ray_module

        ray_module()  # a clear error now when Ray is missing
    elif request.ray_address is not None:
        raise DsaBenchError("--ray-address needs --executor ray")
    devices = [pick_device("cpu")] if on_ray else pick_devices(request.device, gpus)
    device = devices[0]
    timer, warning = (None, None) if on_ray else choose_timer(request.timer, device)
    if request.cuda_graph and (timer is None and not on_ray or on_ray and request.device == "cpu"):
        raise DsaBenchError(f"--cuda-graph needs a CUDA device: it times CUDA-graph replays, and this run on {device} times nothing")
    tolerance = dataclasses.replace(workload.settings.tolerance, **request.tolerance_overrides())
    settings = workload.settings.replace(
        seed=request.seed, input_sets=request.input_sets, warmup=request.warmup, iterations=request.iterations, trials=request.trials,
        tolerance=tolerance, reference_protocol=request.reference_protocol,
    )  # fmt: skip
    if request.secret or settings.secret:
        if request.seed is not None:
            raise DsaBenchError(f"workload {workload.name!r} is secret (settings.secret): its seed is drawn at run time; leave out --seed")
        settings = dataclasses.replace(settings, seed=secret_seed(request.resume), secret=True)
    if timer is not None and settings.input_sets < 2:
        raise DsaBenchError("timing needs --input-sets >= 2 so consecutive calls never see the same tensors")
    solutions, warnings = _solutions(request, workload, root, timer is not None or on_ray)
    if warning:
        warnings.insert(0, warning)
    if request.speedup_over is not None and request.speedup_over not in {s.name for s in solutions}:
        raise DsaBenchError(
            f"--speedup-over {request.speedup_over!r} is not a solution of this run (it runs {', '.join(s.name for s in solutions)})"
        )

    def shown(value: float | None) -> str:
        return "derived" if value is None else f"{value:g}"  # score_rtol None: the definition's own per-row bound

    overrides = request.tolerance_overrides().items()
    changed = [f"{k} {v:g} (the workload's: {shown(getattr(workload.settings.tolerance, k))})" for k, v in overrides]
    if changed:
        warnings.append(f"tolerances set on the command line judge cases differently from the workload's settings: {', '.join(changed)}")
    default_save = root / "results" / f"{safe_file_name(workload.name)}-{now_iso().replace(':', '')}.json"
    save_path = None if request.no_save else (request.resume or request.save or default_save)
    if save_path is not None:
        check_results_path(save_path, *run_inputs(workload, solutions, request.dataset))
    resolved: dict[str, Any] = dict(
        device=device,
        settings=settings,
        timer=timer,
        compile_timeout_s=request.compile_timeout,
        case_timeout_s=request.case_timeout,
        log_dir=root / ".cache" / "dsa-bench" / "logs",
        cache_dir=root / ".cache" / "dsa-bench",
        dataset_root=request.dataset,
        timer_fallback=warning,  # choose_timer warns only when 'auto' fell back from CUPTI
    )
    # the other options the case loop reads reach it as given: RunOptions fields named as the request's (l2_flush, worker_user, ...)
    handed_on = {f.name: getattr(request, f.name) for f in dataclasses.fields(RunOptions) if f.name in RunRequest.model_fields}
    template = RunOptions(**{**handed_on, **resolved})
    device_options = [
        dataclasses.replace(template, device=d, copy_bytes_per_s=measure_copy_bandwidth(d) if timer is not None else None)
        for d in devices
    ]
    device_identities = [worker_identities(solutions, o, cases, first_slot=i * len(solutions)) for i, o in enumerate(device_options)]
    plan = RunPlan(
        workload, cases, solutions, device_options[0], device_identities[0], save_path, root, warnings,
        device_options=device_options, device_identities=device_identities, executor=request.executor,
        ray_address=request.ray_address, ray_gpus=gpus, ray_cpu=on_ray and request.device == "cpu", timer_request=request.timer,
        recorded=recorded_options(request),
    )  # fmt: skip
    if request.resume is not None:
        plan.resumed = resume_state(request.resume, plan.header())
    if request.redact and save_path is not None:
        plan.redacted_path = redacted_path(save_path)
        check_results_path(plan.redacted_path, *run_inputs(workload, solutions, request.dataset))
    plan.planning_s = time.perf_counter() - started
    return plan


