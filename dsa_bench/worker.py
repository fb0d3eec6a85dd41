"""The isolated solution process.

Each solution runs in its own spawned process. The worker builds its inputs itself from the
case and seeds (the same generator the harness uses, so both sides hold identical inputs), calls
the solution, times it, and sends back only outputs and timings. It never receives reference
outputs, and a crash, hang or CUDA fault in it cannot take the harness down: the parent
(:mod:`dsa_bench.runner`) sees a dead pipe or a missed deadline, records the case, and starts a
fresh worker.

Protocol (tuples over a ``multiprocessing`` pipe)::

    worker -> parent   ("ready", notes) | ("compile_error", text)
    parent -> worker   ("outputs", CorrectnessJob) | ("time", TimingJob) | ("stop",)
    worker -> parent   ("outputs", [outputs per seed], notes) | ("timing", TimingResult, notes)
                       | ("error", text, notes)
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from dsa_bench.workloads import Case


@dataclass(frozen=True)
class WorkerConfig:
    solution_path: str
    definition: str
    device: str  # "cpu" or "cuda:N"
    timer: str | None  # "cupti" | "events" | None (no timing on this device)
    l2_flush: str  # timing.L2_FLUSH_MODES
    log_path: str
    extensions_dir: str
    dataset_root: str | None = None  # a flashinfer-bench dataset whose definition this run uses


@dataclass(frozen=True)
class CorrectnessJob:
    case: Case
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class TimingJob:
    case: Case
    trial_seeds: tuple[tuple[int, ...], ...]  # per trial, the seeds of its rotating input sets
    warmup: int
    iterations: int
    sample_seed: int  # picks which timed call of each trial is checked


@dataclass
class CheckedCall:
    """One timed call sent back for checking: its input set, the query values redrawn just
    before it, and what it returned."""

    trial: int
    iteration: int
    seed: int
    redrawn_inputs: dict[str, Any]
    outputs: dict[str, Any]


@dataclass
class TimingResult:
    timer: str
    samples_ms: list[list[float]] = field(default_factory=list)
    checked: list[CheckedCall] = field(default_factory=list)
    clocks: list[dict[str, Any]] = field(default_factory=list)  # per trial: clocks after warm-up and after timing
    phase_s: dict[str, float] = field(default_factory=dict)  # worker wall time per phase, summed over trials


def call_solution(fn: Callable[..., Any], dps: bool, args: list[Any], outputs: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """Call in destination-passing style, or collect returned outputs by spec order."""
    if dps:
        fn(*args, *outputs.values())
        return dict(outputs)
    result = fn(*args)
    if isinstance(result, dict):
        return dict(result)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    return dict(zip(names, result))


def _redirect_output(log_path: str) -> None:
    """Send the solution's prints (and native library output) to a log, not the harness terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(conn: Any, config: WorkerConfig) -> None:
    """Worker entry point (runs in the spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _redirect_output(config.log_path)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", config.extensions_dir)
    if config.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the solution's first triton import
    import torch

    from dsa_bench.definitions import get_definition
    from dsa_bench.solutions import import_entry, load_solution

    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.dataset_root is not None:  # dataset definitions are registered per process
        from dsa_bench.dataset import register_dataset_definition

        register_dataset_definition(Path(config.dataset_root), config.definition)
    definition = get_definition(config.definition)
    timer = flusher = clocks = None
    try:
        solution = load_solution(Path(config.solution_path))
        entry = solution.entry_for(config.definition)
        fn, module = import_entry(solution, config.definition)
        notes_fn = getattr(module, "solution_notes", None)

        def notes() -> str:  # asked again after every job: a solution may report what it fell back to
            return str(notes_fn()) if callable(notes_fn) else ""

        if config.timer is not None:
            from dsa_bench.timing import ClockReader, L2Flusher, make_timer

            timer = make_timer(config.timer)
            flusher = L2Flusher(device, config.l2_flush)
            clocks = ClockReader(device.index if device.index is not None else torch.cuda.current_device())
    except BaseException:
        conn.send(("compile_error", traceback.format_exc()))
        return
    conn.send(("ready", notes()))
    runner = _CaseRunner(definition, device, fn, entry.destination_passing_style)
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        try:
            if message[0] == "outputs":
                reply: tuple = ("outputs", runner.outputs(message[1]))
            else:
                reply = ("timing", runner.time(message[1], timer, flusher, clocks))
        except BaseException:
            reply = ("error", traceback.format_exc())
        conn.send((*reply, notes()))


class _CaseRunner:
    def __init__(self, definition: Any, device: Any, fn: Callable[..., Any], dps: bool) -> None:
        self.definition = definition
        self.device = device
        self.fn = fn
        self.dps = dps
        self.names = [spec.name for spec in definition.outputs]

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _inputs(self, case: Case, seed: int) -> Any:
        from dsa_bench.workloads import build_inputs

        return build_inputs(self.definition, case, seed, self.device)

    def _to_host(self, outputs: Mapping[str, Any]) -> dict[str, Any]:
        return {k: (v.detach().cpu() if hasattr(v, "detach") else v) for k, v in outputs.items()}

    def outputs(self, job: CorrectnessJob) -> list[dict[str, Any]]:
        axes = self.definition.axes(job.case.axes)
        results = []
        for seed in job.seeds:
            inputs = self._inputs(job.case, seed)
            outs = self.definition.allocate_outputs(axes, self.device)
            got = call_solution(self.fn, self.dps, self.definition.input_args(inputs), outs, self.names)
            self._sync()
            results.append(self._to_host(got))
            del inputs, outs, got
        return results

    def time(self, job: TimingJob, timer: Any, flusher: Any, clocks: Any) -> TimingResult:
        """Time the solution: per trial, fresh input sets rotating call by call, queries redrawn,
        outputs re-poisoned and L2 flushed before every call (all untimed)."""
        result = TimingResult(timer=timer.name, phase_s={"build_inputs": 0.0, "warmup": 0.0, "timed_calls": 0.0})
        for trial, seeds in enumerate(job.trial_seeds):
            self._time_trial(job, trial, seeds, timer, flusher, clocks, result)  # its input sets die with it
        return result

    def _time_trial(self, job: TimingJob, trial: int, seeds: tuple[int, ...], timer: Any, flusher: Any, clocks: Any, result: TimingResult) -> None:
        from dsa_bench.definitions.base import InputRng, poison_
        from dsa_bench.workloads import derive_seed

        axes = self.definition.axes(job.case.axes)
        phases = result.phase_s
        n = len(seeds)
        started = time.perf_counter()
        sets = [self._inputs(job.case, s) for s in seeds]
        args = [self.definition.input_args(x) for x in sets]
        outs = [self.definition.allocate_outputs(axes, self.device) for _ in seeds]
        redraw_rng = InputRng(derive_seed(job.sample_seed, "redraw", trial), self.device)
        sampled = random.Random(derive_seed(job.sample_seed, "pick", trial)).randrange(job.iterations)
        latest: dict[int, dict[str, Any]] = {}
        redrawn: dict[str, Any] = {}
        captured: dict[str, Any] = {}
        timed = False

        def prepare(i: int) -> None:
            fresh = self.definition.redraw(axes, redraw_rng)
            for name, value in fresh.items():
                sets[i % n][name].copy_(value)  # in place: the solution keeps the same tensors
            if timed and i == sampled:
                redrawn.update({k: v.detach().clone() for k, v in fresh.items()})
            for out in outs[i % n].values():
                poison_(out)
            flusher.flush()

        def call(i: int) -> None:
            latest[i % n] = call_solution(self.fn, self.dps, args[i % n], outs[i % n], self.names)

        def after(i: int) -> None:
            if i == sampled:
                captured.update({k: v.detach().clone() for k, v in latest[i % n].items()})

        self._sync()
        warmup_start = time.perf_counter()
        phases["build_inputs"] += warmup_start - started
        for i in range(job.warmup):
            prepare(i)
            call(i)
        self._sync()
        timed_start = time.perf_counter()
        phases["warmup"] += timed_start - warmup_start
        before = clocks.read() if clocks else None
        timed = True
        result.samples_ms.append(timer.time_iterations(call, job.iterations, prepare, after))
        phases["timed_calls"] += time.perf_counter() - timed_start
        result.clocks.append({"after_warmup": before, "after_timing": clocks.read() if clocks else None})
        result.checked.append(CheckedCall(trial, sampled, seeds[sampled % n], self._to_host(redrawn), self._to_host(captured)))
