"""Workload files and trace files (their models, loading them), and building a case's inputs.

A workload (YAML, :class:`WorkloadFileModel`) names a definition, a trace file and run settings
(:class:`SettingsModel`). A trace (JSONL) holds one case per line (:class:`TraceLineModel`)::

    {"id": "b3_p20", "axes": {"batch_size": 3, ...},
     "inputs": {"seq_lens": {"type": "explicit", "values": [100, 2049, 7]},
                "block_table": {"type": "random"},
                "k_index_cache_fp8": {"type": "random", "params": {"distinct_keys": 4}},
                "sm_scale": {"type": "scalar", "value": 0.135},
                "q_nope": {"type": "safetensors", "path": "blobs/x.safetensors", "tensor_key": "q"}}}

Inputs a case does not name are random. Loading validates each file with its model, then
every case against its definition (axis and input names, a safetensors path inside the trace's
folder, the definition's own checks); problems read ``file:line: field: what was expected``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BeforeValidator, Field, StrictBool

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.base import DTYPE_NAMES, Definition, InputRng, Tolerance, Value, is_finite_number, is_integer
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import check_document, field_sentence, is_lfs_pointer, lfs_pointer_message, read_jsonl, read_yaml
from dsa_bench.models import ClosedModel, Name
from dsa_bench.paths import path_inside


@dataclass(frozen=True)
class InputSource:
    """Where one input of a case comes from."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)  # random: generator parameters
    values: Any = None  # explicit: nested lists
    value: float | int | None = None  # scalar
    path: Path | None = None  # safetensors: absolute file path
    tensor_key: str | None = None


@dataclass(frozen=True)
class Case:
    """One trace line: var-axis values and input sources."""

    id: str
    axes: Mapping[str, int]
    inputs: Mapping[str, InputSource]
    where: str  # "file:line", for messages


@dataclass(frozen=True)
class RunSettings:
    """How a workload is run; every field can be overridden on the command line."""

    seed: int = 0
    input_sets: int = 2
    warmup: int = 10
    iterations: int = 50
    trials: int = 3
    tolerance: Tolerance = Tolerance()
    #: how the reference solution is timed: "light" (REFERENCE_LIGHT: its host-bound PyTorch calls
    #: would otherwise dominate a run's wall time) or "full" (the solutions' own protocol)
    reference_protocol: str = "light"
    #: contest mode: the seed is drawn from the OS at run time and withheld until the run ends
    #: (``run --secret``; docs/trust.md#contest-mode-secret-inputs)
    secret: bool = False

    def replace(self, **changes: Any) -> RunSettings:
        from dataclasses import replace

        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class Workload:
    name: str
    path: Path | None
    definition: Definition
    cases: tuple[Case, ...]
    settings: RunSettings
    description: str = ""
    trace_path: Path | None = None


# --------------------------------------------------------------------------- loading

#: Inclusive bounds of the integer run settings. Below the minimum a run checks or times
#: nothing; above the maximum it would run for days (or hold memory) for no better figure.
COUNT_BOUNDS: dict[str, tuple[int, int]] = {
    "seed": (0, 2**63 - 1),
    "input_sets": (1, 64),
    "warmup": (0, 100_000),
    "iterations": (1, 100_000),
    "trials": (1, 100),
}
TOLERANCES = tuple(f.name for f in dataclasses.fields(Tolerance))
#: the reference's timing protocol in a "light" run: (warmup, iterations, trials). Its latency
#: is the speedups' denominator; a PyTorch reference repeats within a few percent over 10 calls.
REFERENCE_LIGHT = (2, 10, 1)
REFERENCE_PROTOCOLS = ("light", "full")
#: Largest inputs plus outputs of one input set of a case, in bytes. The largest shipped case
#: needs about 0.7 GB; a trace asking for more is a typo, which would otherwise surface as an
#: allocation failure (or a machine swapping) instead of a message about the trace.
MAX_INPUT_SET_BYTES = 64 * 2**30


