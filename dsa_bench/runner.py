"""Running a workload: per case, per solution, check and (on a GPU) time, in isolated workers.

For each case the harness builds the same input sets the workers build (same seeds), computes
what the checker needs from the reference once, and hands each solution's outputs to the
definition's checker. The reference solution runs first on every case when timing, so each
solution's speedup is measured against a reference timed in the same run.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from dsa_bench import worker as worker_mod
from dsa_bench.checking import judge, worst
from dsa_bench.definitions.base import CheckResult, Status, Tolerance
from dsa_bench.results import CaseRecord, ResultsFile, Timing
from dsa_bench.solutions import Solution
from dsa_bench.workloads import Case, RunSettings, Workload, build_inputs, derive_seed

REFERENCE_SOLUTION = "reference"


@dataclass(frozen=True)
class RunOptions:
    device: torch.device
    settings: RunSettings
    timer: str | None  # "cupti" | "events" on a GPU; None: correctness only
    l2_flush: str  # timing.L2_FLUSH_MODES
    compile_timeout_s: float = 900.0
    case_timeout_s: float = 600.0
    log_dir: Path = Path(".cache/dsa-bench/logs")
    extensions_dir: Path = Path(".cache/dsa-bench/torch_extensions")
    dataset_root: Path | None = None  # set when the workload comes from a flashinfer-bench dataset


class WorkerFailure(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class WorkerHandle:
    """A solution's worker process, restarted after anything that may have damaged it."""

    def __init__(self, solution: Solution, definition: str, options: RunOptions) -> None:
        self.solution = solution
        self.options = options
        options.log_dir.mkdir(parents=True, exist_ok=True)
        self.config = worker_mod.WorkerConfig(
            solution_path=str(solution.path),
            definition=definition,
            device=str(options.device),
            timer=options.timer,
            l2_flush=options.l2_flush,
            log_path=str((options.log_dir / f"{solution.name}.log").resolve()),
            extensions_dir=str(options.extensions_dir.resolve()),
            dataset_root=str(options.dataset_root.resolve()) if options.dataset_root else None,
        )
        self.process: Any = None
        self.conn: Any = None
        self.notes = ""
        self.compile_failure: WorkerFailure | None = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = Path(self.config.log_path).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def ensure_started(self) -> None:
        """Start the worker and wait for its import/build; a failure is remembered for every case."""
        if self.compile_failure is not None:
            raise self.compile_failure
        if self.process is not None and self.process.is_alive():
            return
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_mod.main, args=(child, self.config), daemon=True)
        self.process.start()
        child.close()
        try:
            kind, payload = self._receive(self.options.compile_timeout_s, "importing/building the solution")
        except WorkerFailure as failure:
            if failure.status is Status.RUNTIME_ERROR:  # died while importing: a build problem
                failure = WorkerFailure(Status.COMPILE_ERROR, failure.message)
            self.compile_failure = failure
            raise failure
        if kind == "compile_error":
            self.compile_failure = WorkerFailure(Status.COMPILE_ERROR, _last_lines(payload))
            self.stop()
            raise self.compile_failure
        self.notes = payload

    def request(self, message: tuple, what: str) -> Any:
        self.ensure_started()
        self.conn.send(message)
        kind, payload, self.notes = self._receive(self.options.case_timeout_s, what)
        if kind == "error":
            self.stop()  # the solution raised; its process state is suspect (CUDA faults are sticky)
            raise WorkerFailure(Status.RUNTIME_ERROR, _last_lines(payload))
        return payload

    def _receive(self, timeout: float, what: str) -> tuple[Any, ...]:
        if not self.conn.poll(timeout):
            self.kill()
            raise WorkerFailure(Status.TIMEOUT, f"no answer within {timeout:g} s while {what}; worker killed")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            code = self.process.exitcode
            tail = self.log_tail()
            self.kill()
            detail = f"\n{tail}" if tail else ""
            raise WorkerFailure(Status.RUNTIME_ERROR, f"worker process died (exit code {code}) while {what}{detail}") from None

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            if self.process.is_alive():
                self.conn.send(("stop",))
                self.process.join(5)
        except (OSError, BrokenPipeError):
            pass
        self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.process = None


