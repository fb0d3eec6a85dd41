"""Definitions read from a flashinfer-bench dataset's ``definitions/[group/]<definition>.json``.

A definition JSON holds ``name``, ``op_type``, ``axes`` ({"type": "const", "value": n} or
{"type": "var"}), ``inputs``/``outputs`` ({"shape": [axis names] or null for a scalar, "dtype"}),
``reference`` (Python source defining ``run(*inputs)``), and optional ``description``, ``tags`` and
``constraints``.

Definitions dsa-bench knows by name run as dsa-bench's own (its generators fill the inputs a
workload leaves random, its strict checkers judge), after checking the JSON describes the same
contract. Any other definition becomes a generic one: the JSON's ``run`` is the reference, random
inputs are drawn by dtype as the ecosystem does (seeded), and every output is compared with the
reference element-wise (``atol``/``rtol``; -inf is accepted exactly where the reference has it).
A generic definition redraws no inputs between timed calls (dsa-bench cannot tell which are cheap
and independent); timing still rotates among fresh input sets.

The dataset's workloads and solutions are read by :mod:`dsa_bench.flashinfer_bench.dataset`.
"""

from __future__ import annotations

import ast
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dsa_bench.definitions import all_definitions, register
from dsa_bench.definitions.base import DTYPE_NAMES, DTYPES, Definition, InputRng, TensorSpec, Tolerance, Value
from dsa_bench.definitions.checks import compare_close, worst
from dsa_bench.definitions.status import CheckResult
from dsa_bench.errors import DsaBenchError
from dsa_bench.files import read_json

#: Integer ranges of random integer inputs (the ecosystem's choice; high is exclusive).
_RANDOM_INT_RANGES = {torch.int8: (-128, 128), torch.uint8: (0, 256)}
_DEFAULT_INT_RANGE = (-1024, 1024)


@dataclass(frozen=True)
class DatasetDefinition:
    name: str
    path: Path
    data: dict[str, Any]


def check_dataset_root(root: Path) -> None:
    """Raise unless ``root`` is a flashinfer-bench dataset folder (one with ``definitions/``)."""
    if not root.is_dir():
        raise DsaBenchError("dataset folder does not exist", str(root))
    if not (root / "definitions").is_dir():
        raise DsaBenchError("not a flashinfer-bench dataset: it has no definitions/ folder", str(root))


def dataset_definitions(root: Path) -> dict[str, DatasetDefinition]:
    """Every ``definitions/**/*.json`` of a dataset, by name (raw JSON, not yet interpreted)."""
    check_dataset_root(root)
    found: dict[str, DatasetDefinition] = {}
    for path in sorted((root / "definitions").rglob("*.json")):
        data = read_json(path, "definition")
        if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
            raise DsaBenchError("a definition must be a JSON object with a non-empty string 'name'", str(path))
        if data["name"] in found:
            raise DsaBenchError(f"definition {data['name']!r} is also defined in {found[data['name']].path}", str(path))
        found[data["name"]] = DatasetDefinition(data["name"], path, data)
    return found


def _axes(data: Mapping[str, Any], where: str) -> tuple[dict[str, int], list[str]]:
    raw = data.get("axes")
    if not isinstance(raw, dict) or not raw:
        raise DsaBenchError("field 'axes' must be a non-empty object", where)
    const: dict[str, int] = {}
    var: list[str] = []
    for name, axis in raw.items():
        kind = axis.get("type") if isinstance(axis, dict) else None
        if kind == "const":
            value = axis.get("value")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DsaBenchError(f"axes.{name}.value must be a non-negative integer", where)
            const[name] = value
        elif kind == "var":
            var.append(name)
        else:
            raise DsaBenchError(f'axes.{name} must be {{"type": "const", "value": n}} or {{"type": "var"}}', where)
    return const, var


