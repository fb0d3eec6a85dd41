"""Measure how far correct sparse-attention kernels land from the exact lse (the evidence behind
``Tolerance.lse_atol``).

For every case of the given workloads and each input set (the runner's seeds), the exact answer
is computed in float64, token by token, and compared with the float32 reference
(``sparse_attention.reference``) and with the triton solution's kernel (on a CPU its Triton
kernels under the interpreter, on a GPU its CUDA kernel). Printed per case: the largest |lse|,
max |lse - exact| of the reference and of the solution, their max |output - exact|, and the lse
shift of leaving out the row's most probable slot (what the lse check must catch).

Usage (on a CPU set TRITON_INTERPRET=1):
    python benchmarks/kernels/lse_error.py workloads/sparse_attention_smoke.yaml [--cases ID ...] [--input-sets N]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from tabulate import tabulate

from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]


def exact(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 (output, base-2 lse, largest-slot lse shift) per token; empty tokens get NaN."""
    tokens = inputs["sparse_indices"].shape[0]
    output = torch.full((tokens, attn.NUM_HEADS, attn.CKV_DIM), math.nan, dtype=torch.float64)
    lse = torch.full((tokens, attn.NUM_HEADS), math.nan, dtype=torch.float64)
    drop = torch.full((tokens, attn.NUM_HEADS), math.nan, dtype=torch.float64)
    for t in range(tokens):
        row = inputs["sparse_indices"][t].cpu()
        valid = row[row >= 0].long()
        if valid.numel() == 0:
            continue
        ckv = inputs["ckv_cache"].reshape(-1, attn.CKV_DIM)[valid].cpu().double()
        kpe = inputs["kpe_cache"].reshape(-1, attn.KPE_DIM)[valid].cpu().double()
        logits = (inputs["q_nope"][t].cpu().double() @ ckv.T + inputs["q_pe"][t].cpu().double() @ kpe.T) * inputs["sm_scale"]
        natural = torch.logsumexp(logits, -1)
        lse[t] = natural / math.log(2)
        output[t] = torch.softmax(logits, -1) @ ckv
        # Leaving out the most probable slot lowers the lse by -log2(1 - p_max).
        drop[t] = -torch.log1p(-torch.exp(logits.max(-1).values - natural)) / math.log(2)
    return output, lse, drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--cases", nargs="*", help="case ids to measure (default: all)")
    parser.add_argument("--input-sets", type=int, default=1)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _, solution = import_entry(load_solution(ROOT / "solutions" / "triton"), attn.NAME)
    rows = []
    worst = {"ref": 0.0, "sol": 0.0}
    for path in args.workloads:
        workload = load_workload(path)
        for case in workload.cases:
            if args.cases and case.id not in args.cases:
                continue
            for s in range(args.input_sets):
                seed = derive_seed(workload.settings.seed, case.id, "check", s)
                inputs = build_inputs(workload.definition, case, seed, device)
                axes = workload.definition.axes(case.axes)
                out64, lse64, drop = exact(inputs)
                ref = attn.reference(**inputs)
                outputs = workload.definition.allocate_outputs(axes, device)
                solution.kernel(*workload.definition.input_args(inputs), outputs["output"], outputs["lse"])
                if device.type == "cuda":
                    torch.cuda.synchronize()
                full = ~torch.isnan(lse64)
                ref_lse = (ref["lse"].cpu().double() - lse64)[full].abs().max().item()
                sol_lse = (outputs["lse"].cpu().double() - lse64)[full].abs().max().item()
                ref_out = (ref["output"].cpu().double() - out64)[full].abs().max().item()
                sol_out = (outputs["output"].cpu().double() - out64)[full].abs().max().item()
                worst["ref"], worst["sol"] = max(worst["ref"], ref_lse), max(worst["sol"], sol_lse)
                rows.append([case.id, s, f"{lse64[full].abs().max().item():.2f}", f"{ref_lse:.2e}", f"{sol_lse:.2e}",
                             f"{ref_out:.2e}", f"{sol_out:.2e}", f"{drop[full].min().item():.2e}"])
    print(f"device: {device}")
    print(tabulate(rows, headers=["case", "set", "max |lse|", "ref lse err", "sol lse err", "ref out err", "sol out err",
                                  "min drop-top-slot shift"], disable_numparse=True))
    print(f"worst lse error: reference {worst['ref']:.3e}, solution {worst['sol']:.3e}")


if __name__ == "__main__":
    main()
