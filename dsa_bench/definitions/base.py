"""The shape of a kernel definition: axes, typed inputs and outputs, and its small functions.

A definition is data plus four functions (reference, input generator, trace validator,
checker). The runner only ever talks to this interface, so a new definition slots in by
registering one more :class:`Definition` in :mod:`dsa_bench.definitions`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dsa_bench.definitions.status import CheckResult

#: dtype names used in specs and trace files, mapped to torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


#: Poison used to pre-fill integer outputs: no valid index or padding value can equal it.
INT_POISON = -(2**31)


Value = Any  # a torch.Tensor, or a Python float for scalar inputs


@dataclass(frozen=True)
class Tolerance:
    """Numerical tolerances. An element fails only when |diff| > atol AND |diff| > rtol·|ref|.

    ``lse_atol`` is the absolute tolerance of log-sum-exp outputs: an lse element fails when
    |diff| > lse_atol, with no relative part (|lse| is about 20 on a full row, so any relative
    allowance would hide a softmax denominator several percent off). The default sits between
    the worst error of correct kernels (2.1e-5 at the contest's sm_scale, 1.7e-4 with logits
    seven times larger; benchmarks/lse_error.log) and the 7.0e-4 of leaving out one of 2048
    equal-weight slots.

    ``score_rtol`` sets the top-k tie tolerance of index outputs to a fixed fraction of the row's
    largest absolute score (a selected token may score that much below the k-th best). None, the
    default, uses the definition's own per-row bound, derived from the rounding errors of a
    correct FP8 kernel (``indexer.tie_tolerances``).
    """

    atol: float = 1e-2
    rtol: float = 1e-2
    lse_atol: float = 2.5e-4
    score_rtol: float | None = None


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: axis names for its shape (empty for a scalar) and a dtype."""

    name: str
    shape: tuple[str, ...]
    dtype: torch.dtype
    description: str = ""
    #: an output's pre-fill instead of the dtype's default poison (see :func:`poison_`); a byte-exact
    #: output such as a KV cache backing names the byte every untouched element must keep
    poison: float | None = None

    @property
    def is_scalar(self) -> bool:
        return not self.shape

    def concrete_shape(self, axes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(axes[a]) for a in self.shape)