def _tensor_specs(data: Mapping[str, Any], key: str, axes: set[str], where: str) -> tuple[TensorSpec, ...]:
    raw = data.get(key)
    if not isinstance(raw, dict) or not raw:
        raise DsaBenchError(f"field {key!r} must be a non-empty object of tensor specs", where)
    specs = []
    for name, spec in raw.items():
        label = f"{key}.{name}"
        if not isinstance(spec, dict):
            raise DsaBenchError(f"{label} must be an object with 'shape' and 'dtype'", where)
        shape = spec.get("shape")
        if shape is None:
            shape = []
        if not isinstance(shape, list) or not all(isinstance(a, str) for a in shape):
            raise DsaBenchError(f"{label}.shape must be a list of axis names, or null for a scalar", where)
        unknown = [a for a in shape if a not in axes]
        if unknown:
            raise DsaBenchError(f"{label}.shape names undefined axes {unknown}", where)
        dtype = spec.get("dtype")
        if dtype not in DTYPES:
            raise DsaBenchError(f"{label}.dtype {dtype!r} is not supported by dsa-bench (supported: {', '.join(DTYPES)})", where)
        specs.append(TensorSpec(name, tuple(shape), DTYPES[dtype], str(spec.get("description") or "")))
    return tuple(specs)


def _load_reference(source: Any, where: str) -> Any:
    """The ``run`` function of a definition's reference source, checked now (syntax, a top-level
    ``run``) but executed only when first called. The source is a dataset's code, as untrusted as
    a solution: the harness never calls it (its expectations come from an isolated worker, see
    :func:`runs_untrusted_reference`), so loading a dataset runs none of it."""
    if not isinstance(source, str) or not source.strip():
        raise DsaBenchError("field 'reference' must be Python source defining run(...)", where)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise DsaBenchError(f"reference is not valid Python: {exc.msg} at line {exc.lineno}", where) from None
    if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body):
        raise DsaBenchError("reference defines no top-level function run(...)", where)
    loaded: list[Any] = []

    def run(*args: Any) -> Any:
        if not loaded:
            slug = re.sub(r"\W", "_", Path(where).stem)
            module = types.ModuleType(f"dsa_bench_dataset_reference_{slug}")
            module.__file__ = where
            try:
                exec(compile(tree, f"{where}:reference", "exec"), module.__dict__)  # noqa: S102 - the dataset's reference is code by design
            except Exception as exc:  # noqa: BLE001 - the reference's own imports or top-level code may raise anything
                raise DsaBenchError(f"running the reference source failed: {type(exc).__name__}: {exc}", where) from None
            loaded.append(module.run)
        return loaded[0](*args)

    return run


def _random_value(spec: TensorSpec, axes: Mapping[str, int], rng: InputRng) -> Value:
    """A random input drawn the ecosystem's way: normal floats (fp8 clamped to ±2), uniform ints."""
    shape = spec.concrete_shape(axes)
    dtype = spec.dtype
    if dtype.is_floating_point:
        values = torch.randn(shape, generator=rng.values, device=rng.device, dtype=torch.float32)
        if dtype.itemsize == 1:
            values = values.clamp_(-2.0, 2.0)
        values = values.to(dtype)
    else:
        low, high = _RANDOM_INT_RANGES.get(dtype, _DEFAULT_INT_RANGE)
        values = torch.randint(low, high, shape, generator=rng.values, device=rng.device, dtype=dtype)
    return float(values.float()) if spec.is_scalar else values


#: the note every generic dataset definition carries (it survives pickling to a Ray actor; the registry does not)
GENERIC_NOTE = "Generic dataset definition: outputs are compared element-wise with the JSON's reference."


