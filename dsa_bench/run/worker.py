"""The isolated solution process: ``python -m dsa_bench.run.worker IN_FD OUT_FD``.

Each solution runs in its own process, started by :mod:`dsa_bench.run.runner` in a session of its
own (and, when the harness runs as root, as an unprivileged user). The worker builds its inputs
itself from the case and seeds (the same generator the harness uses, so both sides hold
identical inputs), calls the solution, times it, and sends back only outputs and timings, as
frames of :mod:`dsa_bench.run.channel` whose headers :mod:`dsa_bench.run.protocol` validates on the
harness side. It never receives reference outputs, and nothing it sends is unpickled there.

The timer, the L2 flusher, the clock reader and (with ``--cuda-graph``) the side stream and torch's
CUDA graph functions are created, and the functions the timing path calls are bound, *before* the
solution is imported: a solution that later patches the timer class, the CUPTI module,
``torch.cuda.Event``, the flush or ``time.perf_counter`` changes names nobody looks up again. (Code
in this process can still reach those objects through ``gc`` or ``ctypes``; the harness therefore
checks every reported time against a physical floor itself.)

Protocol (frames)::

    harness -> worker  {"config": WorkerConfig fields}, then {"request": "outputs" | "time" | "stop"} + pickled job
    worker -> harness  ready | compile_error | unavailable, then per request outputs | timing | error (protocol.Reply)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import pickle
import random
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_bench.run import channel
from dsa_bench.run.guard import install as install_guard
from dsa_bench.run.sandbox import PARENT_ENV, PROTECTIONS_ENV

if TYPE_CHECKING:
    from dsa_bench.run.protocol import CorrectnessJob, TimingJob, WorkerConfig

#: the harness's jobs are small (a case and its seeds); its pickles never come near this
_MAX_JOB_BYTES = 512 * 2**20
_PR_SET_PDEATHSIG = 1
#: the worker's own clock for its phase records, bound before any solution can patch ``time``
_now = time.perf_counter
_now_ns = time.perf_counter_ns  # the host wall time of timed calls, bound likewise


#: the case's message when run --cuda-graph cannot capture the solution's call (reported as a RUNTIME_ERROR)
CAPTURE_FAILURE = ("--cuda-graph: the call could not be captured in a CUDA graph ({error}); the solution must not synchronize "
                   "with the host inside a call, or run without --cuda-graph")  # fmt: skip


class GraphCaptureFailed(Exception):
    """The solution's call could not be captured (run --cuda-graph); its text is the case's whole message."""


@dataclasses.dataclass(frozen=True)
class GraphMode:
    """What run --cuda-graph times with, bound before the solution is imported (as the timer is): the
    side stream every trial runs on, and torch's graph class, capture, replay and pool functions."""

    stream: Any  # torch.cuda.Stream, one for the worker's lifetime
    on_stream: Callable[[Any], Any]  # torch.cuda.stream
    new_graph: Callable[[], Any]  # torch.cuda.CUDAGraph
    capture: Callable[..., Any]  # torch.cuda.graph
    replay: Callable[[Any], Any]  # torch.cuda.CUDAGraph.replay
    new_pool: Callable[[], Any]  # torch.cuda.graph_pool_handle

    @classmethod
    def bind(cls, device: Any) -> GraphMode:
        import torch

        graph = torch.cuda.CUDAGraph
        return cls(torch.cuda.Stream(device), torch.cuda.stream, graph, torch.cuda.graph, graph.replay, torch.cuda.graph_pool_handle)


