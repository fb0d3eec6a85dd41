"""Running a workload's cases on a Ray cluster (``run --executor ray [--ray-address ADDR]``).

One actor per GPU (``num_gpus=1``); each is a judging-side process like the harness itself: it
owns a :class:`~dsa_bench.run.runner.DeviceRunner` whose solutions run in isolated worker
processes it starts, builds each solution once, and runs whole cases (reference first). Only the
case goes to an actor and only its finished records come back; expectations, checks and the
reference's outputs stay inside the actor's judging code, never in a solution's process.

Ray retries nothing (``max_restarts=0``, ``max_task_retries=0``): a solution that crashes shows as
its case's RUNTIME_ERROR, from the actor's worker handle; if an actor itself dies, its case is
recorded as RUNTIME_ERROR for every solution and a fresh actor takes the next case. Records are
written to the results file as they arrive, so an interrupted cluster run keeps what finished.

The actors resolve their device and timer themselves (CUDA when their GPU is visible, else a
correctness-only run on CPU, as Ray's logical GPUs in tests give) and report their environment,
recorded under ``environment.gpus``. Every node needs the project at the same path (a shared
file system, or the same checkout), since solutions, workloads and caches are read from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsa_bench.definitions.status import Status
from dsa_bench.errors import DsaBenchError
from dsa_bench.results.records import CaseRecord, Environment, ResultsFile, launch_mode
from dsa_bench.run.breakdown import PhaseClock
from dsa_bench.run.runner import DeviceRunner, RunOptions, worker_identities
from dsa_bench.solution import Solution
from dsa_bench.workloads import Case, Workload


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise DsaBenchError("--executor ray needs Ray, which is not installed here: pip install 'dsa-bench[ray]'") from None
    return ray


class CaseActor:
    """The body of one Ray actor: a device's runner. Made remote by :func:`run_on_ray`."""

    def __init__(
        self,
        workload: Workload,
        cases: list[Case],
        solutions: list[Solution],
        options: RunOptions,
        timer: str,
        root: str,
        slot: int,
        cpu: bool = False,
    ) -> None:
        import torch

        from dsa_bench.results.environment import environment
        from dsa_bench.timing import choose_timer
        from dsa_bench.timing.flush import measure_copy_bandwidth

        if Path(root).is_dir():
            os.chdir(root)  # the project's relative paths (caches, logs) as on the driver
        on_gpu = torch.cuda.is_available() and not cpu
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        chosen, warning = choose_timer("auto" if cpu else timer, device)
        copy = measure_copy_bandwidth(device) if chosen is not None else None
        self.options = dataclasses.replace(options, device=device, timer=chosen, copy_bytes_per_s=copy, timer_fallback=warning)
        if chosen is not None and self.options.settings.input_sets < 2:
            raise DsaBenchError("timing needs --input-sets >= 2 so consecutive calls never see the same tensors")
        identities = worker_identities(solutions, self.options, cases, first_slot=slot * len(solutions))
        self.runner = DeviceRunner(workload, solutions, self.options, identities, gpu=slot)
        self.description = {
            **environment(device),
            **({"copy_gbps": copy / 1e9} if copy else {}),
            "timer": chosen,
            "timer_warning": warning,
            "workers": sorted({identity.description for identity in identities.values()}),
        }

    def describe(self) -> dict[str, Any]:
        return self.description

    def run_case(self, case: Case) -> list[CaseRecord]:
        return self.runner.run_case(case)

    def stop(self) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        self.runner.stop()
        return self.runner.notes, self.runner.packages


@dataclass
class RayExecutor:
    """A Ray cluster's GPUs (or with ``cpu``, its CPUs: correctness only), one actor per device;
    the actors' devices and timers are recorded in the results header as they start."""

    workload: Workload
    solutions: list[Solution]
    options: RunOptions
    timer: str  # what each actor resolves on its own device
    root: Path
    address: str | None = None
    max_actors: int | None = None
    cpu: bool = False

    def run(
        self, cases: list[Case], results: ResultsFile, on_record: Callable[[CaseRecord], None], clock: PhaseClock
    ) -> list[CaseRecord]:
        def record_actors(descriptions: list[dict[str, Any]]) -> None:
            timers = {d["timer"] for d in descriptions}
            timed = any(d["timer"] for d in descriptions)
            results.update(
                environment=(results.header.environment or Environment.model_construct()).model_copy(
                    update={"gpus": [Environment.model_construct(index=i, **d) for i, d in enumerate(descriptions)]}
                ),
                timer=timers.pop() if len(timers) == 1 else "mixed",
                l2_flush=self.options.l2_flush if timed else None,
                l2_persisting_reset=True if timed else None,
                launch=launch_mode(self.options.cuda_graph) if timed else None,
            )

        return run_on_ray(
            self.workload, cases, self.solutions, self.options, self.timer, self.root, results, on_record,
            address=self.address, max_actors=self.max_actors, on_start=record_actors, cpu=self.cpu,
        )  # fmt: skip


