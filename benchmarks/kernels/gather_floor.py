#!/usr/bin/env python
"""The gather floor of the sparse attention on a CUDA GPU: gather-only kernels against the solution.

    python benchmarks/kernels/gather_floor.py [--case attention_18_t8_full] [--iterations 30] [--trials 1] [--out results/gather_floor.json]

For the chosen cases of ``workloads/sparse_attention_h16.yaml`` (inputs from the harness's own
generator) it times with ``dsa_bench.timing.bench.bench`` (the harness's timer, clean L2 flush
before every call, the harness's statistic: each trial's median over iterations, averaged):
  - the solution's sparse attention under its default plan (the whole call), also on the ids
    reordered as below (the result is the same: a row's slots may come in any order);
  - gather-only kernels (gather_floor.cu, beside this script) that fetch exactly the rows that call fetches,
    by bulk copies (all of a program's rows at once; on one mbarrier, or one per row polled as
    the attention kernel does) or by 16-byte loads, with and without the
    kpe rows, at several split counts;
  - the same gathers with the slot ids reordered: each program's slots sorted by address
    ("program-sorted", what a program could do for itself), the token's whole row sorted
    ("row-sorted"), and consecutive rows ("contiguous", the streaming floor).
Each line gives µs and the rate of the bytes fetched (valid rows x 1152 B, or x 1024 B without kpe).

    python benchmarks/kernels/gather_floor.py --per-sm [--case attention_18_t8_full] [--iterations 30] [--splits 16]

instead asks whether some SMs are systematically slow: the bulk gather (all of a program's rows
at once, as-is ids) stamps each program's SM and when its rows landed, over the iterations (cold
L2). It prints when the median and the last program of a call landed, the spread of the per-SM
mean landing times against the calls' own scatter on one SM, how well two halves of the calls
agree on which SMs are slow (a correlation near 1: systematic, near 0: chance), and the slowest
and fastest SMs (``landing_summary``). These are the kernel's own stamps, not a timer's: that
mode flushes the L2 before each call itself and does not go through ``bench``.

``tools/measure_harness.py l2-flush`` imports this file for ``build_gather_extension`` and
``generated_inputs``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution
from dsa_bench.timing import choose_timer, make_timer
from dsa_bench.timing.bench import bench
from dsa_bench.timing.flush import L2Flusher
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]
GATHER_KERNELS = Path(__file__).resolve().with_name("gather_floor.cu")
TOPK = 2048


def build_gather_extension():
    from torch.utils.cpp_extension import load

    return load(name="dsa_gather_floor", sources=[str(GATHER_KERNELS)], extra_cuda_cflags=["-O3", "-arch=sm_90a"])


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


def generated_inputs(workload, case, device: torch.device) -> dict[str, torch.Tensor]:
    """The case's inputs from the harness's generator, with this tool's own seed."""
    return build_inputs(workload.definition, case, derive_seed(workload.settings.seed, case.id, "gather_floor", 0), device)


def check_copied(sink: torch.Tensor, ids: torch.Tensor, ckv: torch.Tensor, splits: int) -> None:
    """The bulk kernels leave each program's first shared word in ``sink``: where the program's
    first slot is valid that is the first word of its ckv row, so the copies really happened."""
    first = ids[:, :splits].reshape(-1).long()  # slot s is the first of program s
    words = ckv.reshape(-1, ckv.shape[-1]).view(torch.int32)[:, 0]
    valid = first >= 0
    got, want = sink[: first.numel()][valid], words[first[valid]]
    assert torch.equal(got, want), f"gather kernel: {(got != want).sum().item()} programs hold the wrong first word"


def landing_summary(stamps: torch.Tensor) -> dict:
    """Per-SM landing statistics of bulk-gather stamps ``[calls, programs, LANDING_SLOTS]`` int64
    (slots: SM id, entry ns, entry cycles, landed cycles, landed ns; gather_floor.cu).

    A program's landing time is µs after its call's first entry: its entry (global timer) plus its
    own SM-clock span to the landing (the SM clock is fine-grained, the global timer is what is
    comparable across SMs). Returns "median"/"last" (medians over calls of the median and latest
    program), "sm_means" {sm: mean landing}, "between_sm" (std of the per-SM means), "within_sm"
    (mean over SMs of the std of their own calls), "halves_corr" (correlation of the per-SM means
    of the even and the odd calls) and "ghz".
    """
    st = stamps.double()
    ghz = float(((st[..., 3] - st[..., 2]) / (st[..., 4] - st[..., 1]).clamp(min=1)).median())
    landed = (st[..., 1] - st[..., 1].min(dim=1, keepdim=True).values) / 1e3 + (st[..., 3] - st[..., 2]) / ghz / 1e3
    sms = stamps[..., 0]
    per_sm: dict[int, list[float]] = {}
    for call in range(stamps.shape[0]):
        for sm, t in zip(sms[call].tolist(), landed[call].tolist(), strict=True):
            per_sm.setdefault(sm, []).append((call, t))
    means = {sm: statistics.fmean(t for _, t in v) for sm, v in per_sm.items()}
    within = [statistics.pstdev([t for _, t in v]) for v in per_sm.values() if len(v) > 1]
    halves = []
    for parity in (0, 1):
        halves.append(
            {sm: statistics.fmean(t for c, t in v if c % 2 == parity) for sm, v in per_sm.items() if any(c % 2 == parity for c, _ in v)}
        )
    common = sorted(set(halves[0]) & set(halves[1]))
    corr = statistics.correlation([halves[0][sm] for sm in common], [halves[1][sm] for sm in common]) if len(common) > 2 else float("nan")
    return {
        "ghz": ghz,
        "median": float(landed.median(dim=1).values.median()),
        "last": float(landed.max(dim=1).values.median()),
        "sm_means": means,
        "between_sm": statistics.pstdev(means.values()) if len(means) > 1 else 0.0,
        "within_sm": statistics.fmean(within) if within else 0.0,
        "halves_corr": corr,
    }