class InputRng:
    """Seeded randomness for one input set.

    ``structure`` (NumPy, host) draws small structural choices such as seq_lens and page
    allocation; ``values`` (a torch generator on the target device) draws the bulk tensors so
    generation stays fast on a GPU. Two processes with the same seed and device get the same
    inputs, which lets the harness and the isolated solution worker build identical sets.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed
        self.device = device
        self.structure = np.random.default_rng(seed)
        self.values = torch.Generator(device=device)
        self.values.manual_seed(seed)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(shape, generator=self.values, device=self.device, dtype=dtype)


# Signatures of a definition's functions.
ReferenceFn = Callable[..., dict[str, torch.Tensor]]


GenerateFn = Callable[
    [Mapping[str, int], Mapping[str, Value], Mapping[str, dict], InputRng], dict[str, Value]
]


RedrawFn = Callable[..., dict[str, torch.Tensor]]  # (axes, rng), or (axes, rng, params): redraw_takes_params


ValidateFn = Callable[[Mapping[str, int], Mapping[str, Value], Mapping[str, dict]], list[str]]


ExpectFn = Callable[[Mapping[str, Value]], Any]


CheckFn = Callable[[Mapping[str, Value], Mapping[str, torch.Tensor], Any, Tolerance], CheckResult]


MinTrafficFn = Callable[[Mapping[str, int], Mapping[str, Value]], int]


UsefulFlopsFn = Callable[[Mapping[str, int], Mapping[str, Value]], int]


#: the tensor-core precisions a definition's math can run in (``Definition.math_precision``); the
#: roofline takes the device's dense peak of that precision (dsa_bench.results.roofline)
MATH_PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True)
class Definition:
    """A kernel contract.

    ``reference(**inputs)`` returns the expected outputs; ``generate(axes, given, params, rng)``
    fills in every input the trace did not give explicitly; ``validate(axes, given, params)``
    lists problems of a trace case; ``redraw(axes, rng)`` draws fresh values for the inputs
    that are cheap to replace (the queries), which timing does before every timed call so a
    solution can never return a cached result; ``expect(inputs)`` computes, once per input set, whatever
    the checker compares against (reference outputs, or reference scores); and
    ``check(inputs, outputs, expected, tol)`` judges outputs whose shapes and dtypes already
    match the specs. Solutions are called in destination-passing style:
    ``kernel(*inputs, *outputs)`` in spec order. ``min_traffic_bytes(axes, inputs)``, where a
    definition has it, is a lower bound on the bytes any correct kernel moves between DRAM and
    the chip for one call on these inputs (the distinct bytes it must read plus those it must
    write), for judging whether a measured time is physically possible.
    ``useful_flops(axes, inputs)``, where a definition has it, counts the tensor-core FLOPs of
    the call's matrix products on these inputs (2 per multiply-add, only over entries the
    contract makes a kernel compute: padding, passthrough rows and the like count 0), and
    ``math_precision`` names the precision those products run in on a tensor core (one of
    ``MATH_PRECISIONS``; None for a definition that does no matrix math). Together with
    ``min_traffic_bytes`` they place a measured time on the device's roofline (docs/roofline.md).
    """

    name: str
    description: str
    const_axes: Mapping[str, int]
    var_axes: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    reference: ReferenceFn
    generate: GenerateFn
    validate: ValidateFn
    redraw: RedrawFn
    expect: ExpectFn
    check: CheckFn
    #: axes shown in result tables, most telling first
    key_axes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    min_traffic_bytes: MinTrafficFn | None = None
    useful_flops: UsefulFlopsFn | None = None
    math_precision: str | None = None
    #: outputs nobody passes to the solution: what a call left in inputs it updates in place (a KV cache a
    #: decode step writes), read back by ``observe(inputs)`` after the call, outside any timed span, and
    #: judged like outputs (shape, dtype, then ``check``)
    observed: tuple[TensorSpec, ...] = ()
    observe: Callable[[Mapping[str, Value]], dict[str, torch.Tensor]] | None = None
    #: this definition's own tolerance defaults, for every tolerance a workload's settings leave out
    #: (None: Tolerance's); the decode's lse is a natural log and has its own derived lse_atol
    tolerance: Tolerance | None = None
    #: ``redraw`` takes the case's generator parameters as a third argument, so the values a timed
    #: call redraws follow the case's distribution (e.g. the indexer's scaled head weights)
    redraw_takes_params: bool = False
    #: the Tolerance fields its check reads (the others cannot change a status of this definition)
    tolerance_fields: tuple[str, ...] = ("atol", "rtol", "lse_atol", "score_rtol")
    #: why ``reference`` cannot be captured in a CUDA graph (it synchronises with the host), or None: a run
    #: with --cuda-graph then checks the reference's outputs but does not time it
    reference_uncapturable: str | None = None

    @property
    def checked_outputs(self) -> tuple[TensorSpec, ...]:
        """The outputs the harness judges: the solution's, then the observed ones."""
        return (*self.outputs, *self.observed)

    def observed_values(self, inputs: Mapping[str, Value]) -> dict[str, torch.Tensor]:
        """``observe(inputs)`` after a call (nothing for a definition without observed outputs)."""
        return self.observe(inputs) if self.observe is not None else {}

    def axes(self, var_values: Mapping[str, int]) -> dict[str, int]:
        return {**self.const_axes, **var_values}

    def allocate_outputs(self, axes: Mapping[str, int], device: torch.device) -> dict[str, torch.Tensor]:
        """Outputs pre-filled with poison (NaN, INT32_MIN for integers, or the spec's own ``poison``)
        so unwritten elements fail."""
        outputs = {}
        for spec in self.outputs:
            out = torch.empty(spec.concrete_shape(axes), dtype=spec.dtype, device=device)
            poison_(out, spec.poison)
            outputs[spec.name] = out
        return outputs

    def poison_outputs(self, outputs: Mapping[str, torch.Tensor]) -> None:
        """Re-fill allocated outputs with their poison (before every timed call)."""
        for spec in self.outputs:
            poison_(outputs[spec.name], spec.poison)

    def redraw_inputs(self, axes: Mapping[str, int], rng: InputRng, params: Mapping[str, dict]) -> dict[str, torch.Tensor]:
        """``redraw``, with the case's generator ``params`` where the definition's redraw takes them."""
        return self.redraw(axes, rng, params) if self.redraw_takes_params else self.redraw(axes, rng)

    def input_args(self, inputs: Mapping[str, Value]) -> list[Value]:
        return [inputs[spec.name] for spec in self.inputs]


def poison_(out: torch.Tensor, value: float | None = None) -> None:
    """Fill an output buffer with a value no correct kernel writes there: ``value`` where the spec
    names one, else NaN for floats and INT32_MIN for integers."""
    if value is None:
        value = math.nan if out.dtype.is_floating_point else INT_POISON
    out.fill_(value)


def unknown_params(params: Mapping[str, Mapping[str, Any]], known: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Problems with generator parameters no generator reads. ``known`` maps an input name to
    the parameters its generator takes; inputs it does not name take none."""
    problems = []
    for name, given in params.items():
        takes = known.get(name, ())
        for key in given:
            if key not in takes:
                accepted = f"its parameters are {', '.join(takes)}" if takes else "its generator takes none"
                problems.append(f"{name}.params.{key} is not a generator parameter ({accepted})")
    return problems


def is_integer(value: Any) -> bool:
    """An integer in a trace: a JSON integer, not a boolean or a float (nor NaN or infinity)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A number in a trace or settings file that is finite as a float (not a boolean, NaN,
    infinity, or an integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def integer_param(params: Mapping[str, Any], label: str, key: str, default: int | None, problems: list[str]) -> int | None:
    """``params[key]``, or ``default`` when absent; anything but an integer adds a problem and gives None."""
    if key not in params:
        return default
    value = params[key]
    if not is_integer(value):
        problems.append(f"{label}.params.{key} = {value!r} must be an integer")
        return None
    return value
