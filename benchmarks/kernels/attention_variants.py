#!/usr/bin/env python
"""Time variants of the sparse-attention solution's CUDA kernel on a CUDA GPU.

    python benchmarks/kernels/attention_variants.py [--case 'attention_1*'] [--variant default --variant cuda_s16]
                                                    [--iterations 30] [--trials 1] [--timer auto] [--out results/attn_variants.json]

For every case of ``workloads/sparse_attention_h16.yaml`` it builds two input sets with the
harness's own generator, checks each variant's outputs with the harness checker on both (a
failing variant is reported FAIL and not timed), then times the variants in this one process
with ``dsa_bench.timing.bench.bench``: outputs re-poisoned and the L2 flushed before every
call, the two input sets alternating, and the harness's statistic (each trial's median over
iterations, averaged over ``--trials``). Timing uses CUPTI when the ``cupti`` module imports
(first kernel start to last kernel end of each call, as ``dsa-bench run`` does), else CUDA
events, and the table says which.

A variant maps a token count T to a ``Plan`` of the CUDA kernel (path, splits, gather lag) or
to None where it does not apply.
The table shows microseconds per case and variant; below it, per variant, the mean over all
cases, over T <= 2 and T >= 3, and the T = 8 full-row cases, against the targets (mean <= 10 us,
T = 8 full <= 12 us). The last lines name the fastest variant per case and overall: use them to
set the defaults in solutions/triton/attention/policy.py (cuda_plan and its CUDA_POLICY_* constants).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import poison_
from dsa_bench.definitions.checks import judge
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution as load_solution_folder
from dsa_bench.timing import choose_timer, make_timer
from dsa_bench.timing.bench import bench
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]

TARGET_MEAN_US = 10.0
TARGET_T8_FULL_US = 12.0


def load_solution():
    """The solution's sparse-attention entry, plan and cuda modules, imported the way the harness imports them."""
    entry = import_entry(load_solution_folder(ROOT / "solutions" / "triton"), attn.NAME)[1]
    return entry, importlib.import_module(f"{entry.__package__}.policy"), importlib.import_module(f"{entry.__package__}.cuda")


#: The CUDA kernel's fixed plans listed by default (cuda_variant_plan builds any other such name).
CUDA_VARIANTS = (
    "cuda_s8", "cuda_s16", "cuda_s32", "cuda_s64", "cuda_s16_lag2000", "cuda_s16_landed",
    "cluster_s8", "cluster_s16", "cluster_s16_lag2000", "cluster_s16_landed",
)
_CUDA_VARIANT = re.compile(r"(cuda|cluster)_s(\d+)(?:_lag(\d+)|_(landed))?")


def fixed(plan) -> Callable[[int], object]:
    """A variant that uses ``plan`` at every token count."""
    return lambda T: plan


def cuda_variant_plan(plans, cuda_ext, name: str):
    """The plan a CUDA variant name spells: ``cuda_s16`` (barrier, 16 splits), ``cluster_s8``,
    ``cuda_s16_lag2000`` (gather lag of 2000 cycles), ``cluster_s16_landed``; None when the name
    is not one."""
    match = _CUDA_VARIANT.fullmatch(name)
    if match is None:
        return None
    kind, splits, lag, landed = match.groups()
    gather_lag = cuda_ext.GATHER_LAG_ON_LANDING if landed else int(lag or 0)
    return plans.cuda_kernel_plan("cuda" if kind == "cuda" else "cuda_cluster", int(splits), gather_lag)


def variants(plans, cuda_ext, resident: int, default: Callable[[int], object]) -> dict[str, Callable[[int], object]]:
    """name -> (T -> Plan, or None where the variant does not apply).

    ``default`` is the entry's GPU policy (the CUDA kernel), given by the caller; ``resident``
    the CUDA kernel's co-resident programs; ``cuda_two_launch`` the policy's split counts with
    the combine always in a second launch; ``cuda_s*`` fix its split count (a grid that is not
    co-resident launches the combine separately), ``cluster_s*`` its split count with the
    cluster combine, ``*_lagN`` its gather lag (N cycles; ``landed``: each tile once the one
    before has landed). Any such name is accepted, not only those of CUDA_VARIANTS (see
    cuda_variant_plan).
    """
    table = {"default": default, "cuda_two_launch": lambda T: plans.cuda_plan(T, resident, force_two_launch=True)}
    return with_named(plans, cuda_ext, table, list(CUDA_VARIANTS))


