"""What the harness and a worker say to each other: jobs one way, validated replies the other.

The harness sends a :class:`WorkerConfig` once and then :class:`CorrectnessJob` or
:class:`TimingJob` requests (pickled: the worker trusts the harness). The worker answers with
JSON headers that the models below validate strictly (unknown fields, wrong types and
out-of-range values are refused), and with tensors in one safetensors blob. Tensors are only
accepted where the definition expects them and only with the dtype and shape the header
declared; an output of the wrong shape or dtype travels as its description alone (a ``meta``
tensor on the harness side), so the checker still reports INCORRECT_SHAPE or INCORRECT_DTYPE
without the harness ever holding more bytes than the definition's outputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dsa_bench.workloads import Case

# --------------------------------------------------------------------------- harness -> worker


@dataclass(frozen=True)
class WorkerConfig:
    solution_path: str
    definition: str
    device: str  # "cpu" or "cuda:N"
    timer: str | None  # "cupti" | "cupti_api" | "events" | None (no timing on this device)
    l2_flush: str  # timing.L2_FLUSH_MODES
    extensions_dir: str
    harness_pid: int  # the worker ends itself when its parent is no longer this process
    dataset_root: str | None = None  # a flashinfer-bench dataset whose definition this run uses
    packed_from: str | None = None  # the packed Solution JSON the solution folder was laid out from (Solution.packed_from)
    #: time graph replays: the worker captures each input set's call in a CUDA graph after the warm-up (run --cuda-graph)
    cuda_graph: bool = False
    #: the folders the worker may write below: its build (torch extensions), Triton cache, home and scratch folders, in this order
    writable: tuple[str, ...] = ()


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


# --------------------------------------------------------------------------- worker -> harness, decoded


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
    host_samples_ms: list[list[float]] = field(default_factory=list)  # per trial, each timed call's host wall time
    kernel_ms: list[dict[str, float]] = field(default_factory=list)  # per trial, each GPU activity name's median ms per call


# --------------------------------------------------------------------------- the JSON headers

#: every dtype a worker may name (torch's own names)
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: value for name in dir(torch) if isinstance(value := getattr(torch, name), torch.dtype)
}
_MAX_TEXT = 256 * 1024
#: at most this many GPU activity names are reported per trial (the worker sums the rest as "[other]")
MAX_KERNEL_NAMES = 24


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TensorMeta(_Strict):
    kind: Literal["tensor"]
    dtype: str
    shape: list[Annotated[int, Field(ge=0, le=2**40)]] = Field(max_length=16)
    in_blob: bool  # its bytes travel in the blob (only when dtype and shape are the definition's)


class OtherMeta(_Strict):
    kind: Literal["other"]
    type_name: str = Field(max_length=200)


ValueMeta = Annotated[TensorMeta | OtherMeta, Field(discriminator="kind")]
Text = Annotated[str, Field(max_length=_MAX_TEXT)]


class Ready(_Strict):
    type: Literal["ready"]
    notes: Text
    #: installed versions of the distributions the solution's manifest requires
    packages: dict[Annotated[str, Field(max_length=200)], Annotated[str, Field(max_length=200)]] = Field(default={}, max_length=64)
    #: what walls the worker stands in (dsa_bench.run.sandbox and the audit hook of dsa_bench.run.guard)
    protections: list[Annotated[str, Field(max_length=1000)]] = Field(default=[], max_length=32)


class RefusedAtImport(_Strict):
    """The worker's guard refused something the solution did while it was imported: every case fails."""

    type: Literal["refused"]
    text: Text


class Unavailable(_Strict):
    """The solution's ``requires`` are not met in the worker: every case is SKIPPED with this reason."""

    type: Literal["unavailable"]
    text: Text


class CompileError(_Strict):
    type: Literal["compile_error"]
    text: Text


class Failure(_Strict):
    type: Literal["error"]
    text: Text
    notes: Text


class Outputs(_Strict):
    type: Literal["outputs"]
    notes: Text
    sets: list[dict[str, ValueMeta]] = Field(max_length=1024)
    phase_s: dict[str, float] = Field(default_factory=dict, max_length=16)  # worker wall time per phase (a diagnostic)


class Clocks(_Strict):
    sm_mhz: int
    mem_mhz: int


class TrialClocks(_Strict):
    after_warmup: Clocks | None
    after_timing: Clocks | None


