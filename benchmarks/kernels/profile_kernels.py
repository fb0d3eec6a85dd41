#!/usr/bin/env python
"""Drive the triton solution's kernels for a profiler, and time how gather locality costs.

    ncu --nvtx --nvtx-include "profile/" --clock-control none [--section ...] \\
        python benchmarks/kernels/profile_kernels.py ncu [--case attention_18_t8_full --case indexer_127_b31_p91 ...]
        (any other workload's case as WORKLOAD:CASE, e.g. --case mla_decode_v32_h128:b128_sq2_k2048_h128)
    python benchmarks/kernels/profile_kernels.py locality [--iterations 30] [--trials 1]
    python benchmarks/kernels/profile_kernels.py cache [--case ...] [--iterations 30] [--trials 1]
    python benchmarks/kernels/profile_kernels.py topk [--iterations 30] [--trials 1]
    python benchmarks/kernels/profile_kernels.py phases [--case attention_18_t8_full ...] [--iterations 30]

(Not ``profile.py``: run as a script, its folder comes first on ``sys.path``, where a
``profile.py`` would stand in for the standard library's, which ``cProfile`` imports.)

``ncu`` mode builds each case's inputs with the harness generator, calls the solution entry
twice outside any range (compilation, CUDA-graph capture), then once more, with its kernels
launched directly, inside an NVTX range named ``profile``, so a profiler told to include only
that range sees exactly one call per case.

``locality``, ``cache`` and ``topk`` time with ``dsa_bench.timing.bench.bench`` (CUPTI when
available, else CUDA events) and print the harness's statistic: each trial's median over
``--iterations``, averaged over ``--trials``.

``locality`` mode times the default attention plan (cold L2) on the workload's full-row cases
twice: with the generated indices (slots spread over 8462 pages,
624 MB), and with the same indices folded onto the first 64 pages (4.7 MB). The difference is
what scattered pages cost beyond the bytes moved (DRAM page and TLB misses).

``phases`` mode reads the CUDA attention kernel's own phase stamps (run_attention_phases): the
kernel's clocks, not a timer, so it does not go through ``bench``.

``cache`` mode times the solution entry per case cold (L2 flushed), code-warm (flushed, then
one call on another input set of the same shapes) and warm (no flush): how much of a call is
fetching code and small shared data after a flush, and how much is its own data. Code-warm and
warm deliberately differ from the harness's protocol: ``bench`` runs them with ``l2_flush=None``
(code-warm flushes in its own ``prepare``, before the extra call).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from dsa_bench.definitions import indexer
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.run.loader import import_entry
from dsa_bench.solution import load_solution
from dsa_bench.timing import choose_timer, make_timer
from dsa_bench.timing.bench import bench
from dsa_bench.timing.flush import L2Flusher
from dsa_bench.workloads import build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_CASES = [
    "attention_02_t1_sparse", "attention_00_t1_full", "attention_20_t8_sparse", "attention_18_t8_full",
    "indexer_069_b1_p33", "indexer_080_b30_p33", "indexer_127_b31_p91",
]  # fmt: skip
WORKLOADS = {"attention": ROOT / "workloads" / "sparse_attention_h16.yaml", "indexer": ROOT / "workloads" / "indexer_h64.yaml"}
FOLDED_PAGES = 64


def chosen_timer(device: torch.device) -> tuple[str, str]:
    """(the timer ``bench`` is given, its name in results), chosen once so a fallback warns once."""
    name, warning = choose_timer("auto", device)
    if warning:
        print(f"warning: {warning}")
    return name, make_timer(name).name


def solution_module(definition_name: str, part: str = "entry"):
    """A module of the triton solution's folder for ``definition_name`` (``entry``, or a sibling
    of the entry such as ``cuda`` or ``policy``), imported the way the harness imports it."""
    entry = import_entry(load_solution(ROOT / "solutions" / "triton"), definition_name)[1]
    return entry if part == "entry" else importlib.import_module(f"{entry.__package__}.{part}")


def case_inputs(case_id: str, device: torch.device):
    """The definition, axes and generated inputs of a case: an attention or indexer case id, or
    ``WORKLOAD:CASE`` for a case of ``workloads/WORKLOAD.yaml``."""
    if ":" in case_id:
        name, case_id = case_id.split(":", 1)
        workload = load_workload(ROOT / "workloads" / f"{name}.yaml")
    else:
        workload = load_workload(WORKLOADS["attention" if case_id.startswith("attention") else "indexer"])
    case = next(c for c in workload.cases if c.id == case_id)
    inputs = build_inputs(workload.definition, case, derive_seed(workload.settings.seed, case.id, "profile"), device)
    axes = workload.definition.axes(case.axes)
    return workload.definition, axes, inputs


def direct_call(definition, axes, inputs, device):
    """The solution's kernels for one call, launched directly (no CUDA graph), as a closure."""
    outputs = definition.allocate_outputs(axes, device)
    args = definition.input_args(inputs)
    if definition.name == attn.NAME:
        sa = solution_module(attn.NAME)
        return lambda: sa.sparse_attention(*args, outputs["output"], outputs["lse"])
    if definition.name != indexer.NAME:  # any other family: its entry, destination passing
        entry = import_entry(load_solution(ROOT / "solutions" / "triton"), definition.name)[0]
        return lambda: entry(*args, *outputs.values())
    ix = solution_module(indexer.NAME)
    topk = solution_module(indexer.NAME, "cuda_topk").filtered_topk if ix.USE_CUDA_TOPK else ix.portable_topk
    return lambda: (
        ix.scored_path(topk, ix.USE_CUDA_TOPK, *args, outputs["topk_indices"])  # dependent, as the entry
        if args[4].shape[1] * 64 > indexer.TOPK
        else ix.kernel(*args, outputs["topk_indices"])
    )


