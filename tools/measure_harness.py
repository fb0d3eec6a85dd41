"""Measure the harness itself on a GPU.

1. ``timers``: the same kernels timed by CUPTI and by CUDA events under the harness protocol
   (L2 flushed before every call, device idle between calls): how much launch overhead events add.
2. ``spread``: run-to-run agreement of two results files of the same workload: per case and
   solution, the relative difference of the mean-of-trial-median latencies.
3. ``walltime``: the harness's own wall time, read from results files (created → finished).
4. ``l2-flush``: what the L2 flush's method charges the timed call. The same calls (an 18.9 MB
   copy and read, the bulk gather-only kernel of benchmarks/kernels/gather_floor.cu and the triton solution's
   sparse attention on every case of sparse_attention_h16) timed by CUPTI after a clean flush,
   after a dirty one (timing.L2Flusher) and warm (no flush), side by side in one process.

Usage:
    python tools/measure_harness.py timers [--out timers.json]
    python tools/measure_harness.py spread RUN1.json RUN2.json [--tolerance 0.03]
    python tools/measure_harness.py walltime RUN.json [...]
    python tools/measure_harness.py l2-flush [--iterations 30] [--out l2_flush.json]
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import statistics
import types
from pathlib import Path

import typer
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def timers(out: Path | None, iterations: int) -> None:
    import torch

    from dsa_bench.timing.bench import bench

    device = torch.device("cuda")
    small = torch.zeros(256, device=device)
    a = torch.randn(1 << 20, device=device)  # 4 MB
    b = torch.randn(1 << 20, device=device)
    c = torch.empty_like(a)
    big_a = torch.randn(1 << 26, device=device)  # 256 MB
    big_c = torch.empty_like(big_a)
    kernels = {
        "tiny fill (1 KB)": lambda: small.fill_(1.0),
        "elementwise add (4 MB)": lambda: torch.add(a, b, out=c),
        "copy (256 MB)": lambda: big_c.copy_(big_a),
        "3 launches: add, mul, add (4 MB)": lambda: (torch.add(a, b, out=c), c.mul_(2.0), c.add_(a)),
    }
    timer_kinds = ("cupti", "cupti_api", "events")
    rows, data = [], {}
    for name, fn in kernels.items():
        medians = {
            timer_name: bench(lambda i, fn=fn: fn(), device=device, iterations=iterations, trials=1, timer=timer_name).mean_ms * 1000
            for timer_name in timer_kinds
        }
        extra = medians["events"] - medians["cupti"]
        rows.append([name, *(f"{medians[k]:.2f}" for k in timer_kinds), f"{extra:+.2f}"])
        data[name] = medians
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, {iterations} calls per timer, L2 flushed before each")
    headers = ["kernel", "CUPTI median µs", "CUPTI + API tracing µs", "events median µs", "events - CUPTI µs"]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    if out:
        out.write_text(
            json.dumps(
                {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "iterations": iterations, "medians_us": data}, indent=1
            )
        )


def _latencies(path: Path) -> dict[tuple[str, str], float]:
    doc = json.loads(path.read_text())
    return {(r["case"], r["solution"]): r["timing"]["mean_ms"] for r in doc["records"] if r.get("timing")}


def spread(first: Path, second: Path, tolerance: float) -> int:
    a, b = _latencies(first), _latencies(second)
    common = sorted(set(a) & set(b))
    if not common:
        print("no timed (case, solution) pairs in common")
        return 2
    by_solution: dict[str, list[float]] = {}
    for key in common:
        by_solution.setdefault(key[1], []).append(abs(b[key] - a[key]) / a[key])
    rows = []
    for solution, diffs in by_solution.items():
        within = sum(d <= tolerance for d in diffs)
        rows.append([solution, len(diffs), f"{within}/{len(diffs)}", f"{100 * statistics.median(diffs):.2f}%", f"{100 * max(diffs):.2f}%"])
    print(f"run-to-run: {first.name} vs {second.name}, tolerance {tolerance:.0%}")
    print(tabulate(rows, headers=["solution", "cases", f"within {tolerance:.0%}", "median |diff|", "max |diff|"], disable_numparse=True))
    return 0


def walltime(paths: list[Path]) -> None:
    rows = []
    for path in paths:
        doc = json.loads(path.read_text())
        start = dt.datetime.fromisoformat(doc["created"])
        end = dt.datetime.fromisoformat(doc["finished"])
        solutions = sorted({r["solution"] for r in doc["records"]})
        cases = len({r["case"] for r in doc["records"]})
        rows.append([path.name, doc["workload"]["name"], cases, ", ".join(solutions), f"{(end - start).total_seconds():.0f} s"])
    print(tabulate(rows, headers=["results", "workload", "cases", "solutions", "harness wall time"], disable_numparse=True))


def _gather_floor() -> types.ModuleType:
    """benchmarks/kernels/gather_floor.py, imported from its file (the kernel scripts are no
    package): it builds the gather-only kernel and draws the inputs it times."""
    spec = importlib.util.spec_from_file_location("gather_floor", ROOT / "benchmarks" / "kernels" / "gather_floor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def l2_flush(out: Path | None, iterations: int) -> None:
    import torch

    from dsa_bench.definitions import sparse_attention as attn
    from dsa_bench.run.loader import import_entry
    from dsa_bench.solution import load_solution
    from dsa_bench.timing.bench import bench
    from dsa_bench.timing.flush import L2_FLUSH_MODES, L2Flusher
    from dsa_bench.workloads import load_workload

    gather_floor = _gather_floor()

    device = torch.device("cuda")
    flushers = {mode: L2Flusher(device, mode) for mode in L2_FLUSH_MODES}
    modes = [*L2_FLUSH_MODES, "warm"]

    def medians_us(call) -> dict[str, float]:  # one trial per mode; "warm" flushes nothing
        flush_of = {mode: mode for mode in L2_FLUSH_MODES} | {"warm": None}
        return {
            m: bench(call, device=device, warmup=3, iterations=iterations, trials=1, timer="cupti", l2_flush=flush_of[m]).mean_ms * 1000
            for m in modes
        }

    src = torch.ones((4608, 1024), device=device)  # 18.9 MB, what a T = 8 full attention call gathers
    dst, row_sums = torch.empty_like(src), torch.empty(4608, device=device)
    calls = {"copy 18.9 MB": lambda i: dst.copy_(src), "read (row sums) 18.9 MB": lambda i: torch.sum(src, 1, out=row_sums)}
    workload = load_workload(ROOT / "workloads" / "sparse_attention_h16.yaml")
    ext = gather_floor.build_gather_extension()
    sa = import_entry(load_solution(ROOT / "solutions" / "triton"), attn.NAME)[1]  # as the harness imports it
    sink = torch.zeros(8 * 2048, dtype=torch.int32, device=device)
    attention: dict[str, dict[str, float]] = {}
    data: dict[str, dict[str, float]] = {}
    for case in workload.cases:
        inputs = gather_floor.generated_inputs(workload, case, device)
        outs = workload.definition.allocate_outputs(workload.definition.axes(case.axes), device)
        args = workload.definition.input_args(inputs)
        attention[case.id] = medians_us(lambda i, args=args, outs=outs: sa.sparse_attention(*args, outs["output"], outs["lse"]))
        if case.id in ("attention_00_t1_full", "attention_18_t8_full"):
            ckv, kpe, ids = inputs["ckv_cache"], inputs["kpe_cache"], inputs["sparse_indices"]
            calls[f"gather-only {case.id}"] = lambda i, ckv=ckv, kpe=kpe, ids=ids: ext.gather(ckv, kpe, ids, 16, "bulk", True, sink)
    for name, call in calls.items():
        data[name] = medians_us(call)
    data |= {f"attention {case}": us for case, us in attention.items()}
    data["attention, mean over the cases"] = {m: statistics.fmean(us[m] for us in attention.values()) for m in modes}
    flush_us = {}
    for mode, flusher in flushers.items():  # the flush's own cost (CUDA events, untimed in a run)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flusher.flush()
        start.record()
        for _ in range(10):
            flusher.flush()
        end.record()
        torch.cuda.synchronize()
        flush_us[mode] = start.elapsed_time(end) * 100  # ms / 10 calls -> µs
    rows = [[name, *(f"{us[m]:.2f}" for m in modes), f"{us['dirty'] - us['clean']:+.2f}"] for name, us in data.items()]
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUPTI, median of {iterations} calls per mode")
    print("flush itself: " + ", ".join(f"{mode} {us:.0f} µs" for mode, us in flush_us.items()))
    print(tabulate(rows, headers=["call", *(f"{m} µs" for m in modes), "dirty - clean µs"], disable_numparse=True))
    if out:
        out.write_text(
            json.dumps(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "torch": torch.__version__,
                    "iterations": iterations,
                    "flush_us": flush_us,
                    "medians_us": data,
                },
                indent=1,
            )
        )


@app.command("timers")
def timers_command(out: Path | None = typer.Option(None, help="JSON record to write."), iterations: int = typer.Option(200, min=1)) -> None:
    """The same kernels timed by CUPTI and by CUDA events under the harness protocol."""
    timers(out, iterations)


@app.command("spread")
def spread_command(
    first: Path, second: Path, tolerance: float = typer.Option(0.03, help="Largest relative difference that agrees.")
) -> None:
    """Run-to-run agreement of two results files of one workload (exit 1 beyond the tolerance)."""
    raise typer.Exit(spread(first, second, tolerance))


@app.command("walltime")
def walltime_command(paths: list[Path]) -> None:
    """The harness's own wall time, from results files."""
    walltime(paths)


@app.command("l2-flush")
def l2_flush_command(
    out: Path | None = typer.Option(None, help="JSON record to write."), iterations: int = typer.Option(30, min=1)
) -> None:
    """What the L2 flush's method charges the timed call: clean, dirty and warm side by side."""
    l2_flush(out, iterations)


if __name__ == "__main__":
    app()
