#!/usr/bin/env python
"""Time the indexer side by side on a CUDA GPU: reference, triton solution, serial and plain pipelines.

    python benchmarks/kernels/indexer.py --out results/bench_indexer.json [--case 'indexer_12*'] [--timer auto]

For every case of the workload (default ``workloads/indexer_h64.yaml``, 128 cases) and every
trial, it builds fresh rotating input sets (>= 3) with ``dsa_bench.workloads.build_inputs``,
checks the outputs of the triton solution and of the serial and plain pipelines with the harness
checker on every set, then times four pipelines in this one process with ``dsa_bench.timing.bench.bench``
(the harness's protocol: outputs re-poisoned, then the L2 flushed, before every call):

- ``reference``: ``dsa_bench.definitions.indexer.reference`` (the batched PyTorch reference),
- ``triton``: the solution entry (passthrough / Triton score kernel + CUDA filtered top-k as
  its programmatic dependent launch),
- ``serial``: the same kernels, the top-k launched after the score kernel has ended (what the
  dependent launch buys; ``serial_pipeline``),
- ``plain``: the same passthrough and score kernel, then ``torch.topk`` and the Triton emit
  kernel (what the CUDA top-k buys; ``plain_pipeline`` builds it from the entry's parts).

Timing uses CUPTI when the ``cupti`` module imports (first kernel start to last kernel end of
each call), else CUDA events, and says so in the table and the JSON. Each trial is one ``bench``
call on that trial's fresh input sets; a pipeline's latency is the harness's statistic over its
trials (``BenchResult.mean_ms``: each trial's median, averaged), so it compares with
``dsa-bench run``. It also times the score kernel alone in a few tile variants
(``--no-variants`` skips this) and reports each variant's worst score error against the
reference scores and whether its top-k still passes the checker. Prints a per-case table and the means over passthrough cases, scored
cases, all cases, and the largest case; writes everything as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dsa_bench.definitions import indexer
from dsa_bench.definitions.base import Tolerance, poison_
from dsa_bench.definitions.checks import judge
from dsa_bench.results.environment import environment
from dsa_bench.results.records import now_iso
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution
from dsa_bench.timing import choose_timer, make_timer
from dsa_bench.timing.bench import BenchResult, bench
from dsa_bench.timing.events import HostClockTimer
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]

#: H200 targets of the fast solution, in microseconds
TARGETS_US = {"passthrough_mean": 3.0, "all_mean": 5.0, "largest": 12.0}  # issue 22 (all_mean, largest)
PIPELINES = ("reference", "triton", "serial", "plain")
TOPK_ALONE = "cuda_topk_alone"
TOPK_RADIX_ONLY = "cuda_topk_radix_only"  # the top-k alone with its fast path turned off


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    p.add_argument("--workload", type=Path, default=ROOT / "workloads" / "indexer_h64.yaml")
    p.add_argument("--solution", type=Path, default=ROOT / "solutions" / "triton")
    p.add_argument("--case", action="append", default=[], help="case id or glob (repeatable); default: all")
    p.add_argument("--timer", choices=("auto", "cupti", "events"), default="auto")
    p.add_argument("--seed", type=int, default=None, help="base seed (default: the workload's)")
    p.add_argument("--input-sets", type=int, default=3, help="rotating input sets per trial (>= 3)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--trials", type=int, default=3, help="trials per case, each with fresh input sets")
    p.add_argument("--no-variants", action="store_true", help="skip the score-kernel tile variants")
    p.add_argument(
        "--no-reference",
        action="store_true",
        help="time only the triton, serial and plain pipelines (the host-bound reference takes ~85 ms per timed call; "
        "`dsa-bench run` times it against the solution)",
    )
    p.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="exercise this script without a GPU: Triton interpreter, host wall-clock 'timings' (meaningless as numbers)",
    )
    args = p.parse_args()
    if args.input_sets < 3:
        p.error("--input-sets must be at least 3")
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: one trial of ``call(i)`` with ``prepare(i)`` before each call -> its samples (see trial_timer)
TimeTrial = Callable[..., BenchResult]


def trial_timer(device: torch.device, timer: str | None, warmup: int, iterations: int) -> TimeTrial:
    """How one trial is timed: on a GPU ``bench`` with the harness's protocol (``timer`` as
    chosen once by ``choose_timer``, clean L2 flush before every call). ``bench`` needs CUDA, so a
    CPU dry run puts the host clock around the same calls instead: the script runs end to end, and
    its numbers, labelled host_clock, mean nothing."""
    if device.type == "cuda":
        return functools.partial(bench, device=device, warmup=warmup, iterations=iterations, trials=1, timer=timer)

    def host_clock(call: Callable[[int], object], *, prepare: Callable[[int], None]) -> BenchResult:
        for i in range(warmup):
            prepare(i)
            call(i)
        return BenchResult(HostClockTimer.name, [HostClockTimer().time_iterations(call, iterations, prepare, lambda i: None)])

    return host_clock


def time_pipeline(time_trial: TimeTrial, fn: Callable, sets: list[list[torch.Tensor]], outs: list[torch.Tensor]) -> BenchResult:
    """One trial of ``fn(*set, out)`` over rotating sets, the output re-poisoned before every call."""
    n = len(sets)
    return time_trial(lambda i: fn(*sets[i % n], outs[i % n]), prepare=lambda i: poison_(outs[i % n]))


def reference_dps(q, cache, weights, seq_lens, block_table, topk_indices) -> None:
    topk_indices.copy_(indexer.reference(q, cache, weights, seq_lens, block_table)["topk_indices"])


def check(definition, axes, inputs, expected, out: torch.Tensor, device) -> str | None:
    result = judge(definition, axes, inputs, {"topk_indices": out}, expected, Tolerance(), device)
    return None if result.passed else f"{result.status.value}: {result.message}"


def serial_pipeline(module) -> Callable:
    """The solution's own kernels with the CUDA top-k launched after the score kernel has ended
    (no programmatic dependent launch): what the dependent launch buys."""
    topk = solution_part(module, "cuda_topk")
    select = topk.filtered_topk if module.USE_CUDA_TOPK else module.portable_topk
    return functools.partial(module.run_pipeline, module.scored_pipeline(select, dependent=False))


def plain_pipeline(module) -> Callable:
    """The benchmark's middle column: the entry's checks, passthrough and score kernel, with
    ``torch.topk`` + the Triton emit kernel (``portable_topk``) as the top-k, graphed on a GPU
    like the entry. It isolates what the CUDA top-k buys over torch.topk."""
    return functools.partial(module.run_pipeline, module.scored_pipeline(module.portable_topk))


def solution_part(module, name: str):
    """A sibling module of the indexer entry ``module`` (e.g. ``triton_kernels``, ``cuda_topk``)."""
    return importlib.import_module(f"{module.__package__}.{name}")


def score_variants(policy) -> dict[str, Any]:
    """Score-kernel tiles worth comparing on the GPU ("policy": the solution's choice per call)."""
    return {
        "policy": None,
        "p1_w4": policy.GPU_SCORE_TILE,
        "p2_w4": policy.ScoreTile(pages=2, num_warps=4, dot="fp8"),
        "loop2_st2": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=2, num_stages=2),
        "loop3_st2": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=3, num_stages=2),
        "loop3_st3": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=3, num_stages=3),
        "loop4_st2": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=4, num_stages=2),
        "loop5_st2": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=5, num_stages=2),
        "loop4_st3": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=4, num_stages=3),
        "loop8_st3": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=8, num_stages=3),
        "loop4_st3_w8": policy.ScoreTile(pages=1, num_warps=8, dot="fp8", loop_pages=4, num_stages=3),
        # rows first in launch order
        "p1_w4_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", rows_first=True),
        "loop2_st2_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=2, num_stages=2, rows_first=True),
        "loop2_st3_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=2, num_stages=3, rows_first=True),
        "loop3_st3_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=3, num_stages=3, rows_first=True),
        "loop3_st2_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=3, num_stages=2, rows_first=True),
        "loop4_st3_rf": policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=4, num_stages=3, rows_first=True),
        # the exact fp16 dot of the earlier policy, beside the FP8 one
        "p1_w4_fp16": policy.ScoreTile(pages=1, num_warps=4, dot="fp16"),
        "loop4_st2_fp16": policy.ScoreTile(pages=1, num_warps=4, dot="fp16", loop_pages=4, num_stages=2),
    }