def generic_definition(data: Mapping[str, Any], where: str) -> Definition:
    """A :class:`Definition` from a definition JSON dsa-bench has no implementation of."""
    name = data["name"]
    const_axes, var_axes = _axes(data, where)
    axis_names = set(const_axes) | set(var_axes)
    inputs = _tensor_specs(data, "inputs", axis_names, where)
    outputs = _tensor_specs(data, "outputs", axis_names, where)
    clash = {s.name for s in inputs} & {s.name for s in outputs}
    if clash:
        raise DsaBenchError(f"names {sorted(clash)} are both inputs and outputs", where)
    run = _load_reference(data.get("reference"), where)
    output_names = [s.name for s in outputs]

    def reference(*args: Value, **kwargs: Value) -> dict[str, torch.Tensor]:
        values = list(args) + [kwargs[s.name] for s in inputs[len(args) :]]
        result = run(*values)
        if isinstance(result, dict):
            return {n: result[n] for n in output_names}
        if isinstance(result, torch.Tensor):
            result = (result,)
        result = tuple(result)
        if len(result) != len(output_names):
            raise ValueError(f"reference of {name} returned {len(result)} outputs, expected {len(output_names)}")
        return dict(zip(output_names, result, strict=True))

    def generate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
        return {s.name: given[s.name] if s.name in given else _random_value(s, axes, rng) for s in inputs}

    def validate(axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
        return [f"inputs.{n}: random generator parameters are not supported for dataset definitions" for n, p in params.items() if p]

    def redraw(axes: Mapping[str, int], rng: InputRng) -> dict[str, torch.Tensor]:
        # Nothing: for a definition it does not know, dsa-bench cannot tell which inputs are cheap
        # to replace between timed calls or must stay consistent with others (index tensors).
        # Timing still rotates among fresh input sets.
        return {}

    def expect(values: Mapping[str, Value]) -> dict[str, torch.Tensor]:
        return reference(*[values[s.name] for s in inputs])

    def check(values: Mapping[str, Value], got: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance) -> CheckResult:
        results = []
        for spec in outputs:
            ref = torch.as_tensor(expected[spec.name]).to(got[spec.name].device)
            neg_inf = torch.isneginf(ref) if ref.dtype.is_floating_point else None
            results.append(compare_close(spec.name, got[spec.name], ref, tol, allow_neg_inf=neg_inf))
        return worst(results)

    return Definition(
        name=name,
        description=str(data.get("description") or f"dataset definition ({data.get('op_type', 'unknown op type')})"),
        const_axes=const_axes,
        var_axes=tuple(var_axes),
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        generate=generate,
        validate=validate,
        redraw=redraw,
        expect=expect,
        check=check,
        key_axes=tuple(var_axes),
        notes=(GENERIC_NOTE,),
    )


def check_matches_builtin(data: Mapping[str, Any], builtin: Definition, where: str) -> None:
    """Raise unless a dataset definition JSON describes the same contract as dsa-bench's own."""
    const_axes, var_axes = _axes(data, where)
    if const_axes != dict(builtin.const_axes) or set(var_axes) != set(builtin.var_axes):
        raise DsaBenchError(
            f"axes differ from dsa-bench's {builtin.name}: const {const_axes} vs {dict(builtin.const_axes)}, "
            f"var {sorted(var_axes)} vs {sorted(builtin.var_axes)}",
            where,
        )
    for key, specs in (("inputs", builtin.inputs), ("outputs", builtin.outputs)):
        theirs = _tensor_specs(data, key, set(const_axes) | set(var_axes), where)
        mine = [(s.name, s.shape, s.dtype) for s in specs]
        found = [(s.name, s.shape, s.dtype) for s in theirs]
        if found != mine:
            raise DsaBenchError(f"{key} differ from dsa-bench's {builtin.name}: {_describe(found)} vs {_describe(mine)}", where)


def _describe(specs: list[tuple[str, tuple[str, ...], torch.dtype]]) -> str:
    return ", ".join(f"{name}{list(shape)}:{DTYPE_NAMES[dtype]}" for name, shape, dtype in specs)


#: Names registered from datasets in this process (generic definitions; may be re-registered).
_registered: set[str] = set()


def definition_from_dataset(entry: DatasetDefinition) -> Definition:
    """dsa-bench's own definition for a known name (after checking it matches), else a generic one."""
    builtin = None if entry.name in _registered else all_definitions().get(entry.name)
    if builtin is not None:
        check_matches_builtin(entry.data, builtin, str(entry.path))
        return builtin
    return generic_definition(entry.data, str(entry.path))


def runs_untrusted_reference(definition: Definition) -> bool:
    """Whether ``definition``'s reference is a dataset's own source (a generic definition), which
    the harness must run only in an isolated worker."""
    return definition.name in _registered or GENERIC_NOTE in definition.notes


def register_dataset_definition(root: Path, name: str) -> Definition:
    """Make the dataset's definition ``name`` known to :func:`dsa_bench.definitions.get_definition`.

    Runs in the harness and in every solution worker (which looks definitions up by name).
    Built-in definitions stay as they are; generic ones are (re-)registered.
    """
    definitions = dataset_definitions(root)
    if name not in definitions:
        known = ", ".join(sorted(definitions)) or "(none)"
        raise DsaBenchError(f"dataset has no definition {name!r}; its definitions: {known}", str(root))
    definition = definition_from_dataset(definitions[name])
    if name in _registered or name not in all_definitions():
        register(definition)
        _registered.add(name)
    return definition
