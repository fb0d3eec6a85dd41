"""Running a workload: per case, per solution, check and (on a GPU) time, in isolated workers.

For each case the harness builds the same input sets the workers build (same seeds), computes
what the checker needs from the reference once, and hands each solution's outputs to the
definition's checker. The reference solution runs first on every case when timing, so each
solution's speedup is measured against a reference timed in the same run. Once every solution
has run a case, each record also gets its speedup over the fastest peer (a solution whose
manifest has ``requires``) that passed that case, or over the run's ``--speedup-over`` solution.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import dsa_bench
from dsa_bench.definitions.base import Definition
from dsa_bench.definitions.checks import worst
from dsa_bench.definitions.status import CheckResult, Status
from dsa_bench.paths import safe_file_name
from dsa_bench.results.records import CaseRecord, ResultsFile, Timing
from dsa_bench.results.roofline import Roofline, device_peak, place
from dsa_bench.run import channel, isolation, sandbox
from dsa_bench.run.breakdown import HARNESS, PhaseClock
from dsa_bench.run.case_context import (
    CaseContext,
    correctness_seeds,
    decode_outputs,
    decode_timing,
    implausible_timing,
    timed_work,
    trial_seeds,
)
from dsa_bench.run.protocol import (
    CorrectnessJob,
    ProtocolError,
    TimingJob,
    WorkerConfig,
    parse_reply,
    value_bytes,
)
from dsa_bench.run.request import default as option_default
from dsa_bench.solution import REFERENCE_SOLUTION, Solution
from dsa_bench.workloads import REFERENCE_LIGHT, Case, RunSettings, Workload, derive_seed

#: what of the harness's environment a worker sees (nothing else: no tokens, no credentials)
WORKER_ENV = ("PATH", "LD_LIBRARY_PATH", "LANG", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONUNBUFFERED", "CC", "CXX")


WORKER_ENV_PREFIXES = ("LC_", "CUDA", "NVIDIA_", "NCCL_", "TORCH_", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "OPENBLAS_", "DSA_BENCH_")


@dataclass(frozen=True)
class RunOptions:
    device: torch.device
    settings: RunSettings
    timer: str | None  # "cupti" | "events" on a GPU; None: correctness only
    l2_flush: str  # timing.L2_FLUSH_MODES
    #: timed calls are replays of a CUDA graph the worker captured of the call (run --cuda-graph), not eager calls
    cuda_graph: bool = False
    compile_timeout_s: float = option_default("compile_timeout")
    case_timeout_s: float = option_default("case_timeout")
    log_dir: Path = Path(".cache/dsa-bench/logs")
    cache_dir: Path = Path(".cache/dsa-bench")  # per-solution build, Triton and home folders below it
    dataset_root: Path | None = None  # set when the workload comes from a flashinfer-bench dataset
    worker_user: str = "auto"  # isolation.WORKER_USER_MODES
    #: measured device copy bandwidth (bytes/s); with it, timings below the physical floor are refused
    copy_bytes_per_s: float | None = None
    #: the solution every record's peer speedup is measured against; None: the fastest peer that passed the case
    speedup_over: str | None = None
    #: why ``--timer auto`` did not time with CUPTI (it fell back to CUDA events); recorded on every timed record
    timer_fallback: str | None = None


class WorkerFailure(Exception):
    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Interrupted(KeyboardInterrupt):
    """The harness was asked to stop (Ctrl-C, SIGTERM, SIGHUP); ``signum`` says by what."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class WorkerHandle:
    """A solution's worker process, restarted after anything that may have damaged it.

    The worker is a fresh interpreter (``python -m dsa_bench.run.worker``) in a session of its own,
    as an unprivileged user when the harness is root (:mod:`dsa_bench.run.isolation`), with its
    output going to a log file; it talks to the harness over two pipes (:mod:`dsa_bench.run.channel`).
    """

    def __init__(self, solution: Solution, definition: str, options: RunOptions, identity: isolation.WorkerIdentity) -> None:
        self.solution = solution
        self.options = options
        self.identity = identity
        options.log_dir.mkdir(parents=True, exist_ok=True)
        slug = safe_file_name(solution.name)
        self.log_path = (options.log_dir / f"{slug}.log").resolve()
        extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or options.cache_dir / "torch_extensions") / slug
        self.writable = [
            extensions.resolve(),
            (options.cache_dir / "triton" / slug).resolve(),
            (options.cache_dir / "home" / slug).resolve(),
            (options.cache_dir / "scratch" / slug).resolve(),  # its TMPDIR
        ]
        self.config = WorkerConfig(
            solution_path=str(solution.path),
            definition=definition,
            device=str(options.device),
            timer=options.timer,
            l2_flush=options.l2_flush,
            cuda_graph=options.cuda_graph,
            extensions_dir=str(self.writable[0]),
            harness_pid=os.getpid(),
            dataset_root=str(options.dataset_root.resolve()) if options.dataset_root else None,
            packed_from=str(solution.packed_from) if solution.packed_from else None,
            writable=tuple(str(p) for p in self.writable),
        )
        self.process: subprocess.Popen | None = None
        self._send_fd = self._receive_fd = -1
        self.notes = ""
        self.packages: dict[str, str] = {}
        self.protections: list[str] = []  # the walls the worker reported standing in (with the harness's own)
        self.compile_failure: WorkerFailure | None = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in WORKER_ENV or k.startswith(WORKER_ENV_PREFIXES)}
        package_root = str(Path(dsa_bench.__file__).resolve().parent.parent)  # the same dsa_bench as the harness
        env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
        env["TORCH_EXTENSIONS_DIR"], env["TRITON_CACHE_DIR"], env["HOME"], env["TMPDIR"] = (str(p) for p in self.writable)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if self.options.device.type == "cpu":
            env["TRITON_INTERPRET"] = "1"  # must precede the solution's first triton import
        else:
            env.pop("TRITON_INTERPRET", None)
        return env

    def ensure_started(self) -> None:
        """Start the worker and wait for its import/build; a failure is remembered for every case."""
        if self.compile_failure is not None:
            # A fresh exception each case: raising the remembered one again would chain every case's
            # frames, and the inputs and expected outputs they hold, onto its traceback (a skipped
            # peer grew the harness by the case data of every case, 23 GB over indexer_h64 on CPU).
            raise WorkerFailure(self.compile_failure.status, self.compile_failure.message)
        if self.process is not None and self.process.poll() is None:
            return
        isolation.give_to(self.identity, self.writable)
        harness_protection = sandbox.protect_harness()
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        identity = self.identity  # uid and gid None: the harness's own user, with its groups
        launcher = [sys.executable, "-m", "dsa_bench.run.sandbox", "--harness-pid", str(os.getpid()),
                    "--fds", f"{to_worker_r},{from_worker_w}", *(f"--write={p}" for p in self.writable),
                    *(["--no-landlock"] if self.options.device.type == "cuda" else []), "--"]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*launcher, sys.executable, "-m", "dsa_bench.run.worker", str(to_worker_r), str(from_worker_w)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(to_worker_r, from_worker_w),
                start_new_session=True, env=self._environment(),
                user=identity.uid, group=identity.gid, extra_groups=[] if identity.dedicated else None,
            )  # fmt: skip
        os.close(to_worker_r)
        os.close(from_worker_w)
        self._send_fd, self._receive_fd = to_worker_w, from_worker_r
        os.set_blocking(self._send_fd, False)
        try:
            self._send({"config": self.config.__dict__}, b"", "starting the worker")
            reply = self._receive(
                self.options.compile_timeout_s, "importing/building the solution", 0, ("ready", "refused", "compile_error", "unavailable")
            )
        except WorkerFailure as failure:
            if failure.status is Status.RUNTIME_ERROR:  # died while importing: a build problem
                failure = WorkerFailure(Status.COMPILE_ERROR, failure.message)
            self.compile_failure = failure
            raise failure
        if reply.type == "unavailable":
            self.compile_failure = WorkerFailure(Status.SKIPPED, f"skipped: {reply.text}")
            self.kill()
            raise self.compile_failure
        if reply.type == "refused":  # a forbidden act while importing: every case fails as a runtime error
            self.compile_failure = WorkerFailure(Status.RUNTIME_ERROR, reply.text)
            self.kill()
            raise self.compile_failure
        if reply.type == "compile_error":
            self.compile_failure = WorkerFailure(Status.COMPILE_ERROR, _last_lines(reply.text))
            self.kill()
            raise self.compile_failure
        self.notes = reply.notes
        self.packages = dict(reply.packages)
        self.protections = [*([harness_protection] if harness_protection else []), *reply.protections]

    def request(self, kind: str, job: Any, what: str, max_blob_bytes: int, expected: tuple[str, ...]) -> tuple[Any, bytes]:
        """Send a job; the validated reply and its tensor blob. Any failure stops the worker."""
        self.ensure_started()
        self._send({"request": kind}, pickle.dumps(job), what)
        reply = self._receive(self.options.case_timeout_s, what, max_blob_bytes, (*expected, "error"))
        self.notes = reply.notes
        if reply.type == "error":
            self.kill()  # the solution raised; its process state is suspect (CUDA faults are sticky)
            raise WorkerFailure(Status.RUNTIME_ERROR, _last_lines(reply.text))
        return reply, self._blob

    def _send(self, header: dict[str, Any], blob: bytes, what: str) -> None:
        try:
            channel.write_frame(self._send_fd, header, blob, timeout=self.options.case_timeout_s)
        except channel.ChannelTimeout:
            self.kill()
            raise WorkerFailure(
                Status.TIMEOUT, f"the worker took no request within {self.options.case_timeout_s:g} s while {what}; worker killed"
            ) from None
        except (channel.ChannelError, OSError):
            raise self._died(what) from None

    def _receive(self, timeout: float, what: str, max_blob_bytes: int, expected: tuple[str, ...]) -> Any:
        try:
            header, self._blob = channel.read_frame(self._receive_fd, max_blob_bytes, timeout)
        except channel.ChannelTimeout:
            self.kill()
            raise WorkerFailure(Status.TIMEOUT, f"no answer within {timeout:g} s while {what}; worker killed") from None
        except channel.ChannelClosed:
            raise self._died(what) from None
        except channel.ChannelError as exc:
            self.kill()
            raise WorkerFailure(Status.RUNTIME_ERROR, f"the worker broke the protocol while {what}: {exc}; worker killed") from None
        try:
            return parse_reply(header, expected)
        except ProtocolError as exc:
            self.kill()
            raise WorkerFailure(Status.RUNTIME_ERROR, f"{exc} (while {what}); worker killed") from None

    def _died(self, what: str) -> WorkerFailure:
        assert self.process is not None
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self.kill()
        tail = self.log_tail()
        detail = f"\n{tail}" if tail else ""
        return WorkerFailure(Status.RUNTIME_ERROR, f"worker process died (exit code {code}) while {what}{detail}")

    def stop(self) -> None:
        """Ask the worker to end, then make sure it and everything it started has."""
        if self.process is not None and self.process.poll() is None:
            try:
                channel.write_frame(self._send_fd, {"request": "stop"}, b"", timeout=1.0)
                self.process.wait(5)
            except (channel.ChannelError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def kill(self) -> None:
        if self.process is not None:
            try:  # the launcher first: without a PID namespace it kills every descendant of the worker itself
                self.process.terminate()
                self.process.wait(2)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            isolation.end_everything(self.process.pid, self.identity)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for fd in (self._send_fd, self._receive_fd):
                if fd >= 0:
                    os.close(fd)
            self._send_fd = self._receive_fd = -1
        self.process = None


def _last_lines(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def timing_job(settings: RunSettings, case: Case, is_reference: bool) -> TimingJob:
    """The solution's timing job; the reference's is lighter unless ``reference_protocol`` is "full"."""
    warmup, iterations, trials = settings.warmup, settings.iterations, settings.trials
    if is_reference and settings.reference_protocol == "light":
        light_warmup, light_iterations, light_trials = REFERENCE_LIGHT
        warmup, iterations, trials = min(warmup, light_warmup), min(iterations, light_iterations), min(trials, light_trials)
    seeds = trial_seeds(dataclasses.replace(settings, trials=trials), case)
    return TimingJob(case, seeds, warmup, iterations, derive_seed(settings.seed, case.id, "sample"))


def untimed_reason(solution: str, definition: Definition, options: RunOptions) -> str | None:
    """Why a solution that passed is not timed in this run, or None: with --cuda-graph, a reference that
    cannot be captured (its outputs are still the expectation; the run then has no speedups over it)."""
    if options.cuda_graph and solution == REFERENCE_SOLUTION and definition.reference_uncapturable:
        return (f"not timed: --cuda-graph cannot capture this definition's reference ({definition.reference_uncapturable}); "
                "no speedups over the reference in this run")  # fmt: skip
    return None


def run_one(handle: WorkerHandle, ctx: CaseContext, options: RunOptions) -> CaseRecord:
    """One solution on one case: correctness on every input set, then (GPU) timing."""
    settings = options.settings  # the run's settings: the workload's, with the command line's overrides
    case = ctx.case
    seeds = correctness_seeds(settings, case)
    record = CaseRecord.new(
        case=case.id, solution=handle.solution.name, axes=dict(case.axes), status=Status.PASSED, seeds={"correctness": list(seeds)}
    )
    owner, clock = handle.solution.name, ctx.clock
    started = time.perf_counter()
    output_bytes = value_bytes(ctx.output_specs)
    try:
        with clock.phase("worker_start", owner):
            handle.ensure_started()
        try:
            with clock.phase("traffic", owner) as request:
                reply, blob = handle.request(
                    "outputs", CorrectnessJob(case, seeds), f"running case {case.id}", len(seeds) * output_bytes + 2**20, ("outputs",)
                )
            clock.reassign(reply.phase_s, owner, request.seconds)
            with clock.phase("decode", owner):
                outputs = decode_outputs(reply, blob, ctx, len(seeds))
        except ProtocolError as exc:
            handle.kill()
            raise WorkerFailure(Status.RUNTIME_ERROR, f"{exc}; worker killed") from None
        checks_start = time.perf_counter()
        record.phases_s["correctness_calls"] = checks_start - started
        with clock.phase("checks", owner):
            result = worst([ctx.check(seed, out) for seed, out in zip(seeds, outputs, strict=True)])
        record.phases_s["checks"] = time.perf_counter() - checks_start
        untimed = untimed_reason(handle.solution.name, ctx.workload.definition, options)
        if result.passed and untimed is not None and options.timer is not None:
            result = CheckResult(result.status, untimed, result.max_abs_error, result.max_rel_error)
        elif result.passed and options.timer is not None:
            job = timing_job(settings, case, handle.solution.name == REFERENCE_SOLUTION)
            limit = len(job.trial_seeds) * (output_bytes + value_bytes(ctx.redraw_specs)) + 2**20
            sent = time.perf_counter()
            try:
                with clock.phase("traffic", owner) as request:
                    reply, blob = handle.request("time", job, f"timing case {case.id}", limit, ("timing",))
                wall_s = time.perf_counter() - sent
                clock.reassign(reply.phase_s, owner, request.seconds)
                with clock.phase("decode", owner):
                    timing = decode_timing(reply, blob, ctx, job)
            except ProtocolError as exc:
                handle.kill()
                raise WorkerFailure(Status.RUNTIME_ERROR, f"{exc}; worker killed") from None
            record.seeds["trials"] = [list(s) for s in job.trial_seeds]
            record.seeds["checked_calls"] = [{"trial": c.trial, "iteration": c.iteration, "seed": c.seed} for c in timing.checked]
            with clock.phase("checks", owner):
                for call in timing.checked:  # outputs of timed calls are checked too, not only the first call
                    checked = ctx.check(call.seed, call.outputs, call.redrawn_inputs)
                    if not checked.passed:
                        message = f"timed call {call.iteration} of trial {call.trial} returned wrong outputs: {checked.message}"
                        result = CheckResult(checked.status, message, checked.max_abs_error, checked.max_rel_error)
                        break
                suspect = implausible_timing(timing, job, ctx, wall_s, options.copy_bytes_per_s) if result.passed else None
            if suspect is not None:
                result = CheckResult(
                    Status.TIMING_SUSPECT, f"impossible timing, not recorded: {suspect}", result.max_abs_error, result.max_rel_error
                )
            record.timing = Timing.model_construct(
                timer=timing.timer, samples_ms=timing.samples_ms, clocks=timing.clocks,
                host_samples_ms=timing.host_samples_ms, timer_fallback=options.timer_fallback, kernel_ms=timing.kernel_ms,
            )  # fmt: skip
            if result.passed:
                with clock.phase("checks", owner):  # counting the work reuses the input sets the floor check built
                    record.roofline = roofline_of(record.timing, ctx, job, options)
            record.phases_s.update({f"timing_{k}": v for k, v in timing.phase_s.items()})
        record.status, record.message = result.status, result.message
        record.max_abs_error, record.max_rel_error = result.max_abs_error, result.max_rel_error
    except WorkerFailure as failure:
        record.status, record.message = failure.status, failure.message
    if not record.passed:
        record.timing = None
        record.roofline = None
    record.wall_s = time.perf_counter() - started
    return record


def roofline_of(timing: Timing, ctx: CaseContext, job: TimingJob, options: RunOptions) -> Roofline | None:
    """Where a timed record sits on the device's roofline (dsa_bench.results.roofline); None without a
    measured copy bandwidth or when the definition counts neither bytes nor FLOPs."""
    if options.copy_bytes_per_s is None or options.device.type != "cuda":
        return None
    min_bytes, flops = timed_work(ctx, job)
    if min_bytes is None and flops is None:
        return None
    gpu = torch.cuda.get_device_name(options.device)
    definition = ctx.workload.definition
    precision = definition.math_precision if flops else None  # a call with no FLOPs to do is placed on bandwidth alone
    return place(timing.mean_ms / 1e3, min_bytes or 0.0, flops or 0.0, precision, options.copy_bytes_per_s, device_peak(gpu), gpu)


def assign_peer_speedups(records: list[CaseRecord], peers: set[str], speedup_over: str | None) -> None:
    """Set each record's ``peer`` and ``peer_speedup`` from one case's records of one run.

    The comparison is ``speedup_over`` where it passed and was timed on this case, else (when
    ``speedup_over`` is None) the fastest of ``peers`` that passed and was timed. Every record
    of the case then names it; a record that passed and was timed gets the comparison's latency
    over its own (the fastest peer itself gets 1.0), others keep None (a failure counts as 0 in
    the summaries, as for the speedup over the reference).
    """
    timed = {r.solution: r.timing.mean_ms for r in records if r.passed and r.timing is not None}
    candidates = [speedup_over] if speedup_over is not None else sorted(peers)
    timed_candidates = [name for name in candidates if name in timed]
    if not timed_candidates:
        return
    comparison = min(timed_candidates, key=lambda name: timed[name])
    for record in records:
        record.peer = comparison
        mine = timed.get(record.solution)
        record.peer_speedup = timed[comparison] / mine if mine else None


def order_solutions(solutions: list[Solution], timing: bool, reference: Solution | None) -> list[Solution]:
    """Reference first, then the peers (solutions with ``requires``), then the others; when
    timing, the reference is always included for the speedup column."""
    others = [s for s in solutions if s.name != REFERENCE_SOLUTION]
    chosen = [s for s in others if s.requires.any] + [s for s in others if not s.requires.any]
    has_reference = any(s.name == REFERENCE_SOLUTION for s in solutions)
    if (timing or has_reference) and reference is not None:
        chosen.insert(0, reference)
    return chosen


def worker_identities(
    solutions: list[Solution], options: RunOptions, cases: list[Case], first_slot: int = 0
) -> dict[str, isolation.WorkerIdentity]:
    """One identity per solution (see :mod:`dsa_bench.run.isolation`); ``first_slot`` keeps the
    identities of several devices' workers apart."""
    reads = isolation.python_paths() + [Path.cwd()]
    if options.dataset_root is not None:
        reads.append(options.dataset_root)
    reads += sorted({src.path for c in cases for src in c.inputs.values() if src.path is not None})
    devices = isolation.gpu_device_files(options.device.index or 0) if options.device.type == "cuda" else []
    return {
        # a packed solution is imported from its folder's parent (see loader.import_entry)
        s.name: isolation.choose_identity(
            options.worker_user, first_slot + slot, reads + [s.path] + ([s.path.parent] if s.packed_from else []), devices
        )
        for slot, s in enumerate(solutions)
    }


class DeviceRunner:
    """Every solution's worker on one device. It runs whole cases, reference first, so each
    speedup is a ratio of two latencies measured on the same device in the same run."""

    def __init__(
        self,
        workload: Workload,
        solutions: list[Solution],
        options: RunOptions,
        identities: dict[str, isolation.WorkerIdentity],
        gpu: int | None = None,
        clock: PhaseClock | None = None,
    ) -> None:
        self.clock = clock or PhaseClock()  # not shared between threads: one per device
        self.workload = workload
        self.solutions = solutions
        self.options = options
        self.gpu = gpu  # this device's index among the run's devices (recorded on each record), None on a one-device run
        self.handles = {s.name: WorkerHandle(s, workload.definition.name, options, identities[s.name]) for s in solutions}
        self.peers = {s.name for s in solutions if s.requires.any}
        self.oracle = _reference_oracle(workload, options, gpu) if options.dataset_root is not None else None
        self._oracle_failures: dict[tuple[str, int], WorkerFailure] = {}

    def _isolated_expectation(self, case: Case, ctx: CaseContext) -> Callable[[int], dict[str, Any]]:
        """The expectation of one input set from the oracle worker (the dataset's reference, isolated
        and under --case-timeout like any solution); its failure fails the case for every solution."""
        assert self.oracle is not None
        oracle = self.oracle

        def expectation(seed: int) -> dict[str, Any]:
            failed = self._oracle_failures.get((case.id, seed))
            if failed is None:
                what = f"computing the dataset reference's expectation for case {case.id}"
                try:
                    reply, blob = oracle.request("outputs", CorrectnessJob(case, (seed,)), what, value_bytes(ctx.output_specs) + 2**20,
                                                 ("outputs",))  # fmt: skip
                    expected = decode_outputs(reply, blob, ctx, 1)[0]
                    bad = [n for n in ctx.output_specs if not isinstance(expected.get(n), torch.Tensor) or expected[n].is_meta]
                    if not bad:
                        return expected
                    oracle.kill()
                    failed = WorkerFailure(Status.RUNTIME_ERROR, f"the dataset's reference returned no valid {', '.join(bad)} ({what})")
                except ProtocolError as exc:
                    oracle.kill()
                    failed = WorkerFailure(Status.RUNTIME_ERROR, f"the dataset's reference: {exc} ({what})")
                except WorkerFailure as failure:
                    failed = WorkerFailure(failure.status, f"the dataset's reference failed: {failure.message}")
                self._oracle_failures[(case.id, seed)] = failed
            raise WorkerFailure(failed.status, failed.message)  # a fresh one: see WorkerHandle.ensure_started

        return expectation

    def run_case(self, case: Case, emit: Callable[[CaseRecord], None] = lambda r: None) -> list[CaseRecord]:
        """Every solution on ``case``; each record goes to ``emit`` as soon as it is finished. The
        peers run right after the reference (:func:`order_solutions`), so a solution's speedup
        over the best peer is final when it is emitted; a peer's own may still change when a later
        peer is faster, so the caller re-records the returned records once the case is done."""
        ctx = CaseContext(self.workload, case, self.options.device, self.options.settings.tolerance, self.clock)
        if self.oracle is not None:
            ctx.isolated_expectation = self._isolated_expectation(case, ctx)
        reference_ms: float | None = None
        records = []
        for solution in self.solutions:
            record = run_one(self.handles[solution.name], ctx, self.options)
            record.gpu = self.gpu
            if solution.name == REFERENCE_SOLUTION and record.passed and record.timing:
                reference_ms = record.timing.mean_ms
            if record.passed and record.timing and reference_ms:
                record.speedup = reference_ms / record.timing.mean_ms
            records.append(record)
            assign_peer_speedups(records, self.peers, self.options.speedup_over)
            emit(record)
        del ctx
        if self.options.device.type == "cuda":
            torch.cuda.empty_cache()
        return records

    @property
    def notes(self) -> dict[str, str]:
        return {name: h.notes for name, h in self.handles.items() if h.notes}

    @property
    def packages(self) -> dict[str, dict[str, str]]:
        return {name: h.packages for name, h in self.handles.items() if h.packages}

    @property
    def protections(self) -> dict[str, list[str]]:
        return {name: h.protections for name, h in self.handles.items() if h.protections}

    def _all_handles(self) -> list[WorkerHandle]:
        return [*self.handles.values(), *([self.oracle] if self.oracle is not None else [])]

    def stop(self) -> None:
        for handle in self._all_handles():
            with self.clock.phase("worker_stop", handle.solution.name):
                handle.stop()

    def kill(self) -> None:
        """End every worker now (from another thread: a stopping run's in-flight case)."""
        for handle in self._all_handles():
            handle.kill()


#: the name of the worker that computes a dataset definition's expectations (its logs and folders)
ORACLE_NAME = "dataset-reference-expectations"


def _reference_oracle(workload: Workload, options: RunOptions, gpu: int | None) -> WorkerHandle | None:
    """A worker that runs a dataset definition's own reference (its JSON source) to give the
    harness its expectations, for a definition whose reference must not run in the harness."""
    from dsa_bench.definitions.from_dataset import runs_untrusted_reference
    from dsa_bench.flashinfer_bench.dataset import reference_solution_folder
    from dsa_bench.solution import load_solution

    if not runs_untrusted_reference(workload.definition):
        return None
    solution = dataclasses.replace(load_solution(reference_solution_folder(workload.definition, options.cache_dir)), name=ORACLE_NAME)
    identity = worker_identities([solution], options, [], first_slot=isolation.WORKER_ID_COUNT // 2 + (gpu or 0))[ORACLE_NAME]
    return WorkerHandle(solution, workload.definition.name, options, identity)


def run_workload(
    workload: Workload,
    cases: list[Case],
    solutions: list[Solution],
    options: RunOptions,
    results: ResultsFile,
    on_record: Callable[[CaseRecord], None] = lambda r: None,
    identities: dict[str, isolation.WorkerIdentity] | None = None,
    clock: PhaseClock | None = None,
) -> list[CaseRecord]:
    """Run every solution on every case on one device; records reach ``results`` (with ``clock``'s
    wall-time breakdown so far) and ``on_record`` as they finish."""
    clock = clock or PhaseClock()
    runner = DeviceRunner(workload, solutions, options, identities or worker_identities(solutions, options, cases), clock=clock)
    records: list[CaseRecord] = []
    def emit(record: CaseRecord) -> None:
        records.append(record)
        breakdown = clock.breakdown()
        with clock.phase("results_writes", HARNESS):
            results.add(record, wall_breakdown=breakdown)
        on_record(record)

    try:
        for case in cases:
            results.refresh(runner.run_case(case, emit))  # the case's final peer speedups
    finally:
        runner.stop()
        # a resumed run keeps earlier sittings' notes
        results.update(
            solution_notes={**(results.header.solution_notes or {}), **runner.notes},
            solution_packages={**(results.header.solution_packages or {}), **runner.packages},
            worker_protections={**(results.header.worker_protections or {}), **runner.protections},
        )
    return records