def per_sm_landing(args: argparse.Namespace, ext, workload, device: torch.device) -> int:
    """--per-sm: the bulk gather's landing stamps per SM (see landing_summary)."""
    flusher = L2Flusher(device)
    print(f"{torch.cuda.get_device_name(device)}, bulk gather with {args.splits} programs per token, as-is ids, cold L2, "
          f"{args.iterations} calls")
    results = {}
    for case_id in args.case or ["attention_18_t8_full"]:
        inputs = generated_inputs(workload, next(c for c in workload.cases if c.id == case_id), device)
        indices, ckv, kpe = inputs["sparse_indices"], inputs["ckv_cache"], inputs["kpe_cache"]
        programs = indices.shape[0] * args.splits
        sink = torch.zeros(programs, dtype=torch.int32, device=device)
        stamps = torch.zeros((args.iterations, programs, ext.LANDING_SLOTS), dtype=torch.int64, device=device)
        for i in range(args.iterations + 2):  # two warm-up calls, then one stamp set per call
            flusher.flush()
            ext.gather(ckv, kpe, indices, args.splits, "bulk", True, sink, stamps[max(i - 2, 0)])
        torch.cuda.synchronize()
        check_copied(sink, indices, ckv, args.splits)
        p = landing_summary(stamps.cpu())
        ranked = sorted(p["sm_means"].items(), key=lambda kv: kv[1])
        print(f"{case_id}: rows landed after the call's first entry, median program {p['median']:.2f} µs, last {p['last']:.2f} µs "
              f"({len(ranked)} SMs, {p['ghz']:.2f} GHz)")
        print(f"  per-SM mean landing: spread (std) {p['between_sm']:.2f} µs between SMs, {p['within_sm']:.2f} µs across one SM's calls; "
              f"even vs odd calls agree on the per-SM means with correlation {p['halves_corr']:.2f}")
        print("  slowest SMs: " + ", ".join(f"{sm} {t:.2f}" for sm, t in reversed(ranked[-10:])))
        print("  fastest SMs: " + ", ".join(f"{sm} {t:.2f}" for sm, t in ranked[:10]))
        results[case_id] = {k: v for k, v in p.items() if k != "sm_means"} | {"sm_means": {str(k): v for k, v in p["sm_means"].items()}}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(device), "per_sm": results}, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="case id (repeatable; default attention_18_t8_full)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--trials", type=int, default=1, help="trials per timing (the harness's default is 3)")
    parser.add_argument("--timer", default="auto")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--per-sm", action="store_true", help="per-SM landing stamps of the bulk gather instead of the timings")
    parser.add_argument("--splits", type=int, default=16, help="--per-sm: programs per token")
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
    if args.per_sm:
        return per_sm_landing(args, ext, workload, device)
    sa = import_entry(load_solution(ROOT / "solutions" / "triton"), attn.NAME)[1]  # as the harness imports it
    timer_name, warning = choose_timer(args.timer, device)  # once, so a fallback warns once
    if warning:
        print(f"warning: {warning}")
    label = make_timer(timer_name).name
    print(f"{torch.cuda.get_device_name(device)}, timer {label}, {args.trials} trial(s) x {args.iterations} iterations "
          "(harness statistic), cold L2")  # fmt: skip

    def time_us(call) -> float:
        return bench(call, device=device, warmup=3, iterations=args.iterations, trials=args.trials, timer=timer_name).mean_ms * 1000.0

    results: dict[str, dict[str, float]] = {}
    for case_id in args.case or ["attention_18_t8_full"]:
        case = known[case_id]
        inputs = generated_inputs(workload, case, device)
        axes = workload.definition.axes(case.axes)
        outs = workload.definition.allocate_outputs(axes, device)
        call_args = workload.definition.input_args(inputs)
        row: dict[str, float] = {}
        indices = inputs["sparse_indices"]
        # The attention is invariant under a reordering of a row's slots: the solution timed on
        # reordered ids shows what an in-kernel reordering could gain at most.
        per_row_orders = {"as-is": indices, "row-sorted": row_sorted(indices), "contiguous": contiguous(indices)}
        for order, ids in (
            ("as-is", indices),
            ("program-sorted", program_sorted(indices, 16)),
            ("row-sorted", per_row_orders["row-sorted"]),
        ):
            reordered = list(call_args)
            reordered[[spec.name for spec in workload.definition.inputs].index("sparse_indices")] = ids
            attention_args = (*reordered, outs["output"], outs["lse"])
            row[f"solution {order}"] = time_us(lambda i, attention_args=attention_args: sa.sparse_attention(*attention_args))
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
                    gather_args = (ckv, kpe, ids, splits, mode, with_kpe, sink)
                    us = time_us(lambda i, gather_args=gather_args: ext.gather(*gather_args))
                    if mode != "ldg":  # ldg keeps a checksum, not a copy
                        check_copied(sink, ids, ckv, splits)
                    name = f"{order} {mode} S={splits} {'ckv+kpe' if with_kpe else 'ckv only'}"
                    row[name] = us
                    rate = valid * (1152 if with_kpe else 1024) / (us * 1e-6) / 1e12
                    print(f"  {name:40s} {us:7.2f} µs  {rate:5.2f} TB/s", flush=True)
        results[case.id] = row
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"timer": label, "gpu": torch.cuda.get_device_name(device), "us": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
