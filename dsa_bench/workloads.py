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

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.base import Definition, InputRng, Tolerance, Value
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_jsonl, read_yaml

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

_SETTING_TYPES = {"seed": int, "input_sets": int, "warmup": int, "iterations": int, "trials": int}
_TOLERANCE_TYPES = {"atol": float, "rtol": float, "lse_atol": float, "score_rtol": float}


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
    settings = parse_settings(data.get("settings") or {}, where)
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
    if not isinstance(raw, dict):
        raise DsaBenchError("field 'settings' must be a mapping", where)
    values: dict[str, Any] = {}
    tol: dict[str, float] = {}
    for key, value in raw.items():
        kind = _SETTING_TYPES.get(key) or _TOLERANCE_TYPES.get(key)
        if kind is None:
            known = sorted([*_SETTING_TYPES, *_TOLERANCE_TYPES])
            raise DsaBenchError(f"unknown setting {key!r}; known settings: {', '.join(known)}", where)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise DsaBenchError(f"setting {key!r} must be {'an integer' if kind is int else 'a number'}, got {value!r}", where)
        if value < 0 or (key in ("input_sets", "iterations", "trials") and value < 1):
            raise DsaBenchError(f"setting {key!r} = {value} is out of range", where)
        (tol if key in _TOLERANCE_TYPES else values)[key] = kind(value)
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
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DsaBenchError(f"{field_name}.value must be a number", where)
        return InputSource("scalar", value=value)
    path, key = raw.get("path"), raw.get("tensor_key")
    if not isinstance(path, str) or not isinstance(key, str):
        raise DsaBenchError(f"{field_name} needs string fields 'path' and 'tensor_key'", where)
    return InputSource("safetensors", path=(base_dir / path).resolve(), tensor_key=key)


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