class CheckedCallMeta(_Strict):
    trial: Annotated[int, Field(ge=0)]
    iteration: Annotated[int, Field(ge=0)]
    seed: Annotated[int, Field(ge=0)]
    outputs: dict[str, ValueMeta]
    redrawn: dict[str, ValueMeta]


class Timing(_Strict):
    type: Literal["timing"]
    notes: Text
    timer: Literal["cupti", "cupti_api", "cuda_events", "host_clock"]
    samples_ms: list[list[float]]
    clocks: list[TrialClocks]
    phase_s: dict[str, float]
    checked: list[CheckedCallMeta]
    #: per trial, the host's wall time of each timed call (from before the call to after its synchronisation)
    host_samples_ms: list[list[float]] = []
    #: per trial, per GPU activity name (kernel, [memcpy], [memset]), the median ms it ran in one timed call (CUPTI only)
    kernel_ms: list[
        Annotated[dict[Annotated[str, Field(max_length=200)], Annotated[float, Field(ge=0, allow_inf_nan=False)]],
                  Field(max_length=MAX_KERNEL_NAMES + 1)]  # the busiest names and "[other]"
    ] = Field(default=[], max_length=64)  # fmt: skip


Reply = Annotated[Ready | RefusedAtImport | CompileError | Unavailable | Failure | Outputs | Timing, Field(discriminator="type")]
_REPLY = TypeAdapter(Reply)


class ProtocolError(Exception):
    """A worker's reply that the harness refuses: the case fails, the worker is restarted."""


def parse_reply(header: Any, expected: tuple[str, ...]) -> Any:
    """The validated reply model; ``expected`` names the reply types allowed at this point."""
    try:
        reply = _REPLY.validate_python(header)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(f"malformed reply from the worker: {where}: {first['msg']}") from None
    if reply.type not in expected:
        raise ProtocolError(f"the worker replied {reply.type!r} where {' or '.join(expected)} was expected")
    return reply


# --------------------------------------------------------------------------- tensors, both sides


def describe(value: Any, want_dtype: torch.dtype | None, want_shape: tuple[int, ...] | None) -> tuple[dict[str, Any], torch.Tensor | None]:
    """(header entry, tensor to put in the blob or None) for one value the solution produced."""
    if not isinstance(value, torch.Tensor):
        return {"kind": "other", "type_name": type(value).__name__[:200]}, None
    dtype_name = str(value.dtype).removeprefix("torch.")
    fits = value.dtype == want_dtype and tuple(value.shape) == want_shape
    meta = {"kind": "tensor", "dtype": dtype_name, "shape": list(value.shape), "in_blob": fits}
    return meta, (value.detach().to("cpu").contiguous().clone() if fits else None)


def value_bytes(specs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> int:
    return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for dtype, shape in specs.values())


def rebuild(
    metas: Mapping[str, TensorMeta | OtherMeta],
    blob: Mapping[str, torch.Tensor],
    prefix: str,
    specs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    extras_allowed: bool,
) -> dict[str, Any]:
    """Values of one output set (or one set of redrawn inputs) from their header entries and the blob.

    A tensor whose bytes came must have exactly the definition's dtype and shape, and the blob's
    tensor must be the one the header declared; any other tensor becomes a ``meta`` tensor of
    the declared dtype and shape (enough for the spec check), and a non-tensor a short string.
    A missing name stays missing (the checker reports it).
    """
    values: dict[str, Any] = {}
    for name, meta in metas.items():
        if name not in specs:
            if extras_allowed:  # an output the definition does not have: ignored, as before
                continue
            raise ProtocolError(f"the worker sent {name!r}, which is not among {', '.join(specs)}")
        want_dtype, want_shape = specs[name]
        if isinstance(meta, OtherMeta):
            values[name] = f"<{meta.type_name}>"
            continue
        dtype = TORCH_DTYPES.get(meta.dtype)
        if dtype is None:
            raise ProtocolError(f"{name}: unknown dtype {meta.dtype!r}")
        if not meta.in_blob:
            if dtype == want_dtype and tuple(meta.shape) == want_shape:
                raise ProtocolError(f"{name}: a tensor of the expected dtype and shape must carry its bytes")
            values[name] = torch.empty(meta.shape, dtype=dtype, device="meta")
            continue
        tensor = blob.get(f"{prefix}{name}")
        described = dtype == want_dtype and tuple(meta.shape) == want_shape
        if tensor is None or tensor.dtype != want_dtype or tuple(tensor.shape) != want_shape or not described:
            raise ProtocolError(f"{name}: the tensor sent does not match its description")
        values[name] = tensor
    return values
