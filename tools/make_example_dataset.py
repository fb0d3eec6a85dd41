"""Write examples/flashinfer_dataset: a tiny flashinfer-bench dataset to try `run --dataset` on.

It has the layout of flashinfer-bench's datasets (docs/flashinfer_bench.md): the indexer's
definition JSON, a workloads JSONL of three small cases whose seq_lens and block tables come from
one safetensors blob (the other inputs are `random`), and one packed Solution JSON. That solution
calls dsa-bench's own reference, so it passes: it shows the format, not a fast kernel.
Deterministic: rerunning it rewrites the same bytes.

Usage: python tools/make_example_dataset.py [--out examples/flashinfer_dataset]
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
import typer
from safetensors.torch import save_file

from dsa_bench.definitions import get_definition
from dsa_bench.definitions.base import DTYPE_NAMES, Definition
from dsa_bench.pack.pack import pack_solution

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
GROUP = "dsa_paged"  # flashinfer-bench groups a dataset's files by op type
PAGES = 48

#: (uuid, seq_lens per row): a short row, a row of exactly 2048 tokens, one just over it
CASES = [("example_short", [100]), ("example_2048", [2048, 7]), ("example_2049", [2049, 64, 0])]

KERNEL = '''"""A dataset solution for the example: dsa-bench's reference, copied into the output."""

from dsa_bench.definitions.indexer import reference


def kernel(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    topk_indices.copy_(reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)["topk_indices"])
'''

MANIFEST = f"""name: calls_reference
author: dsa-bench examples
description: Calls dsa-bench's indexer reference (a format example, not a fast kernel).
target_hardware: [cpu, cuda]
entries:
  {INDEXER}:
    entry_point: kernel.py::kernel
    language: python
    destination_passing_style: true
"""


def definition_document(definition: Definition, op_type: str) -> dict:
    """A flashinfer-bench definition JSON describing one of dsa-bench's definitions (dsa-bench runs
    its own reference and checker for a definition it knows)."""
    return {
        "name": definition.name,
        "op_type": op_type,
        "description": definition.description,
        "axes": {
            **{a: {"type": "var"} for a in definition.var_axes},
            **{a: {"type": "const", "value": v} for a, v in definition.const_axes.items()},
        },
        "inputs": {s.name: {"shape": list(s.shape) or None, "dtype": DTYPE_NAMES[s.dtype]} for s in definition.inputs},
        "outputs": {s.name: {"shape": list(s.shape) or None, "dtype": DTYPE_NAMES[s.dtype]} for s in definition.outputs},
        "reference": "def run(*inputs):\n    raise NotImplementedError('dsa-bench runs its own reference of this definition')\n",
    }


def _cases(blob_rel: str) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors: dict[str, torch.Tensor] = {}
    lines = []
    first_page = 0
    for uuid, lens in CASES:
        width = max(1, max((n + 63) // 64 for n in lens))
        table = torch.arange(first_page, first_page + width * len(lens), dtype=torch.int32).reshape(len(lens), width) % PAGES
        first_page += 5
        tensors[f"{uuid}.seq_lens"] = torch.tensor(lens, dtype=torch.int32)
        tensors[f"{uuid}.block_table"] = table.contiguous()
        blob = {"type": "safetensors", "path": blob_rel}
        lines.append({
            "definition": INDEXER,
            "solution": None,
            "workload": {
                "uuid": uuid,
                "axes": {"batch_size": len(lens), "max_num_pages": width, "num_pages": PAGES},
                "inputs": {
                    "q_index_fp8": {"type": "random"}, "k_index_cache_fp8": {"type": "random"}, "weights": {"type": "random"},
                    "seq_lens": {**blob, "tensor_key": f"{uuid}.seq_lens"},
                    "block_table": {**blob, "tensor_key": f"{uuid}.block_table"},
                },
            },
        })  # fmt: skip
    return tensors, lines


def write_dataset(out: Path) -> None:
    definition = get_definition(INDEXER)
    (out / "definitions" / GROUP).mkdir(parents=True, exist_ok=True)
    document = definition_document(definition, "dsa_topk_indexer")
    (out / "definitions" / GROUP / f"{INDEXER}.json").write_text(json.dumps(document, indent=2) + "\n")

    blob_rel = f"./blob/workloads/{GROUP}/{INDEXER}/example.safetensors"
    tensors, lines = _cases(blob_rel)
    (out / blob_rel).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / blob_rel))
    (out / "workloads" / GROUP).mkdir(parents=True, exist_ok=True)
    (out / "workloads" / GROUP / f"{INDEXER}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "calls_reference"
        folder.mkdir()
        (folder / "solution.yaml").write_text(MANIFEST)
        (folder / "kernel.py").write_text(KERNEL)
        (packed,) = pack_solution(folder, Path(tmp) / "packed")
        assert packed.path is not None
        target = out / "solutions" / GROUP / INDEXER / packed.path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(packed.path, target)


def main(out: Path = typer.Option(Path("examples/flashinfer_dataset"), "--out", help="Dataset folder to write.")) -> None:
    write_dataset(out)
    typer.echo(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
