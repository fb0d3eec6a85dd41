"""A case as the harness holds it (CaseContext): its own input sets and expectations, the seeds,
decoding a worker's replies against the definition, and the plausibility of reported times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dsa_bench.definitions.base import Definition, InputRng, Tolerance
from dsa_bench.definitions.checks import judge
from dsa_bench.definitions.status import CheckResult
from dsa_bench.run.breakdown import PhaseClock
from dsa_bench.run.protocol import (
    CheckedCall,
    ProtocolError,
    TimingJob,
    TimingResult,
    rebuild,
)
from dsa_bench.workloads import Case, RunSettings, Workload, build_inputs, derive_seed

#: no correct kernel moves its bytes at more than this many times the measured copy bandwidth
FLOOR_BANDWIDTH_MARGIN = 2.0


@dataclass
class CaseContext:
    """The harness's own copies of a case's input sets, what the checker needs for each, and what
    it accepts from a worker (the definition's output and redrawn-input specs)."""

    workload: Workload
    case: Case
    device: torch.device
    tolerance: Tolerance
    clock: PhaseClock = field(default_factory=PhaseClock)  # charged with the harness's inputs and expectations
    #: where the expectation of an input set comes from when the definition's reference must not run
    #: in the harness (a dataset's own source): seed -> outputs, computed in an isolated worker
    isolated_expectation: Callable[[int], dict[str, Any]] | None = None
    _cache: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    _floors: dict[int, float] = field(default_factory=dict)
    _flops: dict[int, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        definition = self.workload.definition
        axes = definition.axes(self.case.axes)
        self.output_specs = {s.name: (s.dtype, s.concrete_shape(axes)) for s in definition.checked_outputs}
        redrawn = definition.redraw(axes, InputRng(0, torch.device("cpu")))  # which inputs a timed call redraws
        self.redraw_specs = {s.name: (s.dtype, s.concrete_shape(axes)) for s in definition.inputs if s.name in redrawn}

    def get(self, seed: int) -> tuple[Any, Any]:
        if seed not in self._cache:
            with self.clock.phase("harness_inputs"):
                inputs = build_inputs(self.workload.definition, self.case, seed, self.device)
            with self.clock.phase("expectations"):
                if self.isolated_expectation is not None:
                    expected = self.isolated_expectation(seed)
                else:
                    expected = self.workload.definition.expect(inputs)
                self._cache[seed] = (inputs, expected)
        return self._cache[seed]

    def check(self, seed: int, outputs: dict[str, Any], redrawn: dict[str, Any] | None = None) -> CheckResult:
        """Judge outputs made from input set ``seed``, with ``redrawn`` query values when a timed
        call replaced them (then the expectation is computed afresh)."""
        inputs, expected = self.get(seed)
        definition = self.workload.definition
        if redrawn:
            if self.isolated_expectation is not None:  # generic definitions redraw nothing (from_dataset.generic_definition)
                raise ProtocolError("the worker redrew inputs of a definition that redraws none")
            inputs = {**inputs, **{k: v.to(self.device) for k, v in redrawn.items()}}
            with self.clock.phase("expectations"):
                expected = definition.expect(inputs)
        axes = definition.axes(self.case.axes)
        return judge(definition, axes, inputs, outputs, expected, self.tolerance, self.device)

    def traffic_bytes(self, seed: int) -> int | None:
        """The bytes a correct kernel must move for input set ``seed`` (None: the definition has no
        such bound). Input sets built only for this are not kept."""
        definition: Definition = self.workload.definition
        bound = definition.min_traffic_bytes
        if bound is None:
            return None
        if seed not in self._floors:
            self._count_work(seed)
        return int(self._floors[seed])

    def useful_flops(self, seed: int) -> int | None:
        """The tensor-core FLOPs of a call on input set ``seed`` (None: the definition does not count them)."""
        if self.workload.definition.useful_flops is None:
            return None
        if seed not in self._flops:
            self._count_work(seed)
        return self._flops[seed]

    def _count_work(self, seed: int) -> None:
        """Both counts of input set ``seed`` from one build of its inputs."""
        definition: Definition = self.workload.definition
        with self.clock.phase("harness_inputs"):
            inputs = self._cache[seed][0] if seed in self._cache else build_inputs(definition, self.case, seed, self.device)
        axes = definition.axes(self.case.axes)
        if definition.min_traffic_bytes is not None:
            self._floors[seed] = definition.min_traffic_bytes(axes, inputs)
        self._flops[seed] = None if definition.useful_flops is None else int(definition.useful_flops(axes, inputs))


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


def sampled_iteration(job: TimingJob, trial: int) -> int:
    """Which timed call of ``trial`` the worker must send back for checking (the harness knows it too)."""
    return random.Random(derive_seed(job.sample_seed, "pick", trial)).randrange(job.iterations)


def decode_outputs(reply: Any, blob: bytes, ctx: CaseContext, count: int) -> list[dict[str, Any]]:
    sets = [rebuild(metas, _tensors(blob), f"{i}/", ctx.output_specs, extras_allowed=True) for i, metas in enumerate(reply.sets)]
    if len(sets) != count:
        raise ProtocolError(f"the worker sent {len(sets)} output sets for {count} input sets")
    return sets


def decode_timing(reply: Any, blob: bytes, ctx: CaseContext, job: TimingJob) -> TimingResult:
    """The timing reply, refused unless it has exactly the shape of the job it answers."""
    tensors = _tensors(blob)
    trials = len(job.trial_seeds)
    if len(reply.samples_ms) != trials or any(len(s) != job.iterations for s in reply.samples_ms):
        raise ProtocolError(f"the worker sent {[len(s) for s in reply.samples_ms]} samples per trial, expected {trials} x {job.iterations}")
    if len(reply.checked) != trials or len(reply.clocks) != trials:
        raise ProtocolError(
            f"the worker sent {len(reply.checked)} checked calls and {len(reply.clocks)} clock readings for {trials} trials"
        )
    checked = []
    for k, (call, seeds) in enumerate(zip(reply.checked, job.trial_seeds, strict=True)):
        iteration = sampled_iteration(job, k)
        if (call.trial, call.iteration, call.seed) != (k, iteration, seeds[iteration % len(seeds)]):
            raise ProtocolError(f"checked call {k} is trial {call.trial} call {call.iteration}, expected trial {k} call {iteration}")
        outputs = rebuild(call.outputs, tensors, f"checked{k}/out/", ctx.output_specs, extras_allowed=True)
        redrawn = rebuild(call.redrawn, tensors, f"checked{k}/redrawn/", ctx.redraw_specs, extras_allowed=False)
        checked.append(CheckedCall(call.trial, call.iteration, call.seed, redrawn, outputs))
    clocks = [c.model_dump() for c in reply.clocks]
    host = [list(s) for s in reply.host_samples_ms]
    if [len(s) for s in host] != [len(s) for s in reply.samples_ms]:
        raise ProtocolError(f"the worker sent {[len(s) for s in host]} host times per trial for {trials} x {job.iterations} timed calls")
    bad = next((x for s in host for x in s if not (math.isfinite(x) and x > 0)), None)
    if bad is not None:
        raise ProtocolError(f"a host wall time of {bad!r} ms is not a positive finite time")
    kernels = [dict(k) for k in reply.kernel_ms]  # names and times bounded by the reply's model
    if kernels and len(kernels) != trials:
        raise ProtocolError(f"the worker sent kernel times for {len(kernels)} trials, expected {trials}")
    return TimingResult(
        timer=reply.timer, samples_ms=[list(s) for s in reply.samples_ms], checked=checked, clocks=clocks, phase_s=dict(reply.phase_s),
        host_samples_ms=host, kernel_ms=kernels,
    )


def timed_work(ctx: CaseContext, job: TimingJob) -> tuple[float | None, float | None]:
    """(minimum bytes, useful FLOPs) per timed call of ``job``, averaged over its calls (trial t's call i
    runs on input set ``trial_seeds[t][i % n]``); None where the definition does not count them."""
    seeds = [s[i % len(s)] for s in job.trial_seeds for i in range(job.iterations)]
    if not seeds:
        return None, None
    traffic = [ctx.traffic_bytes(seed) for seed in seeds]
    flops = [ctx.useful_flops(seed) for seed in seeds]
    mean_bytes = None if any(t is None for t in traffic) else sum(t for t in traffic if t is not None) / len(seeds)
    mean_flops = None if any(f is None for f in flops) else sum(f for f in flops if f is not None) / len(seeds)
    return mean_bytes, mean_flops


def _tensors(blob: bytes) -> dict[str, torch.Tensor]:
    if not blob:
        return {}
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(blob)
    except SafetensorError as exc:
        raise ProtocolError(f"the worker's tensors are not a valid safetensors blob: {exc}") from None


def implausible_timing(timing: TimingResult, job: TimingJob, ctx: CaseContext, wall_s: float, copy_bytes_per_s: float | None) -> str | None:
    """Why these reported times cannot be true, or None. The harness's own observations bound
    them: every sample must be a positive finite time, all of them together cannot exceed the
    wall time the harness saw the job take, and no call can move the bytes its definition says
    a correct kernel must move faster than ``FLOOR_BANDWIDTH_MARGIN`` x the device's copy bandwidth."""
    flat = [x for s in timing.samples_ms for x in s]
    bad = next((x for x in flat if not (math.isfinite(x) and x > 0)), None)
    if bad is not None:
        return f"a reported time of {bad!r} ms is not a positive finite time"
    total_s = sum(flat) / 1e3
    if total_s > wall_s:
        return f"the timed calls add up to {total_s:.3f} s, more than the {wall_s:.3f} s the whole timing job took"
    if copy_bytes_per_s is None:
        return None
    for trial, (samples, seeds) in enumerate(zip(timing.samples_ms, job.trial_seeds, strict=True)):
        for i, sample in enumerate(samples):
            traffic = ctx.traffic_bytes(seeds[i % len(seeds)])
            if traffic is None:
                return None
            floor_ms = traffic / (FLOOR_BANDWIDTH_MARGIN * copy_bytes_per_s) * 1e3
            if sample < floor_ms:
                return (f"call {i} of trial {trial} reported {sample * 1e3:.3g} µs, but a correct kernel moves at least "
                        f"{traffic} bytes, which takes at least {floor_ms * 1e3:.3g} µs at {FLOOR_BANDWIDTH_MARGIN:g} x the "
                        f"measured copy bandwidth ({copy_bytes_per_s / 1e9:.0f} GB/s)")  # fmt: skip
    return None
