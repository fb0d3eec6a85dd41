"""Where a run's cases go (:class:`Executor`), and this machine's devices as one (:class:`LocalExecutor`).

An executor runs the pending cases, hands every record to the results file and the caller as it
finishes, and notes in the results header what its workers reported (notes, packages, walls).
:class:`LocalExecutor` runs them on one device (:func:`~dsa_bench.run.runner.run_workload`) or
spreads them over several of this machine (``run --gpus N``, :func:`run_on_devices`);
:class:`~dsa_bench.run.ray_executor.RayExecutor` over a Ray cluster's GPUs.

Spreading a run's cases over several devices:

One :class:`~dsa_bench.run.runner.DeviceRunner` per device, each with its own isolated worker
per solution (built once per device), pulls whole cases from one queue: the reference and every
solution of a case run on the same device, so per-case speedups stay same-device ratios. Seeds
come from the workload seed and the case id only, so statuses and seeds do not depend on how
many devices ran or which one took a case; only the timings do.

The serving threads do the harness's own work (inputs, expectations, checks) for their device;
the solutions run in their workers' processes. A worker that crashes or hangs is handled by its
own handle (that case is marked, that worker restarted), never by the other devices.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from dsa_bench.results.records import CaseRecord, ResultsFile
from dsa_bench.run import isolation
from dsa_bench.run.breakdown import PhaseClock
from dsa_bench.run.runner import DeviceRunner, RunOptions, run_workload
from dsa_bench.solution import Solution
from dsa_bench.workloads import Case, Workload


class Executor(Protocol):
    """Runs ``cases``, every solution of a case on one device (the reference first); each record
    reaches ``results`` and ``on_record`` as it finishes; returns this sitting's records.
    ``clock`` is the run's phase clock (wall time, planning, results writes)."""

    def run(
        self, cases: list[Case], results: ResultsFile, on_record: Callable[[CaseRecord], None], clock: PhaseClock
    ) -> list[CaseRecord]: ...


@dataclass
class LocalExecutor:
    """This machine's devices: one per entry of ``device_options`` (a CUDA device, or a CPU
    worker slot of a correctness-only run), each with its workers' identities."""

    workload: Workload
    solutions: list[Solution]
    device_options: list[RunOptions]
    device_identities: list[dict[str, isolation.WorkerIdentity]]

    def run(
        self, cases: list[Case], results: ResultsFile, on_record: Callable[[CaseRecord], None], clock: PhaseClock
    ) -> list[CaseRecord]:
        """On one device, ``clock`` takes every phase; with several, each device keeps its own
        (``device_breakdowns`` in the results)."""
        if len(self.device_options) > 1:
            return run_on_devices(self.workload, cases, self.solutions, self.device_options, self.device_identities, results, on_record)
        options, identities = self.device_options[0], self.device_identities[0]
        return run_workload(self.workload, cases, self.solutions, options, results, on_record, identities, clock)


#: how often the main thread wakes to take signals while the devices work
_JOIN_POLL_S = 0.2


def run_on_devices(
    workload: Workload,
    cases: list[Case],
    solutions: list[Solution],
    device_options: list[RunOptions],
    device_identities: list[dict[str, isolation.WorkerIdentity]],
    results: ResultsFile,
    on_record: Callable[[CaseRecord], None] = lambda r: None,
) -> list[CaseRecord]:
    """Run every case on whichever device is free; records reach ``results`` as cases finish.

    Records are written as each finishes (the run sorts them into a one-device run's order at
    the end). A stop (Ctrl-C, SIGTERM) reaches the main thread: it ends every worker and keeps
    every finished record; an in-flight case is left unfinished, as on one device.
    """
    queue = collections.deque(cases)
    lock = threading.Lock()
    stopping = threading.Event()
    records: list[CaseRecord] = []
    errors: list[BaseException] = []
    runners = [
        DeviceRunner(workload, solutions, options, identities, gpu=slot)
        for slot, (options, identities) in enumerate(zip(device_options, device_identities, strict=True))
    ]

    def serve(runner: DeviceRunner) -> None:
        if runner.options.device.type == "cuda":
            torch.cuda.set_device(runner.options.device)  # this thread's current device

        def emit(record: CaseRecord) -> None:
            with lock:
                if not stopping.is_set():
                    records.append(record)
                    results.add(record)
                    on_record(record)

        try:
            while not stopping.is_set():
                with lock:
                    if not queue:
                        return
                    case = queue.popleft()
                finished = runner.run_case(case, emit)
                with lock:
                    results.refresh(finished)  # the case's final peer speedups
        except BaseException as exc:  # a harness bug: stop everything and raise it in the main thread
            if not stopping.is_set():
                errors.append(exc)
                stopping.set()

    threads = [threading.Thread(target=serve, args=(r,), name=f"device-{r.gpu}", daemon=True) for r in runners]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(_JOIN_POLL_S)
    except BaseException:
        stopping.set()
        for runner in runners:
            runner.kill()
        for thread in threads:
            thread.join(5)
        raise
    finally:
        for runner in runners:
            runner.stop()
        notes: dict[str, str] = {}
        packages: dict[str, dict[str, str]] = {}
        protections: dict[str, list[str]] = {}
        for runner in runners:
            notes.update(runner.notes)
            packages.update(runner.packages)
            protections.update(runner.protections)
        results.update(
            solution_notes={**(results.header.solution_notes or {}), **notes},
            solution_packages={**(results.header.solution_packages or {}), **packages},
            worker_protections={**(results.header.worker_protections or {}), **protections},
            device_breakdowns=[runner.clock.breakdown() for runner in runners],
        )
    if errors:
        raise errors[0]
    return records