def run_on_ray(
    workload: Workload,
    cases: list[Case],
    solutions: list[Solution],
    options: RunOptions,
    timer: str,
    root: Path,
    results: ResultsFile,
    on_record: Callable[[CaseRecord], None] = lambda r: None,
    address: str | None = None,
    max_actors: int | None = None,
    on_start: Callable[[list[dict[str, Any]]], None] = lambda descriptions: None,
    cpu: bool = False,
) -> list[CaseRecord]:
    """Run every case on the cluster's GPUs (at most ``max_actors``), or with ``cpu`` on
    ``max_actors`` (default 1) CPU actors, correctness only; records reach ``results`` as they arrive."""
    ray = ray_module()
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-statistics notice
        if address is not None:
            check_reachable(address)
        try:
            # Ray's notices (token authentication and the like) are warnings of its "ray" logger, which
            # ray.init resets: at level ERROR they stay out of the run's output, and errors still show.
            # "local": a new cluster for this run, as --ray-address's help says, never one that
            # `ray start` left running on the machine (ray.init's default would join that one)
            with _time_limit(RAY_INIT_TIMEOUT_S, f"--executor ray: the Ray cluster at {address or 'a new local one'} did not come up"):
                ray.init(address=address or "local", log_to_driver=False, configure_logging=True, logging_level=logging.ERROR,
                         include_dashboard=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise DsaBenchError(f"--executor ray: cannot reach the Ray cluster at {address or 'a new local one'}: {exc}") from None
    if cpu:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus == 0:
            raise DsaBenchError("--executor ray --device cpu: the Ray cluster offers no CPUs")
        count = max(1, min(cpus, max_actors or 1, len(cases)))
        actor_class = ray.remote(num_cpus=1, num_gpus=0, max_restarts=0, max_task_retries=0)(CaseActor)
    else:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if gpus == 0:
            raise DsaBenchError(
                "--executor ray: the Ray cluster offers no GPUs (start its nodes with --num-gpus, or run on its CPUs with --device cpu)"
            )
        count = max(1, min(gpus, max_actors or gpus, len(cases)))
        actor_class = ray.remote(num_gpus=1, max_restarts=0, max_task_retries=0)(CaseActor)

    def start(slot: int) -> Any:
        return actor_class.remote(workload, cases, solutions, options, timer, str(root), slot, cpu)

    actors = [start(slot) for slot in range(count)]
    try:
        descriptions = ray.get([a.describe.remote() for a in actors])
    except ray.exceptions.RayError as exc:
        for actor in actors:
            ray.kill(actor)
        raise DsaBenchError(f"--executor ray: an actor could not start: {_first_line(exc)}") from None
    on_start(descriptions)
    queue = list(reversed(cases))
    pending: dict[Any, tuple[int, Case]] = {}
    records: list[CaseRecord] = []

    def submit(slot: int) -> None:
        if queue:
            case = queue.pop()
            pending[actors[slot].run_case.remote(case)] = (slot, case)

    try:
        for slot in range(count):
            submit(slot)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            slot, case = pending.pop(done[0])
            try:
                finished: list[CaseRecord] = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:  # the actor process died: this case, and a fresh actor
                message = f"the Ray actor running this case died (not retried): {_first_line(exc)}"
                failed = {"axes": dict(case.axes), "status": Status.RUNTIME_ERROR, "message": message, "gpu": slot}
                finished = [CaseRecord.new(case=case.id, solution=s.name, **failed) for s in solutions]
                actors[slot] = start(slot)
            for record in finished:
                records.append(record)
                results.add(record)
                on_record(record)
            submit(slot)
    finally:
        notes: dict[str, str] = {}
        packages: dict[str, dict[str, str]] = {}
        for actor in actors:
            try:
                actor_notes, actor_packages = ray.get(actor.stop.remote(), timeout=30)
                notes.update(actor_notes)
                packages.update(actor_packages)
            except (ray.exceptions.RayError, TimeoutError):
                pass
            ray.kill(actor)
        results.update(
            solution_notes={**(results.header.solution_notes or {}), **notes},
            solution_packages={**(results.header.solution_packages or {}), **packages},
        )
    return records


#: how long ``--ray-address`` may take to accept a connection, and ``ray.init`` to finish
RAY_CONNECT_TIMEOUT_S = 10.0
RAY_INIT_TIMEOUT_S = 120.0


def check_reachable(address: str) -> None:
    """Refuse a ``--ray-address`` that accepts no TCP connection within :data:`RAY_CONNECT_TIMEOUT_S`
    (``ray.init`` itself would wait for it without a limit)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DsaBenchError(f"--ray-address {address!r}: expected HOST:PORT (the head node's GCS port, 6379 by default)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        problem = f"--ray-address {address}: no Ray cluster answers there within {RAY_CONNECT_TIMEOUT_S:g} s ({reason})"
        raise DsaBenchError(problem) from None


@contextlib.contextmanager
def _time_limit(seconds: float, message: str) -> Iterator[None]:
    """Raise DsaBenchError(``message``) when the block takes longer than ``seconds`` (main thread
    only, by SIGALRM; elsewhere the block runs without a limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise DsaBenchError(f"{message} within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