def _last_lines(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class _CaseContext:
    """The harness's own copies of a case's input sets and what the checker needs for each."""

    workload: Workload
    case: Case
    device: torch.device
    tolerance: Tolerance
    _cache: dict[int, tuple[Any, Any]] = field(default_factory=dict)

    def get(self, seed: int) -> tuple[Any, Any]:
        if seed not in self._cache:
            inputs = build_inputs(self.workload.definition, self.case, seed, self.device)
            self._cache[seed] = (inputs, self.workload.definition.expect(inputs))
        return self._cache[seed]

    def check(self, seed: int, outputs: dict[str, Any], redrawn: dict[str, Any] | None = None) -> CheckResult:
        """Judge outputs made from input set ``seed``, with ``redrawn`` query values when a timed
        call replaced them (then the expectation is computed afresh)."""
        inputs, expected = self.get(seed)
        definition = self.workload.definition
        if redrawn:
            inputs = {**inputs, **{k: v.to(self.device) for k, v in redrawn.items()}}
            expected = definition.expect(inputs)
        axes = definition.axes(self.case.axes)
        return judge(definition, axes, inputs, outputs, expected, self.tolerance, self.device)


def correctness_seeds(settings: RunSettings, case: Case) -> tuple[int, ...]:
    return tuple(derive_seed(settings.seed, case.id, "check", s) for s in range(settings.input_sets))


def trial_seeds(settings: RunSettings, case: Case) -> tuple[tuple[int, ...], ...]:
    # Trial 0 reuses the correctness sets; later trials get fresh ones.
    first = correctness_seeds(settings, case)
    later = tuple(
        tuple(derive_seed(settings.seed, case.id, "trial", t, s) for s in range(settings.input_sets))
        for t in range(1, settings.trials)
    )
    return (first, *later)


def run_one(handle: WorkerHandle, ctx: _CaseContext, options: RunOptions) -> CaseRecord:
    """One solution on one case: correctness on every input set, then (GPU) timing."""
    settings = options.settings  # the run's settings: the workload's, with the command line's overrides
    case = ctx.case
    seeds = correctness_seeds(settings, case)
    record = CaseRecord(case=case.id, solution=handle.solution.name, axes=dict(case.axes), status=Status.PASSED, seeds={"correctness": list(seeds)})
    started = time.perf_counter()
    try:
        outputs = handle.request(("outputs", worker_mod.CorrectnessJob(case, seeds)), f"running case {case.id}")
        checks_start = time.perf_counter()
        record.phases_s["correctness_calls"] = checks_start - started
        result = worst([ctx.check(seed, out) for seed, out in zip(seeds, outputs)])
        record.phases_s["checks"] = time.perf_counter() - checks_start
        if result.passed and options.timer is not None:
            job = worker_mod.TimingJob(case, trial_seeds(settings, case), settings.warmup, settings.iterations, derive_seed(settings.seed, case.id, "sample"))
            timing = handle.request(("time", job), f"timing case {case.id}")
            record.seeds["trials"] = [list(s) for s in job.trial_seeds]
            record.seeds["checked_calls"] = [{"trial": c.trial, "iteration": c.iteration, "seed": c.seed} for c in timing.checked]
            for call in timing.checked:  # outputs of timed calls are checked too, not only the first call
                checked = ctx.check(call.seed, call.outputs, call.redrawn_inputs)
                if not checked.passed:
                    message = f"timed call {call.iteration} of trial {call.trial} returned wrong outputs: {checked.message}"
                    result = CheckResult(checked.status, message, checked.max_abs_error, checked.max_rel_error)
                    break
            record.timing = Timing(timer=timing.timer, samples_ms=timing.samples_ms, clocks=timing.clocks)
            record.phases_s.update({f"timing_{k}": v for k, v in timing.phase_s.items()})
        record.status, record.message = result.status, result.message
        record.max_abs_error, record.max_rel_error = result.max_abs_error, result.max_rel_error
    except WorkerFailure as failure:
        record.status, record.message = failure.status, failure.message
    if not record.passed:
        record.timing = None
    record.wall_s = time.perf_counter() - started
    return record


def order_solutions(solutions: list[Solution], timing: bool, reference: Solution | None) -> list[Solution]:
    """Reference first; when timing, the reference is always included for the speedup column."""
    chosen = [s for s in solutions if s.name != REFERENCE_SOLUTION]
    has_reference = any(s.name == REFERENCE_SOLUTION for s in solutions)
    if (timing or has_reference) and reference is not None:
        chosen.insert(0, reference)
    return chosen


def run_workload(
    workload: Workload,
    cases: list[Case],
    solutions: list[Solution],
    options: RunOptions,
    results: ResultsFile,
    on_record: Callable[[CaseRecord], None] = lambda r: None,
) -> list[CaseRecord]:
    """Run every solution on every case; records reach ``results`` and ``on_record`` as they finish."""
    handles = {s.name: WorkerHandle(s, workload.definition.name, options) for s in solutions}
    records: list[CaseRecord] = []
    try:
        for case in cases:
            ctx = _CaseContext(workload, case, options.device, options.settings.tolerance)
            reference_ms: float | None = None
            for solution in solutions:
                record = run_one(handles[solution.name], ctx, options)
                if solution.name == REFERENCE_SOLUTION and record.passed and record.timing:
                    reference_ms = record.timing.mean_ms
                if record.passed and record.timing and reference_ms:
                    record.speedup = reference_ms / record.timing.mean_ms
                records.append(record)
                results.add(record)
                on_record(record)
            del ctx
            if options.device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        for handle in handles.values():
            handle.stop()
        results.update(solution_notes={name: h.notes for name, h in handles.items() if h.notes})
    return records
