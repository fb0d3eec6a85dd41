#!/usr/bin/env python
"""The gather floor of the sparse attention on a CUDA GPU: gather-only kernels against the solution.

    python tools/gather_floor.py [--case attention_18_t8_full] [--iterations 30] [--out results/gather_floor.json]

For the chosen cases of ``workloads/sparse_attention_h16.yaml`` (inputs from the harness's own
generator) it times, cold L2, median over iterations, with the harness's timer:
  - the solution's sparse attention under its default plan (the whole call), also on the ids
    reordered as below (the result is the same: a row's slots may come in any order);
  - gather-only kernels (tools/gather_floor.cu) that fetch exactly the rows that call fetches,
    by bulk copies (all of a program's rows at once; on one mbarrier, or one per row polled as
    the attention kernel does) or by 16-byte loads, with and without the
    kpe rows, at several split counts;
  - the same gathers with the slot ids reordered: each program's slots sorted by address
    ("program-sorted", what a program could do for itself), the token's whole row sorted
    ("row-sorted"), and consecutive rows ("contiguous", the streaming floor).
Each line gives µs and the rate of the bytes fetched (valid rows x 1152 B, or x 1024 B without kpe).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profile_kernels import solution_module

from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.timing import L2Flusher, choose_timer, make_timer
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

TOPK = 2048


def build_gather_extension():
    from torch.utils.cpp_extension import load

    return load(name="dsa_gather_floor", sources=[str(ROOT / "tools" / "gather_floor.cu")], extra_cuda_cflags=["-O3", "-arch=sm_90a"])


def program_sorted(indices: torch.Tensor, splits: int) -> torch.Tensor:
    """Each program's strided slots (s, s + S, ...) sorted by id, padding (-1) last."""
    T = indices.shape[0]
    per_program = indices.view(T, TOPK // splits, splits)  # [t, r, s] = slot r * S + s
    key = torch.where(per_program >= 0, per_program, torch.iinfo(torch.int32).max)
    return per_program.gather(1, key.argsort(dim=1)).reshape(T, TOPK).contiguous()


def row_sorted(indices: torch.Tensor) -> torch.Tensor:
    key = torch.where(indices >= 0, indices, torch.iinfo(torch.int32).max)
    return indices.gather(1, key.argsort(dim=1)).contiguous()


def contiguous(indices: torch.Tensor) -> torch.Tensor:
    """The same valid count per row, on consecutive rows of the cache."""
    T = indices.shape[0]
    ids = torch.arange(T * TOPK, dtype=torch.int32, device=indices.device).view(T, TOPK)
    return torch.where(indices >= 0, ids, -1).contiguous()


def check_copied(sink: torch.Tensor, ids: torch.Tensor, ckv: torch.Tensor, splits: int) -> None:
    """The bulk kernels leave each program's first shared word in ``sink``: where the program's
    first slot is valid that is the first word of its ckv row, so the copies really happened."""
    first = ids[:, :splits].reshape(-1).long()  # slot s is the first of program s
    words = ckv.reshape(-1, ckv.shape[-1]).view(torch.int32)[:, 0]
    valid = first >= 0
    got, want = sink[: first.numel()][valid], words[first[valid]]
    assert torch.equal(got, want), f"gather kernel: {(got != want).sum().item()} programs hold the wrong first word"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="case id (repeatable; default attention_18_t8_full)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--timer", default="auto")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gather_floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    workload = load_workload(ROOT / "workloads" / "sparse_attention_h16.yaml")
    known = {c.id: c for c in workload.cases}
    unknown = [c for c in args.case or [] if c not in known]
    if unknown:
        print(f"gather_floor: unknown case(s) {unknown}; the cases are {', '.join(known)}", file=sys.stderr)
        return 2
    ext = build_gather_extension()
    sa = solution_module(attn.NAME)
    timer_name, warning = choose_timer(args.timer, device)
    if warning:
        print(f"warning: {warning}")
    timer = make_timer(timer_name)
    flusher = L2Flusher(device)
    print(f"{torch.cuda.get_device_name(device)}, timer {timer.name}, {args.iterations} iterations (median), cold L2")

    def time_us(call) -> float:
        for i in range(3):
            call(i)
        torch.cuda.synchronize()
        return statistics.median(timer.time_iterations(call, args.iterations, lambda i: flusher.flush(), lambda i: None)) * 1000.0

    results: dict[str, dict[str, float]] = {}
    for case_id in args.case or ["attention_18_t8_full"]:
        case = known[case_id]
        inputs = build_inputs(workload.definition, case, derive_seed(workload.settings.seed, case.id, "gather_floor", 0), device)
        axes = workload.definition.axes(case.axes)
        outs = workload.definition.allocate_outputs(axes, device)
        call_args = workload.definition.input_args(inputs)
        row: dict[str, float] = {}
        indices = inputs["sparse_indices"]
        # The attention is invariant under a reordering of a row's slots: the solution timed on
        # reordered ids shows what an in-kernel reordering could gain at most.
        per_row_orders = {"as-is": indices, "row-sorted": row_sorted(indices), "contiguous": contiguous(indices)}
        for order, ids in (("as-is", indices), ("program-sorted", program_sorted(indices, 16)), ("row-sorted", per_row_orders["row-sorted"])):
            reordered = list(call_args)
            reordered[[spec.name for spec in workload.definition.inputs].index("sparse_indices")] = ids
            row[f"solution {order}"] = time_us(lambda i, reordered=reordered: sa.sparse_attention(*reordered, outs["output"], outs["lse"]))
        valid = int((indices >= 0).sum())
        ckv, kpe = inputs["ckv_cache"], inputs["kpe_cache"]
        # the kernels address rows as id * row bytes; contiguous ids need T * 2048 rows of cache
        assert ckv.is_contiguous() and kpe.is_contiguous(), "gather_floor: the generated caches are contiguous"
        assert ckv.shape[0] * ckv.shape[1] >= indices.numel(), "gather_floor: too few cache rows for consecutive ids"
        sink = torch.zeros(indices.shape[0] * TOPK, dtype=torch.int32, device=device)
        print(f"{case.id}: T={indices.shape[0]}, {valid} valid slots, {valid * 1152 / 1e6:.1f} MB with kpe")
        for name, us in row.items():
            print(f"  {name:40s} {us:7.2f} µs")
        for order in ("as-is", "program-sorted", "row-sorted", "contiguous"):
            for mode, splits in (("bulk", 16), ("bulk", 32), ("bulk", 64), ("rows", 16), ("rows_sleep", 16), ("ldg", 16), ("ldg", 64)):
                ids = program_sorted(indices, splits) if order == "program-sorted" else per_row_orders[order]
                for with_kpe in (True, False):
                    us = time_us(lambda i, ids=ids, mode=mode, splits=splits, with_kpe=with_kpe: ext.gather(ckv, kpe, ids, splits, mode, with_kpe, sink))
                    if mode != "ldg":  # ldg keeps a checksum, not a copy
                        check_copied(sink, ids, ckv, splits)
                    name = f"{order} {mode} S={splits} {'ckv+kpe' if with_kpe else 'ckv only'}"
                    row[name] = us
                    rate = valid * (1152 if with_kpe else 1024) / (us * 1e-6) / 1e12
                    print(f"  {name:40s} {us:7.2f} µs  {rate:5.2f} TB/s", flush=True)
        results[case.id] = row
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"timer": timer.name, "gpu": torch.cuda.get_device_name(device), "us": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