def capture_error(exc: BaseException) -> str:
    """The first line of what made a capture fail: the innermost exception of the chain (a failed call
    inside the capture, then the capture's own end failing because of it, reads as the call's error)."""
    seen = {id(exc)}
    while (inner := exc.__cause__ or exc.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        exc = inner
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


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
    # a wrong count is left to the harness's checker, which names any missing output
    return dict(zip(names, result, strict=False))


def _die_with_the_harness(parent: int) -> None:
    """End this process (and its process group) when its parent is gone, even by SIGKILL. The
    parent is the launcher the harness started, or in a PID namespace of its own that namespace's
    init (pid 1); either ends with the harness (:mod:`dsa_bench.run.sandbox`)."""
    try:  # the kernel's own notice; survives a solution that blocks the interpreter
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the harness died before the notice was set
        os._exit(1)
    sleep, getppid, killpg = time.sleep, os.getppid, os.killpg  # bound now: the solution may patch the modules

    def watch() -> None:  # also takes down what the solution started in this process group
        while getppid() == parent:
            sleep(0.5)
        killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="harness-watch", daemon=True).start()


def _tensors_blob(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save(tensors) if tensors else b""


class _Reply:
    """Encodes outputs for the harness: a JSON description of every value, bytes for the tensors
    whose dtype and shape are the definition's."""

    def __init__(self, specs: Mapping[str, tuple[Any, tuple[int, ...]]]) -> None:
        self.specs = specs
        self.tensors: dict[str, Any] = {}

    def values(
        self, values: Mapping[str, Any], prefix: str, specs: Mapping[str, tuple[Any, tuple[int, ...]]] | None = None
    ) -> dict[str, Any]:
        from dsa_bench.run.protocol import describe

        specs = self.specs if specs is None else specs
        metas = {}
        for name, value in values.items():
            want = specs.get(name, (None, None))
            metas[str(name)], tensor = describe(value, *want)
            if tensor is not None:
                self.tensors[f"{prefix}{name}"] = tensor
        return metas

    def blob(self) -> bytes:
        return _tensors_blob(self.tensors)


def main(argv: list[str]) -> None:
    """Worker entry point (a fresh interpreter started by the harness)."""
    in_fd, out_fd = int(argv[0]), int(argv[1])
    os.set_inheritable(in_fd, False)  # nothing the solution starts may write to the harness
    os.set_inheritable(out_fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's to handle
    header, _ = channel.read_frame(in_fd, 0)
    protections = [p for p in os.environ.get(PROTECTIONS_ENV, "").split("; ") if p]
    _die_with_the_harness(int(os.environ.get(PARENT_ENV) or header["config"]["harness_pid"]))
    sys.dont_write_bytecode = True  # the solution folder may not be writable by this user

    import torch

    from dsa_bench.run.protocol import WorkerConfig

    config = WorkerConfig(**header["config"])

    from dsa_bench.definitions import get_definition
    from dsa_bench.run.loader import import_entry
    from dsa_bench.run.requirements import unmet, versions
    from dsa_bench.solution import load_solution

    guard = None
    device = torch.device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.dataset_root is not None:  # dataset definitions are registered per process
        from dsa_bench.definitions.from_dataset import register_dataset_definition

        register_dataset_definition(Path(config.dataset_root), config.definition)
    definition = get_definition(config.definition)
    try:
        measure = _bind_measurement(config, device)  # before any solution code runs
        guard = install_guard(config.writable, config.solution_path, builds=config.writable[:2])  # torch extensions, Triton cache
        protections.append("audit hook: no programs but compilers, no network, no foreign libraries, no writes outside its folders")
        solution = load_solution(Path(config.solution_path))
        if config.packed_from is not None:
            solution = dataclasses.replace(solution, packed_from=Path(config.packed_from))
        entry = solution.entry_for(config.definition)
        unmet_reason = entry.unsupported or unmet(solution.requires, device)
        if unmet_reason is not None:  # an entry it cannot run, a peer whose package or GPU this machine lacks: skipped, not failed
            channel.write_frame(out_fd, {"type": "unavailable", "text": unmet_reason})
            return
        fn, module = import_entry(solution, config.definition)
        notes_fn = getattr(module, "solution_notes", None)
    except BaseException:
        if guard is not None and guard.refused:
            channel.write_frame(out_fd, {"type": "refused", "text": _refusals(guard.refused)})
        else:
            channel.write_frame(out_fd, {"type": "compile_error", "text": traceback.format_exc()[-200_000:]})
        return
    if guard is not None and guard.refused:  # refused while importing, and the solution caught the error
        channel.write_frame(out_fd, {"type": "refused", "text": _refusals(guard.refused)})
        return

    def notes() -> str:  # asked again after every job: a solution may report what it fell back to
        try:
            return str(notes_fn())[:100_000] if callable(notes_fn) else ""
        except Exception as exc:
            return f"solution_notes() raised {type(exc).__name__}"

    channel.write_frame(out_fd, {"type": "ready", "notes": notes(), "packages": versions(solution.requires), "protections": protections})
    runner = _CaseRunner(definition, device, fn, entry.destination_passing_style)
    while True:
        header, blob = channel.read_frame(in_fd, _MAX_JOB_BYTES)
        if header.get("request") == "stop":
            return
        refused_before = len(guard.refused) if guard is not None else 0
        try:
            job = pickle.loads(blob)
            if header.get("request") == "outputs":
                reply, tensors = runner.outputs(job)
            else:
                reply, tensors = runner.time(job, *measure)
        except GraphCaptureFailed as failed:  # a plain message; the harness restarts the worker after any error
            reply, tensors = {"type": "error", "text": str(failed)}, b""
        except BaseException:
            reply, tensors = {"type": "error", "text": traceback.format_exc()[-200_000:]}, b""
        if guard is not None and len(guard.refused) > refused_before:  # even when the solution caught the error and answered
            reply, tensors = {"type": "error", "text": _refusals(guard.refused[refused_before:])}, b""
        channel.write_frame(out_fd, {**reply, "notes": notes()}, tensors)


def _refusals(refused: list[str]) -> str:
    """The refusals as the case's message: the first ones, named."""
    shown = "; ".join(dict.fromkeys(refused[:5]))
    more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
    return f"refused by dsa-bench's worker guard: {shown}{more}"[:100_000]


def kernel_medians_ms(per_call_ms: dict[str, list[float]]) -> dict[str, float]:
    """Per GPU activity name, the median over a trial's calls of the ms it ran in one call; the
    names after the :data:`MAX_KERNEL_NAMES` busiest are summed as ``[other]``, and each name is
    cut to 200 characters (names come from the solution's code)."""
    from dsa_bench.run.protocol import MAX_KERNEL_NAMES

    medians = sorted(((statistics.median(ms), name[:200]) for name, ms in per_call_ms.items()), reverse=True)
    kept = {name: ms for ms, name in medians[:MAX_KERNEL_NAMES]}
    rest = sum(ms for ms, _ in medians[MAX_KERNEL_NAMES:])
    return {**kept, "[other]": rest} if rest else kept


def _bind_measurement(config: WorkerConfig, device: Any) -> tuple[Any, Any, Any, str | None, Any, GraphMode | None]:
    """(time_iterations, flush, read_clocks, timer name, kernel_times or None, GraphMode or None): bound
    methods taken before the solution is imported, so later patches of their classes or modules do not
    reach the timing path."""
    if config.timer is None:
        return None, None, None, None, None, None
    import torch

    from dsa_bench.timing import make_timer
    from dsa_bench.timing.clocks import ClockReader
    from dsa_bench.timing.flush import L2Flusher

    timer = make_timer(config.timer)
    flusher = L2Flusher(device, config.l2_flush)
    clocks = ClockReader(device.index if device.index is not None else torch.cuda.current_device())
    graph = GraphMode.bind(device) if config.cuda_graph else None
    return timer.time_iterations, flusher.flush, clocks.read, timer.name, getattr(timer, "kernel_times", None), graph


class _CaseRunner:
    def __init__(self, definition: Any, device: Any, fn: Callable[..., Any], dps: bool) -> None:
        import torch

        self.definition = definition
        self.device = device
        self.fn = fn
        self.dps = dps
        self.names = [spec.name for spec in definition.outputs]
        self._synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda device=None: None)

    def _sync(self) -> None:
        self._synchronize(self.device)

    def _inputs(self, case: Any, seed: int) -> Any:
        from dsa_bench.workloads import build_inputs

        return build_inputs(self.definition, case, seed, self.device)

    def _output_specs(self, case: Any) -> dict[str, tuple[Any, tuple[int, ...]]]:
        axes = self.definition.axes(case.axes)
        return {s.name: (s.dtype, s.concrete_shape(axes)) for s in self.definition.checked_outputs}

    def _input_specs(self, case: Any) -> dict[str, tuple[Any, tuple[int, ...]]]:
        axes = self.definition.axes(case.axes)
        return {s.name: (s.dtype, s.concrete_shape(axes)) for s in self.definition.inputs if not s.is_scalar}

    def outputs(self, job: CorrectnessJob) -> tuple[dict[str, Any], bytes]:
        axes = self.definition.axes(job.case.axes)
        reply = _Reply(self._output_specs(job.case))
        sets = []
        phases = {"build_inputs": 0.0, "calls": 0.0, "encode": 0.0}  # the harness's wall-time breakdown
        for i, seed in enumerate(job.seeds):
            started = _now()
            inputs = self._inputs(job.case, seed)
            outs = self.definition.allocate_outputs(axes, self.device)
            self._sync()
            called = _now()
            got = call_solution(self.fn, self.dps, self.definition.input_args(inputs), outs, self.names)
            self._sync()
            got.update(self.definition.observed_values(inputs))
            encoded = _now()
            sets.append(reply.values(got, f"{i}/"))
            phases["build_inputs"] += called - started
            phases["calls"] += encoded - called
            phases["encode"] += _now() - encoded
            del inputs, outs, got
        encoded = _now()
        blob = reply.blob()
        phases["encode"] += _now() - encoded
        return {"type": "outputs", "sets": sets, "phase_s": phases}, blob

    def time(self, job: TimingJob, time_iterations: Any, flush: Any, read_clocks: Any, timer_name: str | None,
             kernel_times: Any = None, graph: GraphMode | None = None) -> tuple[dict[str, Any], bytes]:  # fmt: skip
        """Time the solution: per trial, fresh input sets rotating call by call, queries redrawn,
        outputs re-poisoned and L2 flushed before every call (all untimed). With ``graph`` (run
        --cuda-graph) each trial runs on its side stream and the timed calls are graph replays."""
        if time_iterations is None:
            raise RuntimeError("this worker was started without a timer")
        reply = _Reply(self._output_specs(job.case))
        header: dict[str, Any] = {"type": "timing", "timer": timer_name, "samples_ms": [], "clocks": [], "checked": [],
                                  "phase_s": {"build_inputs": 0.0, "warmup": 0.0, "timed_calls": 0.0, "encode": 0.0},
                                  "host_samples_ms": [], "kernel_ms": []}  # fmt: skip
        for trial, seeds in enumerate(job.trial_seeds):  # each trial's input sets die with it
            with graph.on_stream(graph.stream) if graph is not None else contextlib.nullcontext():
                self._time_trial(job, trial, seeds, time_iterations, flush, read_clocks, header, reply, graph)
            if kernel_times is not None:
                header["kernel_ms"].append(kernel_medians_ms(kernel_times()))
        encoded = _now()
        blob = reply.blob()
        header["phase_s"]["encode"] += _now() - encoded
        return header, blob

    def _time_trial(self, job: TimingJob, trial: int, seeds: tuple[int, ...], time_iterations: Any, flush: Any, read_clocks: Any,
                    header: dict[str, Any], reply: _Reply, graph: GraphMode | None = None) -> None:  # fmt: skip
        from dsa_bench.definitions.base import InputRng
        from dsa_bench.workloads import derive_seed, random_params

        axes = self.definition.axes(job.case.axes)
        phases = header["phase_s"]
        n = len(seeds)
        started = _now()
        sets = [self._inputs(job.case, s) for s in seeds]
        args = [self.definition.input_args(x) for x in sets]
        outs = [self.definition.allocate_outputs(axes, self.device) for _ in seeds]
        redraw_rng = InputRng(derive_seed(job.sample_seed, "redraw", trial), self.device)
        params = random_params(job.case)
        sampled = random.Random(derive_seed(job.sample_seed, "pick", trial)).randrange(job.iterations)
        latest: dict[int, dict[str, Any]] = {}
        redrawn: dict[str, Any] = {}
        captured: dict[str, Any] = {}
        timed = False
        # The host's wall time of each timed call: from just before the solution is called to the first
        # thing after the timer's synchronisation that ends the call (``after``). It holds the launches,
        # whatever the solution does on the host, the device's work and the synchronisation; not the
        # flush or the re-poisoning (``prepare``), which run before it.
        host_ms: list[float] = []
        call_started = [0]
        graphs: list[Any] = []  # with --cuda-graph, once captured after the warm-up: one graph per input set

        def prepare(i: int) -> None:
            fresh = self.definition.redraw_inputs(axes, redraw_rng, params)
            for name, value in fresh.items():
                sets[i % n][name].copy_(value)  # in place: the solution keeps the same tensors
            if timed and i == sampled:
                redrawn.update({k: v.detach().clone() for k, v in fresh.items()})
            self.definition.poison_outputs(outs[i % n])
            flush()

        def call(i: int) -> None:
            call_started[0] = _now_ns()
            if graphs:
                assert graph is not None
                graph.replay(graphs[i % n])  # rewrites latest[i % n], the outputs its capture returned
            else:
                latest[i % n] = call_solution(self.fn, self.dps, args[i % n], outs[i % n], self.names)

        def after(i: int) -> None:
            if timed:
                host_ms.append((_now_ns() - call_started[0]) / 1e6)
            if i == sampled:
                captured.update({k: (v.detach().clone() if hasattr(v, "detach") else v) for k, v in latest[i % n].items()})
                captured.update(self.definition.observed_values(sets[i % n]))  # what the call left in its inputs

        self._sync()
        warmup_start = _now()
        phases["build_inputs"] += warmup_start - started
        # with --cuda-graph, every input set is called eagerly before its capture (lazy set-up, compiling
        # and autotuning cannot happen inside one)
        for i in range(job.warmup if graph is None else max(job.warmup, n)):
            prepare(i)
            call(i)
        self._sync()
        if graph is not None:  # its time counts as warm-up
            graphs += self._capture(graph, args, outs, latest)
        timed_start = _now()
        phases["warmup"] += timed_start - warmup_start
        before = read_clocks()
        timed = True
        header["samples_ms"].append([float(x) for x in time_iterations(call, job.iterations, prepare, after)])
        phases["timed_calls"] += _now() - timed_start
        header["host_samples_ms"].append(host_ms)
        header["clocks"].append({"after_warmup": before, "after_timing": read_clocks()})
        k = len(header["checked"])
        encoded = _now()
        header["checked"].append({
            "trial": trial, "iteration": sampled, "seed": seeds[sampled % n],
            "outputs": reply.values(captured, f"checked{k}/out/"),
            "redrawn": reply.values(redrawn, f"checked{k}/redrawn/", self._input_specs(job.case)),
        })  # fmt: skip
        phases["encode"] += _now() - encoded

    def _capture(self, graph: GraphMode, args: list[list[Any]], outs: list[dict[str, Any]], latest: dict[int, dict[str, Any]]) -> list[Any]:
        """One CUDA graph per input set of exactly the solution's call, in one memory pool for the trial;
        ``latest[j]`` becomes what the capture returned (a non-DPS solution's outputs then live in the
        pool, and every replay rewrites them). A failure is the case's, with a plain message."""
        pool = graph.new_pool()
        graphs = []
        for j in range(len(args)):
            captured = graph.new_graph()
            try:
                with graph.capture(captured, pool=pool, stream=graph.stream):
                    latest[j] = call_solution(self.fn, self.dps, args[j], outs[j], self.names)
            except Exception as exc:
                raise GraphCaptureFailed(CAPTURE_FAILURE.format(error=capture_error(exc))) from None
            graphs.append(captured)
        self._sync()
        for captured in graphs:  # an instantiated graph's first launch uploads it: not in a timed call
            graph.replay(captured)
        self._sync()
        return graphs


if __name__ == "__main__":
    main(sys.argv[1:])