def run_variants(module, time_trial: TimeTrial, definition, axes, sets_inputs, expected0, device) -> dict[str, Any]:
    """Score kernel alone per tile variant: latency, worst score error, and checker verdict."""
    kernels, topk = solution_part(module, "triton_kernels"), solution_part(module, "cuda_topk")
    results = {}
    first = sets_inputs[0]
    batch, max_pages = first["block_table"].shape
    ref_rows = {b: s for b, s in enumerate(expected0) if s is not None}  # ScoredRow: reference scores, tie tolerance
    for name, tile in score_variants(solution_part(module, "policy")).items():
        buffers = [torch.empty((batch, max_pages * 64), dtype=torch.float32, device=device) for _ in sets_inputs]
        args = [[inp[spec.name] for spec in definition.inputs] for inp in sets_inputs]

        def launch(*a, tile=tile):
            *inputs, scores = a
            kernels.launch_scores(*inputs, scores, skip_short_rows=True, tile=tile)

        try:
            ms = time_pipeline(time_trial, launch, args, buffers).mean_ms
        except Exception as exc:  # noqa: BLE001 -- a variant that fails to compile on this GPU is reported, not fatal
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        scores = torch.empty((batch, max_pages * 64), dtype=torch.float32, device=device)
        kernels.launch_scores(*args[0], scores, skip_short_rows=True, tile=tile)
        worst = worst_vs_tolerance = 0.0
        for b, row in ref_rows.items():
            ref = row.scores
            n = ref.numel()
            error = float((scores[b, :n] - ref).abs().max())
            worst = max(worst, error / max(float(ref.abs().max()), 1e-30))
            worst_vs_tolerance = max(worst_vs_tolerance, 2 * error / max(row.tie_tolerance, 1e-30))
        out = torch.empty((batch, 2048), dtype=torch.int32, device=device)
        poison_(out)
        if module.USE_CUDA_TOPK:
            topk.filtered_topk(scores, first["seq_lens"], first["block_table"], out)
        else:
            module.portable_topk(scores, first["seq_lens"], first["block_table"], out)
        problem = check(definition, axes, first, expected0, out, device)
        results[name] = {"us": ms * 1e3, "max_score_error_rel": worst, "twice_error_over_tie_tolerance": worst_vs_tolerance,
                         "topk_passes_checker": problem is None, "problem": problem}  # fmt: skip
    if module.USE_CUDA_TOPK:
        # The CUDA top-k alone, on score buffers the default score kernel filled beforehand.
        score_sets = []
        for a, inp in zip(args, sets_inputs, strict=True):
            scores = torch.empty((batch, max_pages * 64), dtype=torch.float32, device=device)
            kernels.launch_scores(*a, scores, skip_short_rows=True)
            score_sets.append([scores, inp["seq_lens"], inp["block_table"]])
        outs = [torch.empty((batch, 2048), dtype=torch.int32, device=device) for _ in score_sets]
        ms = time_pipeline(time_trial, topk.filtered_topk, score_sets, outs).mean_ms
        results[TOPK_ALONE] = {"us": ms * 1e3}
        radix_only = functools.partial(topk.filtered_topk, fast_candidates=0)
        ms = time_pipeline(time_trial, radix_only, score_sets, outs).mean_ms
        results[TOPK_RADIX_ONLY] = {"us": ms * 1e3}
    return results


def fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:9.2f}"


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main() -> int:
    args = parse_args()
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the solution's kernels are defined
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("indexer: needs a CUDA GPU (torch.cuda.is_available() is False); --cpu-dry-run tests the script", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    workload = load_workload(args.workload)
    definition = workload.definition
    if definition.name != indexer.NAME:
        print(f"indexer: {args.workload} is a workload of {definition.name}, not the indexer", file=sys.stderr)
        return 2
    cases = [c for c in workload.cases if not args.case or any(fnmatch.fnmatchcase(c.id, pat) for pat in args.case)]
    if not cases:
        print("indexer: no case matches", file=sys.stderr)
        return 2
    seed = workload.settings.seed if args.seed is None else args.seed

    solution = load_solution(args.solution)
    triton_fn, module = import_entry(solution, indexer.NAME)  # builds the CUDA top-k on first use
    pipelines: dict[str, Callable] = {"reference": reference_dps, "triton": triton_fn, "serial": serial_pipeline(module),
                                      "plain": plain_pipeline(module)}  # fmt: skip
    timed = [name for name in PIPELINES if not (args.no_reference and name == "reference")]

    if device.type == "cuda":
        timer_name, warning = choose_timer(args.timer, device)  # once, so a fallback warns once
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        label = make_timer(timer_name).name
    else:
        timer_name, label = None, HostClockTimer.name
    time_trial = trial_timer(device, timer_name, args.warmup, args.iterations)
    print(f"{workload.name}: {len(cases)} cases, {args.trials} trial(s) x {args.iterations} iterations, "
          f"{args.input_sets} rotating input sets, cold L2, timer: {label}")  # fmt: skip
    print(f"solution notes: {module.solution_notes()}")

    records = []
    failures = []
    started = time.perf_counter()
    for case in cases:
        axes = definition.axes(case.axes)
        batch, max_pages = axes["batch_size"], axes["max_num_pages"]
        per_trial: dict[str, list[list[float]]] = {name: [] for name in timed}  # each trial's samples, ms
        problems: list[str] = []
        variants = None
        total_tokens = 0
        for trial in range(args.trials):
            seeds = [derive_seed(seed, case.id, "bench", trial, s) for s in range(args.input_sets)]
            sets_inputs = [build_inputs(definition, case, s, device) for s in seeds]
            expected = [definition.expect(inp) for inp in sets_inputs]
            total_tokens = int(sets_inputs[0]["seq_lens"].sum())
            sets = [[inp[spec.name] for spec in definition.inputs] for inp in sets_inputs]
            outs = [torch.empty((batch, indexer.TOPK), dtype=torch.int32, device=device) for _ in sets]
            # Correctness first: every set, both of our pipelines, through the harness checker.
            for name in ("triton", "serial", "plain"):
                for k, (inp, out) in enumerate(zip(sets_inputs, outs, strict=True)):
                    poison_(out)
                    pipelines[name](*sets[k], out)
                    synchronize(device)
                    problem = check(definition, axes, inp, expected[k], out, device)
                    if problem:
                        problems.append(f"{name} trial {trial} set {k} (seed {seeds[k]}): {problem}")
            for name in timed:
                per_trial[name] += time_pipeline(time_trial, pipelines[name], sets, outs).samples_ms
            # The last timed triton outputs must still be right (no stale-result shortcuts).
            k = (args.iterations - 1) % len(sets)
            poison_(outs[k])
            triton_fn(*sets[k], outs[k])
            problem = check(definition, axes, sets_inputs[k], expected[k], outs[k], device)
            if problem:
                problems.append(f"triton after timing, trial {trial}: {problem}")
            if trial == 0 and not args.no_variants and max_pages * 64 > indexer.TOPK:
                variants = run_variants(module, time_trial, definition, axes, sets_inputs, expected[0], device)
            del sets_inputs, expected, sets, outs
        if device.type == "cuda":
            torch.cuda.empty_cache()
        over_trials = {name: BenchResult(label, samples) for name, samples in per_trial.items()}
        us = {name: result.mean_ms * 1e3 for name, result in over_trials.items()}
        record = {
            "case": case.id,
            "batch_size": batch,
            "max_num_pages": max_pages,
            "kind": "passthrough" if max_pages * 64 <= indexer.TOPK else "scored",
            "tokens": total_tokens,
            "us": us,
            "trial_us": {name: [v * 1e3 for v in result.trial_medians_ms] for name, result in over_trials.items()},
            "speedup_vs_reference": us["reference"] / us["triton"] if "reference" in us else None,
            "passed": not problems,
            "problems": problems,
        }
        if variants is not None:
            record["score_variants"] = variants
        records.append(record)
        failures += [f"{case.id}: {p}" for p in problems]
        status = "ok" if not problems else "FAILED"
        print(f"{case.id:24s} B={batch:2d} pages={max_pages:3d} {record['kind']:11s} ref {fmt_us(us.get('reference'))}  "
              f"triton {fmt_us(us['triton'])}  serial {fmt_us(us['serial'])}  plain {fmt_us(us['plain'])} µs  "
              f"x{record['speedup_vs_reference'] or float('nan'):8.1f}  {status}")  # fmt: skip
        if variants is not None:
            print(
                "    alone: "
                + "  ".join(
                    f"{n}={v['us']:.2f}"
                    + (f"({v['twice_error_over_tie_tolerance']:.2f}t)" if "twice_error_over_tie_tolerance" in v else "")
                    for n, v in variants.items()
                    if "us" in v
                )
            )

    def group_mean(kind: str | None, pipeline: str) -> float | None:
        return mean([r["us"][pipeline] for r in records if kind is None or r["kind"] == kind])

    largest = max(records, key=lambda r: (r["batch_size"] * r["max_num_pages"], r["tokens"]))
    summary: dict[str, Any] = {}
    for pipeline in timed:
        summary[pipeline] = {
            "passthrough_mean_us": group_mean("passthrough", pipeline),
            "scored_mean_us": group_mean("scored", pipeline),
            "all_mean_us": group_mean(None, pipeline),
            "largest_us": largest["us"][pipeline],
        }
    speedups = [r["speedup_vs_reference"] for r in records if r["speedup_vs_reference"] is not None]
    summary["triton_speedup_mean"] = mean(speedups)
    summary["triton_speedup_geomean"] = float(torch.tensor(speedups).log().mean().exp()) if speedups else None
    summary["largest_case"] = largest["case"]
    t = summary["triton"]
    summary["targets_us"] = TARGETS_US
    summary["targets_met"] = {
        "passthrough_mean": t["passthrough_mean_us"] is None or t["passthrough_mean_us"] <= TARGETS_US["passthrough_mean"],
        "all_mean": t["all_mean_us"] <= TARGETS_US["all_mean"],
        "largest": t["largest_us"] <= TARGETS_US["largest"],
    }

    print()
    print(f"means in µs (timer: {label}; per case the harness's statistic: each trial's median over iterations, averaged)")
    print(f"{'':24s} " + " ".join(f"{p:>12s}" for p in PIPELINES))
    rows = [("passthrough cases", "passthrough_mean_us"), ("scored cases", "scored_mean_us"), (f"all {len(records)} cases", "all_mean_us"),
            (f"largest ({largest['case']})", "largest_us")]  # fmt: skip
    for title, key in rows:
        print(f"{title:24s} " + " ".join(f"{fmt_us(summary[p][key]) if p in summary else '-':>12s}" for p in PIPELINES))
    if speedups:
        print(
            f"triton speedup over reference: mean {summary['triton_speedup_mean']:.1f}x, geomean {summary['triton_speedup_geomean']:.1f}x"
        )
    print(
        "targets (H200): " + ", ".join(f"{k} <= {v} µs: {'met' if summary['targets_met'][k] else 'MISSED'}" for k, v in TARGETS_US.items())
    )
    variant_rows = [r for r in records if "score_variants" in r]
    if variant_rows:
        print("\nscore kernel alone, mean over scored cases (µs), worst relative score error, checker passes:")
        for name in score_variants(solution_part(module, "policy")):
            ok = [r["score_variants"][name] for r in variant_rows if "us" in r["score_variants"].get(name, {})]
            if not ok:
                print(f"  {name:24s} failed: {variant_rows[0]['score_variants'][name].get('error')}")
                continue
            print(f"  {name:24s} {mean([v['us'] for v in ok]):8.2f}   {max(v['max_score_error_rel'] for v in ok):.2e}   "
                  f"{sum(v['topk_passes_checker'] for v in ok)}/{len(ok)}")  # fmt: skip
        for key, title in ((TOPK_ALONE, "(CUDA top-k alone)"), (TOPK_RADIX_ONLY, "(top-k, radix only)")):
            alone = [r["score_variants"][key]["us"] for r in variant_rows if key in r["score_variants"]]
            if alone:
                print(f"  {title:24s} {mean(alone):8.2f}")

    document = {
        "format": "dsa-bench-indexer-bench",
        "version": 1,
        "created": now_iso(),
        "workload": str(args.workload),
        "solution": str(args.solution),
        "solution_notes": module.solution_notes(),
        "timer": label,
        "settings": {
            "seed": seed,
            "input_sets": args.input_sets,
            "warmup": args.warmup,
            "iterations": args.iterations,
            "trials": args.trials,
        },
        "environment": environment(device),
        "wall_s": time.perf_counter() - started,
        "summary": summary,
        "records": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1))
    print(f"\nwrote {args.out}")
    if failures:
        print(f"{len(failures)} correctness failure(s):", file=sys.stderr)
        for line in failures[:20]:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