def with_named(plans, cuda_ext, table: dict[str, Callable[[int], object]], names: list[str]) -> dict[str, Callable[[int], object]]:
    """``table`` plus the CUDA variants among ``names`` it lacks (cuda_variant_plan); unknown names are left out."""
    extra = {name: cuda_variant_plan(plans, cuda_ext, name) for name in names if name not in table}
    return table | {name: fixed(plan) for name, plan in extra.items() if plan is not None}


def unknown_names(table: dict[str, Callable[[int], object]], names: list[str]) -> int:
    """0 when every requested name is in ``table``; else says which are not and returns 2."""
    unknown = sorted(set(names) - set(table))
    if unknown:
        print(f"unknown variant(s) {unknown}; known: {', '.join(table)}, or any cuda_sN / cluster_sN [_lagN | _landed]", file=sys.stderr)
        return 2
    return 0


def list_plans(table: dict[str, Callable[[int], object]], names: list[str], tokens: list[int]) -> None:
    for name in names:
        print(name)
        for T in tokens:
            plan = table[name](T)
            print(f"  T={T}: {plan}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", type=Path, default=ROOT / "workloads" / "sparse_attention_h16.yaml")
    p.add_argument("--case", action="append", default=[], help="case id or glob (repeatable); default: all")
    p.add_argument("--variant", action="append", default=[], help="variant name (repeatable); default: all")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--trials", type=int, default=1, help="trials per variant and case (the harness's default is 3)")
    p.add_argument("--timer", default="auto", choices=("auto", "cupti", "events"))
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    p.add_argument("--list", action="store_true", help="print each variant's plan per token count and exit (no GPU needed)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.list:
        _, plans, cuda_ext = load_solution()
        if torch.cuda.is_available():
            resident, default = cuda_ext.resident_programs(), lambda T: plans.default_plan(T, torch.device("cuda"))
        else:  # the H200's figures: 132 programs, 7 clusters of 16
            resident, default = 132, lambda T: plans.cuda_plan(T, 132, 7)
        table = with_named(plans, cuda_ext, variants(plans, cuda_ext, resident, default), args.variant)
        if unknown_names(table, args.variant):
            return 2
        list_plans(table, args.variant or list(table), [1, 2, 6, 7, 8])
        return 0
    if not torch.cuda.is_available():
        print("attention_variants: needs a CUDA GPU (--list works without one)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    entry, plans, cuda_ext = load_solution()
    resident = cuda_ext.resident_programs()
    all_variants = with_named(plans, cuda_ext, variants(plans, cuda_ext, resident, lambda T: plans.default_plan(T, device)), args.variant)
    chosen = {k: v for k, v in all_variants.items() if not args.variant or k in args.variant}
    if unknown_names(all_variants, args.variant):
        return 2
    workload = load_workload(args.workload)
    cases = [c for c in workload.cases if not args.case or any(fnmatch.fnmatch(c.id, g) for g in args.case)]
    timer_name, warning = choose_timer(args.timer, device)  # once, so a fallback warns once
    if warning:
        print(f"warning: {warning}")
    label = make_timer(timer_name).name
    print(f"{torch.cuda.get_device_name(device)}, {resident} co-resident programs, "
          f"resident clusters {({s: cuda_ext.resident_clusters(s) for s in (8, 16)})}, "
          f"timer {label}, {args.trials} trial(s) x {args.iterations} iterations (harness statistic), cold L2")

    results: dict[str, dict[str, float | str]] = {}
    for case in cases:
        seeds = [derive_seed(workload.settings.seed, case.id, "variants", k) for k in range(2)]
        sets = [build_inputs(workload.definition, case, seed, device) for seed in seeds]
        axes = workload.definition.axes(case.axes)
        T = axes["num_tokens"]
        expected = [attn.expect(inputs) for inputs in sets]
        outs = [workload.definition.allocate_outputs(axes, device) for _ in sets]
        row: dict[str, float | str] = {}
        for name, make in chosen.items():
            plan = make(T)
            if plan is None:
                row[name] = "-"
                continue
            args_of = [workload.definition.input_args(inputs) for inputs in sets]

            def call(i: int, args_of=args_of, outs=outs, plan=plan) -> None:
                k = i % len(args_of)
                entry.sparse_attention(*args_of[k], outs[k]["output"], outs[k]["lse"], plan=plan)

            def poison(i: int, outs=outs) -> None:  # as the harness does before every call
                for out in outs[i % len(outs)].values():
                    poison_(out)

            try:
                failed = None
                for k in range(len(sets)):
                    poison(k)
                    call(k)
                    torch.cuda.synchronize()
                    verdict = judge(workload.definition, axes, sets[k], outs[k], expected[k], workload.settings.tolerance, device)
                    failed = failed or (None if verdict.passed else verdict)
                if failed is not None:
                    row[name] = "FAIL"
                    print(f"  {case.id} {name} {plan}: {failed.status.value} {failed.message}")
                    continue
                timed = bench(
                    call,
                    device=device,
                    warmup=args.warmup,
                    iterations=args.iterations,
                    trials=args.trials,
                    prepare=poison,
                    timer=timer_name,
                )
                row[name] = timed.mean_ms * 1000.0
            except Exception as exc:  # noqa: BLE001 - a variant that does not compile or launch here is reported, not fatal
                row[name] = "ERR"
                print(f"  {case.id} {name} {plan}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        results[case.id] = row
        counts = case.inputs["sparse_indices"].params.get("valid_counts", []) if "sparse_indices" in case.inputs else []
        print(
            f"{case.id:24s} T={T} valid={counts if len(counts) <= 2 else f'{min(counts)}..{max(counts)}'}  "
            + "  ".join(f"{n}={v:.1f}" if isinstance(v, float) else f"{n}={v}" for n, v in row.items()),
            flush=True,
        )

    print_table(results, list(chosen), {c.id: c.axes["num_tokens"] for c in cases}, label)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"timer": label, "gpu": torch.cuda.get_device_name(device), "us": results}, indent=1))
    return 0


def print_table(results: dict, names: list[str], tokens: dict[str, int], timer: str) -> None:
    from tabulate import tabulate

    def fmt(v):
        return f"{v:.1f}" if isinstance(v, float) else v

    rows = [[case, tokens[case], *[fmt(results[case].get(n, "")) for n in names]] for case in results]

    def mean_over(name: str, pick: Callable[[str], bool]) -> str:
        vals = [results[c].get(name) for c in results if pick(c)]
        if not vals:
            return ""
        if any(v in ("FAIL", "ERR") for v in vals):
            return "FAIL"
        # a variant that does not apply to a case (None plan) takes the default's time there
        vals = [
            v if isinstance(v, float) else results[c].get("default") for c, v in zip([c for c in results if pick(c)], vals, strict=True)
        ]
        vals = [v for v in vals if isinstance(v, float)]
        return f"{statistics.fmean(vals):.2f}" if vals else ""

    summaries = {
        "mean (all)": lambda c: True,
        "mean T<=2": lambda c: tokens[c] <= 2,
        "mean T>=3": lambda c: tokens[c] >= 3,
        "T=8 full": lambda c: tokens[c] == 8 and "full" in c,
    }
    rows.append(["-" * 8, "", *["" for _ in names]])
    for label, pick in summaries.items():
        rows.append([label, "", *[mean_over(n, pick) for n in names]])
    print()
    print(f"latency in µs ({timer}, harness statistic, cold L2); '-' = variant not applicable (its means use 'default' there)")
    print(tabulate(rows, headers=["case", "T", *names], disable_numparse=True))
    print(f"targets: mean (all) <= {TARGET_MEAN_US} µs, T=8 full <= {TARGET_T8_FULL_US} µs")
    best_per_case = {}
    for case, row in results.items():
        timed = {n: v for n, v in row.items() if isinstance(v, float)}
        if timed:
            best = min(timed, key=timed.get)
            best_per_case[case] = best
            print(f"  fastest for {case}: {best} ({timed[best]:.1f} µs; default {fmt(row.get('default', ''))})")
    oracle = [
        min(v for v in row.values() if isinstance(v, float)) for row in results.values() if any(isinstance(v, float) for v in row.values())
    ]
    if oracle:
        print(f"mean if every case took its fastest variant: {statistics.fmean(oracle):.2f} µs")


if __name__ == "__main__":
    sys.exit(main())