def setting_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for run setting ``key`` ("expected ..."), or None if it is fine."""
    if key in COUNT_BOUNDS:
        low, high = COUNT_BOUNDS[key]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer in [{low}, {high}]"
        if value < low:
            return f"expected an integer >= {low}"
        if value > high:
            return f"expected an integer <= {high}"
        return None
    if not is_finite_number(value) or value < 0:
        return "expected a finite number >= 0"
    return None


def _checked_setting(key: str, optional: bool = False) -> BeforeValidator:
    """The check of run setting ``key`` (see :func:`setting_problem`), before the type's own;
    an ``optional`` one may be null (its default rule applies)."""

    def check(value: Any) -> Any:
        if optional and value is None:
            return value
        problem = setting_problem(key, value)
        if problem is not None:
            raise field_sentence(f"= {value!r}: {problem}")
        return value

    return BeforeValidator(check)


class SettingsModel(ClosedModel):
    """A workload's ``settings``: the run settings (bounds in :data:`COUNT_BOUNDS`) and the
    tolerances (finite, >= 0; score_rtol may be null: the definition's derived rule); each defaults
    to RunSettings' and Tolerance's value."""

    seed: Annotated[int, _checked_setting("seed")] = RunSettings.seed
    input_sets: Annotated[int, _checked_setting("input_sets")] = RunSettings.input_sets
    warmup: Annotated[int, _checked_setting("warmup")] = RunSettings.warmup
    iterations: Annotated[int, _checked_setting("iterations")] = RunSettings.iterations
    trials: Annotated[int, _checked_setting("trials")] = RunSettings.trials
    atol: Annotated[float, _checked_setting("atol")] = Tolerance.atol
    rtol: Annotated[float, _checked_setting("rtol")] = Tolerance.rtol
    lse_atol: Annotated[float, _checked_setting("lse_atol")] = Tolerance.lse_atol
    score_rtol: Annotated[float | None, _checked_setting("score_rtol", optional=True)] = Tolerance.score_rtol
    reference_protocol: Literal["light", "full"] = "light"
    secret: StrictBool = False  # a workload judged only in contest mode: its seed is never the file's

    def run_settings(self, defaults: Tolerance | None = None) -> RunSettings:
        """The run settings; a tolerance the file leaves out takes ``defaults``' value (a definition's own, where it has them)."""
        unset = defaults is not None
        return RunSettings(
            **{key: getattr(self, key) for key in COUNT_BOUNDS},
            tolerance=Tolerance(**{key: getattr(self if not unset or key in self.model_fields_set else defaults, key)
                                   for key in TOLERANCES}),  # fmt: skip
            reference_protocol=self.reference_protocol,
            secret=self.secret,
        )


class _SettingsField(ClosedModel):
    """``settings`` alone, so that its problems are named ``settings.<key>`` as in a workload file."""

    settings: SettingsModel | None = None


class WorkloadFileModel(ClosedModel):
    """A workload YAML file."""

    name: Name | None = None  # default: the file's name without .yaml
    description: str = ""
    definition: Name
    trace: Name  # relative to the workload file's folder
    settings: SettingsModel | None = None  # null or absent: every setting's default


def load_workload(path: Path) -> Workload:
    """Load and fully validate a workload YAML file and its trace."""
    workload = check_document(WorkloadFileModel, read_yaml(path, "workload"), str(path))
    try:
        definition = get_definition(workload.definition)
    except DsaBenchError as exc:
        raise DsaBenchError(f"field 'definition': {exc}", str(path)) from None
    trace_path = (path.parent / workload.trace).resolve()
    cases = load_trace(trace_path, definition)
    return Workload(
        name=path.stem if workload.name is None else workload.name,
        path=path.resolve(),
        definition=definition,
        cases=tuple(cases),
        settings=(workload.settings or SettingsModel()).run_settings(definition.tolerance),
        description=workload.description,
        trace_path=trace_path,
    )


def parse_settings(raw: Any, where: str) -> RunSettings:
    """A workload's ``settings`` mapping (None: the defaults), every value checked (see :func:`setting_problem`)."""
    settings = check_document(_SettingsField, {"settings": raw}, where).settings
    return (settings or SettingsModel()).run_settings()


def load_trace(path: Path, definition: Definition) -> list[Case]:
    """Read a JSONL trace; every problem is reported with file:line and field."""
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for where, record in read_jsonl(path, "trace"):
        case = parse_case(record, definition, where, base_dir=path.parent)
        if case.id in seen:
            raise DsaBenchError(f"case id {case.id!r} already used at {seen[case.id]}", where)
        seen[case.id] = where
        cases.append(case)
    if not cases:
        raise DsaBenchError("trace holds no cases", str(path))
    return cases


class RandomSource(ClosedModel):
    type: Literal["random"]
    params: dict[str, Any] = {}  # the generator's parameters, checked by the definition


class ExplicitSource(ClosedModel):
    type: Literal["explicit"]
    values: Any  # nested lists, checked against the input's dtype and shape


def _finite_number(value: Any) -> Any:
    if not is_finite_number(value):
        raise field_sentence(f"must be a finite number, got {value!r}")
    return value


class ScalarSource(ClosedModel):
    type: Literal["scalar"]
    value: Annotated[int | float, BeforeValidator(_finite_number)]


