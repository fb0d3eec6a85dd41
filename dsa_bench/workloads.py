"""Workload files, trace files, and building a case's inputs.

A workload (YAML) names a definition, a trace file and run settings. A trace (JSONL) holds one
case per line::

    {"id": "b3_p20", "axes": {"batch_size": 3, ...},
     "inputs": {"seq_lens": {"type": "explicit", "values": [100, 2049, 7]},
                "block_table": {"type": "random"},
                "k_index_cache_fp8": {"type": "random", "params": {"distinct_keys": 4}},
                "sm_scale": {"type": "scalar", "value": 0.135},
                "q_nope": {"type": "safetensors", "path": "blobs/x.safetensors", "tensor_key": "q"}}}

Inputs a case does not name are random. Loading validates every case against its definition
and reports problems as ``file:line: field: what was expected``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping

import torch

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.base import DTYPE_NAMES, Definition, InputRng, Tolerance, Value, is_finite_number, is_integer
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_jsonl, read_yaml
from dsa_bench.paths import path_inside

INPUT_KINDS = ("random", "explicit", "scalar", "safetensors")


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

    def replace(self, **changes: Any) -> "RunSettings":
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


def load_workload(path: Path) -> Workload:
    """Load and fully validate a workload YAML file and its trace."""
    where = str(path)
    data = read_yaml(path, "workload")
    if not isinstance(data, dict):
        raise DsaBenchError("expected a mapping with keys name, definition, trace, settings", where)
    unknown = set(data) - {"name", "definition", "trace", "settings", "description"}
    if unknown:
        raise DsaBenchError(f"unknown key(s) {sorted(unknown)}; expected name, definition, trace, settings, description", where)
    for key in ("definition", "trace"):
        if not isinstance(data.get(key), str):
            raise DsaBenchError(f"field {key!r} must be a string", where)
    definition = get_definition(data["definition"])
    settings = parse_settings({} if data.get("settings") is None else data["settings"], where)
    trace_path = (path.parent / data["trace"]).resolve()
    cases = load_trace(trace_path, definition)
    return Workload(
        name=str(data.get("name", path.stem)),
        path=path.resolve(),
        definition=definition,
        cases=tuple(cases),
        settings=settings,
        description=str(data.get("description", "")),
        trace_path=trace_path,
    )


def parse_settings(raw: Any, where: str) -> RunSettings:
    """A workload's ``settings`` mapping, every value checked (see :func:`setting_problem`)."""
    if not isinstance(raw, dict):
        raise DsaBenchError("field 'settings' must be a mapping", where)
    values: dict[str, Any] = {}
    tol: dict[str, float] = {}
    for key, value in raw.items():
        if key not in COUNT_BOUNDS and key not in TOLERANCES:
            known = sorted([*COUNT_BOUNDS, *TOLERANCES])
            raise DsaBenchError(f"unknown setting {key!r}; known settings: {', '.join(known)}", where)
        problem = setting_problem(key, value)
        if problem is not None:
            raise DsaBenchError(f"settings.{key} = {value!r}: {problem}", where)
        if key in TOLERANCES:
            tol[key] = float(value)
        else:
            values[key] = value
    return RunSettings(**values, tolerance=Tolerance(**tol))


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


def parse_case(record: Any, definition: Definition, where: str, base_dir: Path) -> Case:
    if not isinstance(record, dict):
        raise DsaBenchError("a case must be a JSON object with id, axes and inputs", where)
    unknown = set(record) - {"id", "axes", "inputs", "note"}
    if unknown:
        raise DsaBenchError(f"unknown field(s) {sorted(unknown)}; expected id, axes, inputs", where)
    case_id = record.get("id")
    if not isinstance(case_id, str) or not case_id:
        raise DsaBenchError("field 'id' must be a non-empty string", where)
    axes = _parse_axes(record.get("axes"), definition, where)
    check_case_size(definition, definition.axes(axes), case_id, where)
    raw_inputs = record.get("inputs", {})
    if not isinstance(raw_inputs, dict):
        raise DsaBenchError("field 'inputs' must be an object", where)
    names = [spec.name for spec in definition.inputs]
    inputs: dict[str, InputSource] = {}
    for name, raw in raw_inputs.items():
        if name not in names:
            raise DsaBenchError(f"inputs.{name}: not an input of {definition.name}; inputs are {', '.join(names)}", where)
        inputs[name] = _parse_source(raw, f"inputs.{name}", where, base_dir)
    for name in names:
        inputs.setdefault(name, InputSource("random"))
    case = Case(case_id, axes, inputs, where)
    full_axes = definition.axes(axes)
    given = resolve_given(case, definition, torch.device("cpu"))
    problems = definition.validate(full_axes, given, random_params(case))
    if problems:
        raise DsaBenchError(f"case {case_id!r}: " + "; ".join(problems), where)
    return case


def check_case_size(definition: Definition, axes: Mapping[str, int], case_id: str, where: str) -> None:
    """Refuse a case whose inputs and outputs need more than :data:`MAX_INPUT_SET_BYTES`, before
    anything is allocated; the message names the largest tensor."""
    sizes = [(spec, math.prod(spec.concrete_shape(axes)) * spec.dtype.itemsize) for spec in (*definition.inputs, *definition.outputs) if not spec.is_scalar]
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


def _parse_axes(raw: Any, definition: Definition, where: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise DsaBenchError("field 'axes' must be an object", where)
    axes: dict[str, int] = {}
    for name, value in raw.items():
        if name in definition.const_axes:
            if value != definition.const_axes[name]:
                raise DsaBenchError(f"axes.{name} = {value!r} but the definition fixes it to {definition.const_axes[name]}", where)
            continue
        if name not in definition.var_axes:
            raise DsaBenchError(f"axes.{name}: not an axis of {definition.name}; variable axes are {', '.join(definition.var_axes)}", where)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DsaBenchError(f"axes.{name} must be a positive integer, got {value!r}", where)
        axes[name] = value
    missing = [a for a in definition.var_axes if a not in axes]
    if missing:
        raise DsaBenchError(f"axes is missing {', '.join(missing)}", where)
    return axes


def _parse_source(raw: Any, field_name: str, where: str, base_dir: Path) -> InputSource:
    if not isinstance(raw, dict) or raw.get("type") not in INPUT_KINDS:
        raise DsaBenchError(f"{field_name} must be an object with 'type' one of {', '.join(INPUT_KINDS)}", where)
    kind = raw["type"]
    if kind == "random":
        params = raw.get("params", {})
        if not isinstance(params, dict):
            raise DsaBenchError(f"{field_name}.params must be an object", where)
        return InputSource("random", params=params)
    if kind == "explicit":
        if "values" not in raw:
            raise DsaBenchError(f"{field_name}.values is required for an explicit input", where)
        return InputSource("explicit", values=raw["values"])
    if kind == "scalar":
        value = raw.get("value")
        if not is_finite_number(value):
            raise DsaBenchError(f"{field_name}.value must be a finite number, got {value!r}", where)
        return InputSource("scalar", value=value)
    path, key = raw.get("path"), raw.get("tensor_key")
    if not isinstance(path, str) or not isinstance(key, str):
        raise DsaBenchError(f"{field_name} needs string fields 'path' and 'tensor_key'", where)
    return InputSource("safetensors", path=path_inside(base_dir, path, f"{field_name}.path", where), tensor_key=key)


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
                raise DsaBenchError(f"{label} is a scalar input; give it as {{\"type\": \"scalar\", \"value\": ...}}", case.where)
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
