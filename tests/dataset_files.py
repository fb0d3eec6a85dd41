"""Small flashinfer-bench dataset folders the tests write: a definition dsa-bench has no
implementation of (RMSNORM), a solution of it, dataset JSON describing dsa-bench's own definitions,
and workloads lines."""

from __future__ import annotations

import json
from pathlib import Path

from dsa_bench.definitions.base import DTYPE_NAMES, Definition

RMSNORM = "rmsnorm_h64"

RMSNORM_DEFINITION = {
    "name": RMSNORM,
    "op_type": "rmsnorm",
    "description": "RMSNorm over 64 features (a definition dsa-bench has no implementation of).",
    "axes": {"batch_size": {"type": "var"}, "hidden_size": {"type": "const", "value": 64}},
    "inputs": {
        "hidden_states": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"},
        "weight": {"shape": ["hidden_size"], "dtype": "bfloat16"},
        "eps": {"shape": None, "dtype": "float32"},
    },
    "outputs": {"output": {"shape": ["batch_size", "hidden_size"], "dtype": "bfloat16"}},
    "reference": (
        "import torch\n\n"
        "def run(hidden_states, weight, eps):\n"
        "    x = hidden_states.float()\n"
        "    scale = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)\n"
        "    return (x * scale * weight.float()).to(torch.bfloat16)\n"
    ),
}

RMSNORM_SOLUTION = {
    "solution.yaml": (
        "name: rms_user\nauthor: tests\ntarget_hardware: [cpu]\nentries:\n"
        f"  {RMSNORM}:\n    entry_point: kernel.py::kernel\n    language: python\n"
    ),
    "kernel.py": (
        "def kernel(hidden_states, weight, eps, output):\n"
        "    x = hidden_states.float()\n"
        "    norm = (x.square().sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt()\n"
        "    output.copy_((x / norm * weight.float()).bfloat16())\n"
    ),
}


def definition_json(definition: Definition, op_type: str) -> dict:
    """A dataset definition JSON describing one of dsa-bench's own definitions."""
    return {
        "name": definition.name,
        "op_type": op_type,
        "axes": {
            **{a: {"type": "var"} for a in definition.var_axes},
            **{a: {"type": "const", "value": v} for a, v in definition.const_axes.items()},
        },
        "inputs": {s.name: {"shape": list(s.shape) or None, "dtype": DTYPE_NAMES[s.dtype]} for s in definition.inputs},
        "outputs": {s.name: {"shape": list(s.shape) or None, "dtype": DTYPE_NAMES[s.dtype]} for s in definition.outputs},
        "reference": "def run(*inputs):\n    raise NotImplementedError('dsa-bench uses its own reference')\n",
    }


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _line(definition: str, uuid: str, axes: dict, inputs: dict) -> dict:
    return {"definition": definition, "solution": None, "workload": {"uuid": uuid, "axes": axes, "inputs": inputs}}


def _dataset(root: Path, reference: str) -> Path:
    (root / "definitions").mkdir(parents=True)
    (root / "definitions" / f"{RMSNORM}.json").write_text(json.dumps({**RMSNORM_DEFINITION, "reference": reference}))
    inputs = {"hidden_states": {"type": "random"}, "weight": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}}
    _jsonl(root / "workloads" / f"{RMSNORM}.jsonl", [_line(RMSNORM, "r0", {"batch_size": 2}, inputs)])
    return root