class SafetensorsSource(ClosedModel):
    type: Literal["safetensors"]
    path: Name  # relative to the trace's folder, and inside it
    tensor_key: Name


_SOURCE_MODELS: dict[str, type[ClosedModel]] = {
    "random": RandomSource,
    "explicit": ExplicitSource,
    "scalar": ScalarSource,
    "safetensors": SafetensorsSource,
}


INPUT_KINDS = tuple(_SOURCE_MODELS)


def _source_of_its_type(raw: Any) -> Any:
    """``raw`` validated by the model its ``type`` names. (A discriminated union would put the
    type into every error's location: ``inputs.x.scalar.value``.)"""
    kind = raw.get("type") if isinstance(raw, dict) else None
    model = _SOURCE_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise field_sentence(f"must be an object with 'type' one of {', '.join(INPUT_KINDS)}")
    return model.model_validate(raw)


InputSourceModel = RandomSource | ExplicitSource | ScalarSource | SafetensorsSource


class TraceLineModel(ClosedModel):
    """One line of a trace: a case (or a flashinfer-bench workload, with its uuid as the id)."""

    id: Name
    axes: dict[str, Annotated[int, Field(ge=1)]]  # the variable axes (constant ones may be repeated)
    inputs: dict[str, Annotated[InputSourceModel, BeforeValidator(_source_of_its_type)]] = {}  # inputs not named are random
    note: str = ""  # for people reading the trace


def parse_case(record: Any, definition: Definition, where: str, base_dir: Path) -> Case:
    """One trace line, validated by :class:`TraceLineModel` and then against ``definition``."""
    line = check_document(TraceLineModel, record, where)
    axes = _check_axes(line.axes, definition, where)
    check_case_size(definition, definition.axes(axes), line.id, where)
    names = [spec.name for spec in definition.inputs]
    inputs: dict[str, InputSource] = {}
    for name, source in line.inputs.items():
        if name not in names:
            raise DsaBenchError(f"inputs.{name}: not an input of {definition.name}; inputs are {', '.join(names)}", where)
        inputs[name] = _input_source(source, f"inputs.{name}", where, base_dir)
    for name in names:
        inputs.setdefault(name, InputSource("random"))
    case = Case(line.id, axes, inputs, where)
    full_axes = definition.axes(axes)
    given = resolve_given(case, definition, torch.device("cpu"))
    problems = definition.validate(full_axes, given, random_params(case))
    if problems:
        raise DsaBenchError(f"case {line.id!r}: " + "; ".join(problems), where)
    return case


def check_case_size(definition: Definition, axes: Mapping[str, int], case_id: str, where: str) -> None:
    """Refuse a case whose inputs and outputs need more than :data:`MAX_INPUT_SET_BYTES`, before
    anything is allocated; the message names the largest tensor."""
    tensors = [spec for spec in (*definition.inputs, *definition.outputs) if not spec.is_scalar]
    sizes = [(spec, math.prod(spec.concrete_shape(axes)) * spec.dtype.itemsize) for spec in tensors]
    total = sum(size for _, size in sizes)
    if total <= MAX_INPUT_SET_BYTES:
        return
    spec, size = max(sizes, key=lambda item: item[1])
    raise DsaBenchError(
        f"case {case_id!r}: one input set needs {_bytes(total)} ({Decimal(total) / 2**30:.3g} GiB) of inputs and outputs, "
        f"more than the limit of {MAX_INPUT_SET_BYTES} bytes ({MAX_INPUT_SET_BYTES // 2**30} GiB); the largest is "
        f"{spec.name} {spec.concrete_shape(axes) if size < 10**18 else spec.shape} {DTYPE_NAMES[spec.dtype]}: {_bytes(size)}",
        where,
    )


def _bytes(count: int) -> str:
    return f"{count} bytes" if count < 10**18 else f"{Decimal(count):.3e} bytes"


def _check_axes(given: dict[str, int], definition: Definition, where: str) -> dict[str, int]:
    """The variable axes of a case: each one given, none unknown, constant ones as the definition fixes them."""
    axes: dict[str, int] = {}
    for name, value in given.items():
        if name in definition.const_axes:
            if value != definition.const_axes[name]:
                raise DsaBenchError(f"axes.{name} = {value!r} but the definition fixes it to {definition.const_axes[name]}", where)
            continue
        if name not in definition.var_axes:
            raise DsaBenchError(f"axes.{name}: not an axis of {definition.name}; variable axes are {', '.join(definition.var_axes)}", where)
        axes[name] = value
    missing = [a for a in definition.var_axes if a not in axes]
    if missing:
        raise DsaBenchError(f"axes is missing {', '.join(missing)}", where)
    return axes