def run_ncu(cases: list[str], device: torch.device) -> int:
    calls = []
    for case_id in cases:
        definition, axes, inputs = case_inputs(case_id, device)
        call = direct_call(definition, axes, inputs, device)
        call()
        call()
        calls.append((case_id, call))
    torch.cuda.synchronize()
    for case_id, call in calls:
        print(f"profiling {case_id}", flush=True)
        torch.cuda.nvtx.range_push("profile")
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    return 0


def run_locality(iterations: int, trials: int, device: torch.device) -> int:
    workload = load_workload(WORKLOADS["attention"])
    sa = solution_module(attn.NAME)
    timer, timer_label = chosen_timer(device)
    print(f"default attention plan, {timer_label}, cold L2, {trials} trial(s) x {iterations} (harness statistic); "
          f"indices as generated vs folded onto {FOLDED_PAGES} pages")  # fmt: skip
    for case in workload.cases:
        if "full" not in case.id and "sparse" not in case.id:
            continue
        inputs = build_inputs(workload.definition, case, derive_seed(workload.settings.seed, case.id, "locality"), device)
        axes = workload.definition.axes(case.axes)
        outputs = workload.definition.allocate_outputs(axes, device)
        idx = inputs["sparse_indices"]
        folded = torch.where(idx >= 0, idx % (FOLDED_PAGES * attn.PAGE_SIZE), idx)
        row = []
        for label, indices in (("spread", idx), ("folded", folded)):
            args = list(workload.definition.input_args(inputs))
            args[4] = indices
            args += [outputs["output"], outputs["lse"]]

            def call(i: int, args=args) -> None:
                sa.sparse_attention(*args)

            us = bench(call, device=device, warmup=3, iterations=iterations, trials=trials, timer=timer).mean_ms * 1e3
            row.append(f"{label} {us:6.2f} µs")
        print(f"{case.id:24s} T={axes['num_tokens']}  " + "  ".join(row), flush=True)
    return 0


def run_cache_states(cases: list[str], iterations: int, trials: int, device: torch.device) -> int:
    """Each case's solution call timed in three cache states: cold (L2 flushed), code-warm (L2
    flushed, then one call on a second input set, so the kernels' code and the small shared
    buffers are cached again but this set's data is not) and warm (nothing flushed). Cold is the
    harness's protocol; the other two pass ``l2_flush=None`` to ``bench``, code-warm flushing in
    its own ``prepare`` with the harness's flusher before the extra call."""
    timer, timer_label = chosen_timer(device)
    flusher = L2Flusher(device)
    print(f"solution entry, {timer_label}, {trials} trial(s) x {iterations} (harness statistic): cold / code-warm / warm L2")
    for case_id in cases:
        definition, axes, inputs = case_inputs(case_id, device)
        _, _, other = case_inputs(case_id, device)  # same shapes, its own memory
        entry = import_entry(load_solution(ROOT / "solutions" / "triton"), definition.name)[0]
        outputs = [definition.allocate_outputs(axes, device) for _ in range(2)]
        sets = [definition.input_args(inputs), definition.input_args(other)]

        def call(i: int, k: int = 0, entry=entry, sets=sets, outputs=outputs) -> None:
            entry(*sets[k], *outputs[k].values())

        def code_warm(i: int) -> None:
            flusher.flush()
            call(i, 1)

        states = {  # state -> (bench's L2 flush, prepare)
            "cold": ("clean", None),
            "code-warm": (None, code_warm),
            "warm": (None, None),
        }
        row = []
        for state, (l2_flush, prepare) in states.items():
            timed = bench(
                call, device=device, warmup=3, iterations=iterations, trials=trials, prepare=prepare, timer=timer, l2_flush=l2_flush
            )
            row.append(f"{state} {timed.mean_ms * 1e3:6.2f}")
        print(f"{case_id:24s} " + "  ".join(row) + " µs", flush=True)
    return 0


