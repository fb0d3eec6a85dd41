"""Carrying out a planned run: the results file written as records finish, the cases handed to
the plan's executor, and Ctrl-C, SIGTERM and SIGHUP turned into an orderly stop."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dsa_bench.results.records import CaseRecord, Environment, ResultsFile, now_iso, write_redacted
from dsa_bench.results.tables import sagged
from dsa_bench.run.breakdown import PhaseClock
from dsa_bench.run.executor import Executor, LocalExecutor
from dsa_bench.run.plan import RunPlan
from dsa_bench.run.runner import Interrupted


@dataclass
class RunOutcome:
    records: list[CaseRecord]
    results: ResultsFile
    sagged: list[str]
    stopped_by: int | None  # the signal that stopped the run, None when it finished


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop a run: workers are ended, finished records kept. SIGINT's
    handler is set here too, because a job started in the background by a non-interactive shell
    (`dsa-bench run ... &` in a script) inherits SIGINT ignored, and `kill -INT` would do nothing."""

    def stop(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def execute(plan: RunPlan, on_record: Callable[[CaseRecord], None] = lambda r: None) -> RunOutcome:
    """Run the plan; the results file is complete only when every case ran. The outcome's records
    are the whole file's (a resumed run's earlier records too)."""
    resumed = plan.resumed
    clock = PhaseClock(plan.planning_s, resumed.previous.header.wall_breakdown if resumed else None)
    with clock.phase("planning"):  # the header: environment, solutions' content hashes
        header = plan.header() if resumed is None else resumed.header()
    revealed_settings = header.settings
    if plan.secret:  # withheld until the run ends, interrupted or not; then recorded to reproduce it
        header.settings = revealed_settings.model_copy(update={"seed": None}) if revealed_settings is not None else None
    kept, superseded = (resumed.previous.records, resumed.superseded) if resumed else ([], set())
    with clock.phase("results_writes"):
        results = ResultsFile(plan.save_path, header, kept, superseded)
    stopped_by: int | None = None
    try:
        with _stopped_by_signals():
            executor_of(plan).run(plan.pending_cases, results, on_record, clock)
    except KeyboardInterrupt as stop:
        stopped_by = stop.signum if isinstance(stop, Interrupted) else int(signal.SIGINT)
    results.stop_flushing()
    case_order = {c.id: i for i, c in enumerate(plan.cases)}
    solution_order = {s.name: i for i, s in enumerate(plan.solutions)}
    # several devices finish cases out of order: the file keeps a one-device run's order
    results.sort_records(lambda r: (case_order.get(r.case, len(case_order)), solution_order.get(r.solution, 0)))
    records = list(results.records)
    sag = _sagged(records, results.header.environment or Environment())
    results.update(complete=stopped_by is None, finished=now_iso(), clock_sagged=sag, wall_breakdown=clock.breakdown(),
                   settings=revealed_settings)  # fmt: skip
    if plan.redacted_path is not None:
        write_redacted(results.document, plan.redacted_path)
    return RunOutcome(records, results, sag, stopped_by)


def executor_of(plan: RunPlan) -> Executor:
    """The plan's executor: this machine's devices, or a Ray cluster (imported only then)."""
    if plan.executor == "ray":
        from dsa_bench.run.ray_executor import RayExecutor

        return RayExecutor(plan.workload, plan.solutions, plan.options, plan.timer_request, plan.root, address=plan.ray_address,
                           max_actors=plan.ray_gpus, cpu=plan.ray_cpu)  # fmt: skip
    return LocalExecutor(plan.workload, plan.solutions, plan.device_options, plan.device_identities)


def _sagged(records: list[CaseRecord], env: Environment) -> list[str]:
    """Records timed below 90 % of their own device's maximum SM clock."""
    if not env.gpus:
        return sagged(records, env.max_sm_mhz)
    return [line for i, d in enumerate(env.gpus) for line in sagged([r for r in records if r.gpu == i], d.max_sm_mhz)]