def _input_source(source: InputSourceModel, label: str, where: str, base_dir: Path) -> InputSource:
    """A validated source as the case holds it (its fields are InputSource's); a safetensors
    path must stay inside ``base_dir``."""
    fields = source.model_dump(exclude={"type"})
    if "path" in fields:
        fields["path"] = path_inside(base_dir, fields["path"], f"{label}.path", where)
    return InputSource(source.type, **fields)


# --------------------------------------------------------------------------- inputs


def random_params(case: Case) -> dict[str, dict]:
    return {name: dict(src.params) for name, src in case.inputs.items() if src.kind == "random"}


def resolve_given(case: Case, definition: Definition, device: torch.device) -> dict[str, Value]:
    """Tensors and scalars the case states explicitly, checked against the definition's specs."""
    from safetensors import safe_open

    axes = definition.axes(case.axes)
    given: dict[str, Value] = {}
    for spec in definition.inputs:
        src = case.inputs[spec.name]
        label = f"inputs.{spec.name}"
        if src.kind == "random":
            continue
        if spec.is_scalar:
            if src.kind != "scalar":
                raise DsaBenchError(f'{label} is a scalar input; give it as {{"type": "scalar", "value": ...}}', case.where)
            assert src.value is not None  # a scalar source's model requires its value
            given[spec.name] = float(src.value)
            continue
        if src.kind == "scalar":
            raise DsaBenchError(f"{label} is a tensor input, not a scalar", case.where)
        if src.kind == "explicit":
            problem = _explicit_value_problem(src.values, spec.dtype)
            if problem is not None:
                raise DsaBenchError(f"{label}.values {problem}", case.where)
            try:
                tensor = torch.tensor(src.values, dtype=torch.float64 if spec.dtype.is_floating_point else torch.int64)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise DsaBenchError(f"{label}.values is not a rectangular array of numbers ({exc})", case.where) from None
            tensor = tensor.to(spec.dtype)
        else:
            try:
                with safe_open(str(src.path), framework="pt") as f:
                    tensor = f.get_tensor(src.tensor_key)
            except FileNotFoundError:
                raise DsaBenchError(f"{label}: safetensors file {src.path} does not exist", case.where) from None
            except Exception as exc:  # safetensors raises its own error types for bad files/keys
                if src.path is not None and is_lfs_pointer(src.path):  # safetensors itself says only "header too large"
                    raise DsaBenchError(f"{label}: {src.path}: {lfs_pointer_message(src.path, 'safetensors')}", case.where) from None
                raise DsaBenchError(f"{label}: cannot read tensor {src.tensor_key!r} from {src.path}: {exc}", case.where) from None
            if tensor.dtype != spec.dtype:
                raise DsaBenchError(f"{label}: tensor has dtype {tensor.dtype}, expected {spec.dtype}", case.where)
        want = spec.concrete_shape(axes)
        if tuple(tensor.shape) != want:
            raise DsaBenchError(f"{label} has shape {tuple(tensor.shape)}, expected {want} from {spec.shape}", case.where)
        given[spec.name] = tensor.to(device)
    return given


def _explicit_value_problem(values: Any, dtype: torch.dtype) -> str | None:
    """What is wrong with an element of explicit ``values`` for a tensor of ``dtype``, or None.

    Converting would otherwise truncate 1.5 to 1, read true as 1, and wrap an integer outside
    the dtype (2**40 becomes a valid-looking 0 in int32).
    """
    integer = not dtype.is_floating_point
    bounds = torch.iinfo(dtype) if integer else None
    pending = [values]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(value)
        elif bounds is not None and not is_integer(value):
            return f"holds {value!r}, not an integer ({DTYPE_NAMES[dtype]})"
        elif bounds is not None and not bounds.min <= value <= bounds.max:
            return f"holds {value}, outside the range of {DTYPE_NAMES[dtype]} [{bounds.min}, {bounds.max}]"
        elif bounds is None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"holds {value!r}, not a number"
    return None


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts, stable across processes and Python versions."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def build_inputs(definition: Definition, case: Case, seed: int, device: torch.device) -> dict[str, Value]:
    """All inputs of one input set: explicit ones from the trace, the rest drawn from ``seed``."""
    axes = definition.axes(case.axes)
    given = resolve_given(case, definition, device)
    inputs = definition.generate(axes, given, random_params(case), InputRng(seed, device))
    for spec in definition.inputs:
        value = inputs[spec.name]
        if spec.is_scalar:
            continue
        assert value.dtype == spec.dtype and tuple(value.shape) == spec.concrete_shape(axes), (
            f"generator of {definition.name} produced {spec.name} {value.dtype} {tuple(value.shape)}"
        )
    return inputs