def run_topk_costs(iterations: int, trials: int, device: torch.device) -> int:
    """The CUDA top-k alone on synthetic rows: in-kernel passthrough rows (no selection) against
    selected rows, with the default or no shared candidate buffer and with or without the fast
    path, so a fixed per-launch cost separates from the selection's own."""
    topk = solution_module(indexer.NAME, "cuda_topk")
    timer, timer_label = chosen_timer(device)
    print(f"CUDA top-k alone, {timer_label}, cold L2, {trials} trial(s) x {iterations} (harness statistic)")
    for batch, pages, length in ((1, 33, 2000), (1, 33, 2112), (31, 33, 2112), (1, 91, 5824), (31, 91, 5824)):
        g = torch.Generator(device="cpu").manual_seed(batch * 1000 + length)
        scores = torch.randn((batch, pages * 64), generator=g).to(device)
        lens = torch.full((batch,), length, dtype=torch.int32, device=device)
        table = torch.stack([torch.randperm(4 * pages, generator=g)[:pages] for _ in range(batch)]).int().to(device)
        out = torch.empty((batch, indexer.TOPK), dtype=torch.int32, device=device)
        row = []
        for capacity, fast in ((-1, -1), (-1, 0), (0, -1), (0, 0)):

            def call(i: int, args=(scores, lens, table, out, capacity, fast)) -> None:
                topk.filtered_topk(*args)

            us = bench(call, device=device, warmup=1, iterations=iterations, trials=trials, timer=timer).mean_ms * 1e3
            row.append(f"cap{capacity:+d}/fast{fast:+d} {us:6.2f}")
        print(f"B={batch:2d} pages={pages} L={length}: " + "  ".join(row), flush=True)
    return 0


PHASES = ("ids", "first tile", "attend", "partial", "barrier", "combine")


def phase_summary(stamps: torch.Tensor) -> dict[str, float]:
    """Statistics of the CUDA attention kernel's stamps ``[calls, programs, PHASE_SLOTS]`` int64.

    Slots (attention_sm90.h, PhaseSlot): 0 entry ns, 1 entry cycles, 2..7 cycles at the end of
    each phase, 8 exit ns. Returns the SM clock the stamps imply (GHz), each phase's median and
    slowest length in µs ("<phase>" and "<phase> max"), when the median and the last program of a
    call end it, µs after the call's first entry, medians over calls ("<phase> at", "<phase> last"),
    the median and latest program start after the call's first ("start", "start max") and the
    median span of a call ("span"), in µs. A
    program whose split holds no valid slot skips the tile phases and leaves their stamp 0: the
    phases around such a stamp are left out (NaN), not counted as huge.
    """
    st = stamps.double()
    cycles = st[..., 1:8]  # entry, then the end of each phase
    ns = st[..., 8] - st[..., 0]
    ghz = float(((cycles[..., -1] - cycles[..., 0]) / ns.clamp(min=1)).median())
    lengths = (cycles[..., 1:] - cycles[..., :-1]) / ghz / 1e3  # µs
    ran = cycles != 0
    lengths[~(ran[..., 1:] & ran[..., :-1])] = float("nan")
    start = (st[..., 0] - st[..., 0].min(dim=1, keepdim=True).values) / 1e3
    span = (st[..., 8].max(dim=1).values - st[..., 0].min(dim=1).values) / 1e3
    # When each program ends each phase, in µs after the call's first entry (its own clock from its
    # entry on: SM clocks are not comparable across SMs, the global timer is but is coarse).
    ends = start[..., None] + (cycles[..., 1:] - cycles[..., :1]) / ghz / 1e3
    ends[~ran[..., 1:]] = float("nan")
    summary = {"ghz": ghz, "start": float(start.median()), "start max": float(start.max()), "span": float(span.median())}
    for k, name in enumerate(PHASES):
        summary[name] = float(lengths[..., k].nanmedian())
        summary[f"{name} max"] = float(lengths[..., k].nan_to_num(-1.0).max())
        summary[f"{name} at"] = float(ends[..., k].nanmedian(dim=1).values.median())
        summary[f"{name} last"] = float(ends[..., k].nan_to_num(float("-inf")).max(dim=1).values.median())
    return summary


