"""Measure how far the decode reference and a solution land from the exact answer (the evidence behind the
``dsa_mla_decode_*`` workloads' ``atol`` and ``lse_atol``).

For every case of the given workloads and each input set (the runner's seeds), the exact answer is the
definition's math in float64 (``mla_decode.attend(..., dtype=float64)``), compared with the float32
reference and, with ``--solution NAME``, with that solution's entry (``flashmla`` on an SM90/SM100 GPU,
``triton``, ...). ``--emulate`` adds a CPU stand-in for a fast kernel: logits from the bf16 operands with
float32 accumulation in the log2 domain, four splits of the top-k slots combined afterwards, and
probabilities rounded to bf16 before the PV product. Printed per case: max |lse - exact| and max
|out - exact| over rows with a counted entry, how many out elements fail the workload's atol/rtol against
the reference (the checker's test) and the smallest atol that would pass them all,
and the lse shift of one of n equal-weight slots left out, ln(n / (n - 1)) for the row's n (what the lse
check must catch). The row check's column, ``row err / bound``, is the largest (max |out - ref| of a row) over
that row's bound (``checks.row_tolerances``: 1 fails) over the rows with a counted entry; ``--planted`` adds
``scaled_0.98``, the reference's out times 0.98 on every row of at least 1024 counted entries (a defect the row
check must catch; its figure is the smallest ratio over those rows, so every such row fails when it is above 1).

Usage:
    python benchmarks/kernels/mla_decode_error.py mla_decode_v32_mix mla_decode_v32_h128 [--solution flashmla]
        [--emulate] [--cases ID ...] [--input-sets N]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from dsa_bench.definitions import mla_decode as md
from dsa_bench.definitions.checks import row_tolerances
from dsa_bench.run.loader import import_entry
from dsa_bench.run.requirements import unmet
from dsa_bench.run.worker import call_solution
from dsa_bench.solution import load_solution
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]


def emulated_kernel(fmt, inputs: dict, splits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16, lse float32) as a split-K kernel with bf16 probabilities computes them."""
    q, indices = inputs["q"], inputs["indices"]
    b, s_q, h_q, d_qk = q.shape
    topk, bs = indices.shape[-1], inputs["kv_cache"].shape[1]
    mask = md.counted(indices, inputs.get("topk_length"))
    k = fmt.dequantize(fmt.read(inputs["kv_cache"], bs, indices.long().clamp_min(0).reshape(-1))).reshape(b, s_q, topk, d_qk)
    k = torch.where(mask[..., None], k, 0.0)
    logits = torch.einsum("bshd,bstd->bsht", q.float(), k) * (inputs["sm_scale"] * math.log2(math.e))
    logits = logits.masked_fill(~mask[:, :, None, :], float("-inf"))
    maxima, sums, partial = [], [], []
    for part in torch.chunk(torch.arange(topk, device=q.device), splits):
        block = logits[..., part]
        m = block.amax(-1).clamp_min(-1e30)  # an all-masked split contributes nothing
        p = torch.exp2(block - m[..., None])
        maxima.append(m)
        sums.append(p.sum(-1))
        partial.append(torch.einsum("bsht,bstd->bshd", p.bfloat16().float(), k[:, :, part, : md.D_V]))
    top = torch.stack(maxima).amax(0)
    weights = [torch.exp2(m - top) for m in maxima]
    total = sum(w * s for w, s in zip(weights, sums, strict=True))
    out = sum(w[..., None] * o for w, o in zip(weights, partial, strict=True)) / total[..., None]
    lse = (torch.log2(total) + top) / math.log2(math.e)
    sink = inputs["attn_sink"]
    out = out * torch.where(torch.isneginf(sink), 1.0, torch.sigmoid(lse - sink))[..., None]
    empty = ~mask.any(-1)
    return torch.where(empty[..., None, None], 0.0, out).bfloat16(), torch.where(empty[..., None], float("inf"), lse)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", help="workload names (workloads/NAME.yaml) or paths")
    parser.add_argument("--solution", help="a folder under solutions/ to measure besides the reference")
    parser.add_argument("--emulate", action="store_true", help="also measure the emulated split-K bf16-P kernel")
    parser.add_argument("--cases", nargs="*", help="case ids to measure (default: all)")
    parser.add_argument("--input-sets", type=int, default=1)
    parser.add_argument("--planted", action="store_true", help="also judge the reference's out scaled by 0.98 on long rows")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, worst, worst_row = [], {}, {}
    for name in args.workloads:
        path = Path(name) if name.endswith(".yaml") else ROOT / "workloads" / f"{name}.yaml"
        workload = load_workload(path)
        definition, tol = workload.definition, workload.settings.tolerance
        fmt = md.FORMAT_OF[definition.name]
        kernel, dps = None, True
        if args.solution:
            solution = load_solution(ROOT / "solutions" / args.solution)
            why_not = unmet(solution.requires, device)
            if why_not is not None:
                print(f"mla_decode_error.py: solution {args.solution} cannot run here: {why_not}", file=sys.stderr)
                raise SystemExit(2)
            kernel, dps = import_entry(solution, definition.name)[0], solution.entry_for(definition.name).destination_passing_style
        for case in workload.cases:
            if args.cases and case.id not in args.cases:
                continue
            for s in range(args.input_sets):
                inputs = build_inputs(definition, case, derive_seed(workload.settings.seed, case.id, "check", s), device)
                candidates = {}
                if kernel is not None:
                    outputs = definition.allocate_outputs(definition.axes(case.axes), device)
                    got = call_solution(kernel, dps, definition.input_args(inputs), outputs, list(outputs))
                    candidates[args.solution] = (got["out"], got["lse"])
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ref = definition.expect(inputs)
                candidates = {"reference": (ref["out"], ref["lse"]), **candidates}
                if args.emulate:
                    candidates["emulated"] = emulated_kernel(fmt, inputs)
                entries = md.counted(inputs["indices"], inputs.get("topk_length")).sum(-1)[..., None].expand_as(ref["lse"])
                long_rows = entries >= 1024
                if args.planted and bool(long_rows.any()):
                    scaled = torch.where(long_rows[..., None], ref["out"].float() * 0.98, ref["out"].float()).bfloat16()
                    candidates["scaled_0.98"] = (scaled, ref["lse"])
                bound = row_tolerances(ref["out"], ref["out_noise"])
                exact_out, exact_lse = md.attend(fmt, *definition.input_args(inputs)[:5], inputs.get("topk_length"), dtype=torch.float64)
                full = torch.isfinite(exact_lse)
                if not bool(full.any()):
                    continue
                n = int(md.counted(inputs["indices"], inputs.get("topk_length")).sum(-1)[full.any(-1)].max())
                shift = math.log(n / (n - 1)) if n > 1 else math.inf
                for who, (out, lse) in candidates.items():
                    lse_err = float((lse.double() - exact_lse)[full].abs().max())
                    diff = (out.double() - exact_out).abs()[full]
                    # what the checker does: against the bf16 reference, both criteria exceeded
                    vs_ref = (out.float() - ref["out"].float()).abs()[full]
                    past_rtol = vs_ref > tol.rtol * ref["out"].float().abs()[full]
                    fails = int((past_rtol & (vs_ref > tol.atol)).sum())
                    needed = float(vs_ref[past_rtol].max()) if bool(past_rtol.any()) else 0.0  # the smallest atol that passes
                    worst[who] = max(worst.get(who, 0.0), lse_err)
                    ratio = (out.float() - ref["out"].float()).abs().amax(-1) / bound
                    judged = long_rows if who == "scaled_0.98" else full
                    row_ratio = float(ratio[judged].min() if who == "scaled_0.98" else ratio[judged].max())
                    worst_row[who] = (min if who == "scaled_0.98" else max)(worst_row.get(who, row_ratio), row_ratio)
                    rows.append([f"{workload.name}/{case.id}", s, who, f"{float(exact_lse[full].abs().max()):.2f}", f"{lse_err:.2e}",
                                 f"{float(diff.max()):.2e}", fails, f"{needed:.2e}", f"{row_ratio:.3f}", f"{shift:.2e}"])
    print(f"device: {device}")
    headers = ["case", "set", "who", "max |lse|", "lse err", "out err", "out fails vs ref", "atol needed", "row err / bound",
               "1-of-n slot shift"]  # fmt: skip
    print(tabulate(rows, headers=headers, disable_numparse=True))
    print("worst lse error: " + ", ".join(f"{who} {err:.3e}" for who, err in worst.items() if who != "scaled_0.98"))
    print("row err / bound: " + ", ".join(f"{who} {'smallest' if who == 'scaled_0.98' else 'largest'} {r:.3f}"
                                          for who, r in worst_row.items()))  # fmt: skip


if __name__ == "__main__":
    main()