def plan_spec(text: str) -> tuple[str, int, int]:
    """``PATH:SPLITS:LAG`` (``--plan``) as (path, splits, gather lag in SM cycles)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"expected PATH:SPLITS:LAG, e.g. cuda_cluster:16:1000, got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def run_attention_phases(cases: list[str], iterations: int, device: torch.device, plan_spec: tuple[str, int, int] | None = None) -> int:
    """The CUDA attention kernel's own phase stamps (``phase_summary``) per case, cold L2: each
    phase's length in µs, the median and the slowest over programs and calls; when programs
    start after the first one; the span from the first start to the last exit; and a second
    line with when the median and the last program of a call end each phase. Stamps are
    taken by thread 0 of each program, so a phase ends when that thread passes it.
    ``plan_spec`` (path, splits, gather lag in SM cycles; ``--plan``) replaces the default plan.
    """
    plans, cuda_ext = solution_module(attn.NAME, "policy"), solution_module(attn.NAME, "cuda")
    fixed_plan = None
    if plan_spec:
        try:
            fixed_plan = plans.cuda_kernel_plan(*plan_spec)
        except ValueError as err:  # the plan's own checks name what is wrong
            print(f"profile_kernels: --plan {':'.join(map(str, plan_spec))}: {err}", file=sys.stderr)
            return 2
    flusher = L2Flusher(device)
    print(f"CUDA attention phases, cold L2, {iterations} calls per case; per phase: median / slowest program, µs")
    for case_id in cases:
        definition, axes, inputs = case_inputs(case_id, device)
        T = axes["num_tokens"]
        plan = fixed_plan or plans.default_plan(T, device)
        outputs = definition.allocate_outputs(axes, device)
        stamps = torch.zeros((iterations, T * plan.splits, cuda_ext.PHASE_SLOTS), dtype=torch.int64, device=device)
        args = definition.input_args(inputs)
        for i in range(iterations + 2):  # the first two calls warm up (their stamps are overwritten)
            flusher.flush()
            combine = plans.CUDA_COMBINES[plan.path]
            cuda_ext.launch(
                *args, outputs["output"], outputs["lse"], plan.splits, combine, plan.gather_lag, phase_clocks=stamps[max(i - 2, 0)]
            )
        torch.cuda.synchronize()
        p = phase_summary(stamps.cpu())
        cells = [f"{name} {p[name]:5.2f}/{p[name + ' max']:5.2f}" for name in PHASES]
        print(f"{case_id:24s} {plan.path} S={plan.splits:2d} lag {plan.gather_lag} {p['ghz']:.2f} GHz  " + "  ".join(cells)
              + f"  start +{p['start']:.2f}/{p['start max']:.2f}  span {p['span']:.2f}", flush=True)  # fmt: skip
        print(f"{'':24s} phase ends after the call's first entry, median program / last program (median over calls): "
              + "  ".join(f"{name} {p[name + ' at']:5.2f}/{p[name + ' last']:5.2f}" for name in PHASES), flush=True)  # fmt: skip
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("ncu", "locality", "cache", "topk", "phases"))
    p.add_argument("--case", action="append", default=[], help="case id (repeatable; ncu mode)")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--trials", type=int, default=1, help="locality, cache and topk modes: trials (the harness's default is 3)")
    p.add_argument(
        "--plan", type=plan_spec, help="phases mode: PATH:SPLITS:LAG (gather lag, SM cycles) of the CUDA kernel instead of the default plan"
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("profile_kernels: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    if args.mode == "ncu":
        return run_ncu(args.case or DEFAULT_CASES, device)
    if args.mode == "topk":
        return run_topk_costs(args.iterations, args.trials, device)
    if args.mode == "phases":
        phase_cases = ["attention_02_t1_sparse", "attention_00_t1_full", "attention_20_t8_sparse", "attention_18_t8_full"]
        return run_attention_phases(args.case or phase_cases, args.iterations, device, args.plan)
    if args.mode == "cache":
        return run_cache_states(args.case or DEFAULT_CASES, args.iterations, args.trials, device)
    return run_locality(args.iterations, args.trials, device)


if __name__ == "__main__":
    sys.exit(main())
