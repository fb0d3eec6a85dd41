#!/usr/bin/env python
"""Time the triton solution's KV insert writers against the copy bandwidth, on a CUDA GPU.

    python benchmarks/kernels/kv_insert.py --out benchmarks/h200/kv_insert.json
    python benchmarks/kernels/kv_insert.py --dry-run          # no GPU: interpreter, host clock, small T

For each format (V32, V4, V41) and T in {1, 16384, 32768, 65536, 262144} (block size 64, distinct
random slots over 2T slots of cache, no -1, positions in [0, --max-position)), it builds the inputs
with the definition's own generator, checks the solution's cache byte-exact against the reference
writer, then times the entry with ``dsa_bench.timing.bench.bench`` (CUPTI when it loads, the clean
L2 flush before every call, the cache re-poisoned with 0xA5 before every call as a run does; each
trial's median, averaged over trials). Reported per case: latency, bytes per call (the
definition's ``min_traffic_bytes``: slots, the rows of written tokens, positions, each distinct
cos/sin row once, the records written), achieved GB/s and its ratio to the copy bandwidth measured
in this run the same way (``bench`` around a device-to-device copy of --copy-mib MiB, bytes read
plus written), and the per-token time. Summaries: per-token time at T = 262144 over T = 16384, T = 1
against an empty Triton kernel timed the same way, and the targets of issue 20 (>= 70 % of copy
bandwidth at T >= 16384, <= 1.15x per token, <= 1.5x the empty launch). Also: the reference writer
at T = 16384 (context), and a sweep of launch tiles (tokens x warps per program) at --sweep-tokens (default 16384).
Prints a table; with --out writes a JSON record (GPU, versions, date, command, every sample).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[2]
FORMATS = {"v32": "dsa_kv_insert_v32_fp8", "v4": "dsa_kv_insert_v4_fp8", "v41": "dsa_kv_insert_v41_fp8"}
TOKENS = (1, 16384, 32768, 65536, 262144)
DRY_RUN_TOKENS = (1, 64, 256)
TARGETS = {"copy_ratio_min": 0.70, "per_token_ratio_max": 1.15, "t1_vs_empty_max": 1.5}
TILE_SWEEP = ("16x4", "16x4d", "16x2", "8x2", "8x1", "8x1d", "4x1")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="JSON record to write (e.g. benchmarks/h200/kv_insert.json)")
    p.add_argument("--format", action="append", choices=sorted(FORMATS), help="repeatable; default: all three")
    p.add_argument("--tokens", type=int, action="append", help=f"repeatable; default: {' '.join(map(str, TOKENS))}")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--max-position", type=int, default=4096, help="positions drawn in [0, N); the cos/sin table has N rows")
    p.add_argument("--timer", choices=("auto", "cupti", "events"), default="auto")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--copy-mib", type=int, default=256, help="size of the timed copy that gives the copy bandwidth")
    p.add_argument("--tiles", default=",".join(TILE_SWEEP),
                   help="tiles TOKENSxWARPS[d] swept at --sweep-tokens (d: rows read after their slots; '' to skip); "
                        "the entry's own tile is timed anyway")
    p.add_argument("--sweep-tokens", type=int, action="append", help="repeatable: T of the tile sweep (default 16384; dry run 256)")
    p.add_argument("--reference-tokens", type=int, default=None,
                   help="T at which the reference writer is timed (default 16384; dry run 64; 0: skip)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: Triton interpreter on CPU, small T, host-clock 'timings' (meaningless as numbers)")
    args = p.parse_args()
    if args.sweep_tokens is None:
        args.sweep_tokens = [DRY_RUN_TOKENS[-1] if args.dry_run else 16384]
    if args.reference_tokens is None:
        args.reference_tokens = DRY_RUN_TOKENS[1] if args.dry_run else 16384
    return args


# --------------------------------------------------------------------------- timing


def make_timer(device: torch.device, timer: str | None, warmup: int, iterations: int, trials: int):
    """``time(call, prepare)`` -> BenchResult: ``bench`` on a GPU, the host clock in a dry run."""
    from dsa_bench.timing.bench import BenchResult, bench
    from dsa_bench.timing.events import HostClockTimer

    if device.type == "cuda":
        return functools.partial(bench, device=device, warmup=warmup, iterations=iterations, trials=trials, timer=timer)

    def host_clock(call: Callable[[int], object], *, prepare: Callable[[int], None] | None = None) -> BenchResult:
        prep = prepare or (lambda i: None)
        samples = []
        for _ in range(trials):
            for i in range(min(warmup, 1)):
                prep(i)
                call(i)
            samples.append(HostClockTimer().time_iterations(call, min(iterations, 2), prep, lambda i: None))
        return BenchResult(HostClockTimer.name, samples)

    return host_clock


def copy_bandwidth(time_call, device: torch.device, mib: int) -> dict[str, float]:
    """A device-to-device copy of ``mib`` MiB timed like the writers: bytes read plus written per second."""
    src = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    result = time_call(lambda i: dst.copy_(src))
    seconds = result.mean_ms / 1e3
    out = {"bytes": 2 * src.numel() * 4, "us": result.mean_ms * 1e3, "gbps": 2 * src.numel() * 4 / seconds / 1e9,
           "samples_ms": result.samples_ms}
    if device.type == "cuda":
        from dsa_bench.timing.flush import measure_copy_bandwidth

        out["harness_copy_gbps"] = measure_copy_bandwidth(device) / 1e9  # what a run records as copy_gbps
    return out


def empty_launch(time_call, device: torch.device) -> dict[str, Any]:
    """An empty Triton kernel (one program, four warps) timed the same way, and the floor of any
    kernel that reads its input: one load, then a store of what it read (with the L2 flushed
    before each call, that load is a DRAM round trip), and two dependent loads (a slot, then the
    row it names: what a T = 1 insert must do at least)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import launch_floor  # after a dry run has set TRITON_INTERPRET

    anchor = torch.empty(1, device=device)
    src = torch.zeros(1024, dtype=torch.int64, device=device)
    dst = torch.empty(1, dtype=torch.int64, device=device)
    result = time_call(lambda i: launch_floor.empty[(1,)](anchor, num_warps=4))
    one = time_call(lambda i: launch_floor.one_load[(1,)](src, dst, num_warps=4))
    two = time_call(lambda i: launch_floor.two_dependent_loads[(1,)](src, dst, num_warps=4))
    return {"us": result.mean_ms * 1e3, "samples_ms": result.samples_ms, "one_load_us": one.mean_ms * 1e3,
            "two_loads_us": two.mean_ms * 1e3}


# --------------------------------------------------------------------------- cases


def build_case(definition, fmt, tokens: int, block_size: int, max_position: int, seed: int, device: torch.device):
    from dsa_bench.definitions.base import InputRng

    axes = {"num_tokens": tokens, "num_blocks": -(-2 * tokens // block_size) + 1, "block_size": block_size,
            "page_bytes": fmt.page_stride(block_size)}
    if "max_position" in definition.var_axes:
        axes["max_position"] = max_position
    axes = definition.axes(axes)
    inputs = definition.generate(axes, {}, {}, InputRng(seed, device))
    return axes, inputs


def exact(definition, inputs, cache: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when the solution's cache is byte-identical to the reference's, else the checker's message."""
    if torch.equal(cache, want):
        return None
    from dsa_bench.definitions.base import Tolerance

    return definition.check(inputs, {"kv_cache": cache}, definition.expect(inputs), Tolerance()).message


def parse_tile(text: str, launch_tile) -> tuple[Any, bool]:
    """``TOKENSxWARPS`` (rows read beside their slots, as the entry does), or with a ``d`` suffix:
    rows read after their slots, only for tokens that are written (``speculative=False``)."""
    text = text.lower()
    speculative = not text.endswith("d")
    tokens, warps = (int(v) for v in text.rstrip("d").split("x"))
    return launch_tile(tokens=tokens, num_warps=warps), speculative


def main() -> int:
    args = parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the solution's kernels are defined
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("kv_insert: needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run exercises the script", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())

    from dsa_bench.definitions import get_definition
    from dsa_bench.definitions import kv_insert as kvi
    from dsa_bench.definitions.base import poison_
    from dsa_bench.results.environment import environment
    from dsa_bench.results.records import now_iso
    from dsa_bench.run.loader import import_entry
    from dsa_bench.solution import load_solution
    from dsa_bench.timing import choose_timer
    from dsa_bench.timing import make_timer as timer_of

    formats = args.format or list(FORMATS)
    token_counts = args.tokens or (list(DRY_RUN_TOKENS) if args.dry_run else list(TOKENS))
    solution = load_solution(ROOT / "solutions" / "triton")
    timer_name = None
    label = "host_clock"
    if device.type == "cuda":
        timer_name, warning = choose_timer(args.timer, device)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        label = timer_of(timer_name).name
    time_call = make_timer(device, timer_name, args.warmup, args.iterations, args.trials)
    started = time.perf_counter()

    copy_mib = 16 if args.dry_run else args.copy_mib
    copy = copy_bandwidth(time_call, device, copy_mib)
    empty = empty_launch(time_call, device)
    print(f"timer {label}; copy {copy['gbps']:.0f} GB/s ({copy_mib} MiB, {copy['us']:.1f} µs); "
          f"empty Triton launch {empty['us']:.2f} µs; one load {empty['one_load_us']:.2f} µs; "
          f"two dependent loads {empty['two_loads_us']:.2f} µs")

    records: list[dict[str, Any]] = []
    failures: list[str] = []
    sweeps: dict[str, list[dict[str, Any]]] = {}
    reference: dict[str, Any] = {}
    notes = None
    for key in formats:
        definition = get_definition(FORMATS[key])
        fmt = kvi.FORMAT_OF[definition.name]
        entry, module = import_entry(solution, definition.name)
        notes = module.solution_notes()
        kernels = importlib.import_module(f"{module.__package__}.triton_kernels")
        policy = importlib.import_module(f"{module.__package__}.policy")
        for tokens in token_counts:
            axes, inputs = build_case(definition, fmt, tokens, args.block_size, args.max_position, args.seed, device)
            call_args = definition.input_args(inputs)
            cache = definition.allocate_outputs(axes, device)["kv_cache"]
            want = torch.empty_like(cache)
            poison_(want, kvi.CACHE_POISON_BYTE)
            definition.reference(*call_args, want)
            entry(*call_args, cache)
            problem = exact(definition, inputs, cache, want)
            if problem:
                failures.append(f"{key} T={tokens}: {problem}")

            def repoison(i: int, cache: torch.Tensor = cache) -> None:
                poison_(cache, kvi.CACHE_POISON_BYTE)

            result = time_call(lambda i, f=entry, a=call_args, c=cache: f(*a, c), prepare=repoison)
            repoison(0)
            entry(*call_args, cache)  # still right after timing
            problem = problem or exact(definition, inputs, cache, want)
            traffic = definition.min_traffic_bytes(axes, inputs)
            us = result.mean_ms * 1e3
            gbps = traffic / (us * 1e-6) / 1e9
            record = {"format": key, "definition": definition.name, "tokens": tokens, "block_size": args.block_size,
                      "num_blocks": axes["num_blocks"], "page_bytes": axes["page_bytes"], "us": us,
                      "per_token_ns": us * 1e3 / tokens, "bytes": traffic, "gbps": gbps, "copy_ratio": gbps / copy["gbps"],
                      "byte_exact": problem is None, "samples_ms": result.samples_ms}
            records.append(record)
            print(f"{key:4s} T={tokens:7d}  {us:9.2f} µs  {record['per_token_ns']:8.3f} ns/token  {traffic / 1e6:8.2f} MB  "
                  f"{gbps:7.0f} GB/s  {record['copy_ratio']:6.1%} of copy  {'exact' if problem is None else 'MISMATCH'}")

            if tokens in args.sweep_tokens and args.tiles:
                sweep = {}
                for text in args.tiles.split(","):
                    tile, speculative = parse_tile(text, policy.LaunchTile)
                    rope = call_args[0] if fmt is not kvi.V32 else call_args[1]
                    pos, cs = (call_args[1], call_args[2]) if fmt is not kvi.V32 else (None, None)

                    launch = functools.partial(kernels.launch, fmt, call_args[0], rope, pos, cs, inputs["slot_mapping"],
                                               args.block_size, cache, tile=tile, speculative=speculative)

                    r = time_call(lambda i, f=launch: f(), prepare=repoison)
                    repoison(0)
                    launch()
                    ok = torch.equal(cache, want)
                    t_us = r.mean_ms * 1e3
                    sweep[text] = {"us": t_us, "gbps": traffic / (t_us * 1e-6) / 1e9, "byte_exact": ok}
                    if not ok:
                        failures.append(f"{key} T={tokens} tile {text}: not byte-exact")
                sweeps.setdefault(key, []).append({"tokens": tokens, "tiles": sweep})
                print("      tiles: " + "  ".join(f"{t}={v['us']:.2f}µs/{v['gbps']:.0f}GB/s" for t, v in sweep.items()))

            if tokens == args.reference_tokens and args.reference_tokens:
                r = time_call(lambda i, f=definition.reference, a=call_args, c=want: f(*a, c))
                reference[key] = {"tokens": tokens, "us": r.mean_ms * 1e3, "speedup": r.mean_ms * 1e3 / us}
                print(f"      reference writer {reference[key]['us']:.1f} µs ({reference[key]['speedup']:.0f}x slower)")
            del inputs, call_args, cache, want
            if device.type == "cuda":
                torch.cuda.empty_cache()

    summary: dict[str, Any] = {}
    for key in formats:
        rows = {r["tokens"]: r for r in records if r["format"] == key}
        large = [r for t, r in rows.items() if t >= 16384]
        s: dict[str, Any] = {"copy_ratio_min_large": min((r["copy_ratio"] for r in large), default=None)}
        if 16384 in rows and 262144 in rows:
            s["per_token_ratio_262144_vs_16384"] = rows[262144]["per_token_ns"] / rows[16384]["per_token_ns"]
        if 1 in rows:
            s["t1_vs_empty"] = rows[1]["us"] / empty["us"]
            s["t1_vs_two_dependent_loads"] = rows[1]["us"] / empty["two_loads_us"]
        s["targets_met"] = {
            "copy_ratio": None if s["copy_ratio_min_large"] is None else s["copy_ratio_min_large"] >= TARGETS["copy_ratio_min"],
            "per_token_ratio": (s["per_token_ratio_262144_vs_16384"] <= TARGETS["per_token_ratio_max"]
                                if "per_token_ratio_262144_vs_16384" in s else None),
            "t1_vs_empty": s["t1_vs_empty"] <= TARGETS["t1_vs_empty_max"] if "t1_vs_empty" in s else None,
        }
        summary[key] = s

    print()
    print(f"{'format':6s} {'min copy ratio T>=16k':>22s} {'ns/token 262k/16k':>18s} {'T=1 / empty':>12s} {'T=1 / 2 loads':>14s}")
    for key, s in summary.items():
        def show(v, pct=False):
            return "-" if v is None else (f"{v:.1%}" if pct else f"{v:.2f}x")
        met = s["targets_met"]
        verdict = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in met.items() if v is not None)
        print(f"{key:6s} {show(s['copy_ratio_min_large'], True):>22s} {show(s.get('per_token_ratio_262144_vs_16384')):>18s} "
              f"{show(s.get('t1_vs_empty')):>12s} {show(s.get('t1_vs_two_dependent_loads')):>14s}   {verdict}")
    print(f"targets: >= {TARGETS['copy_ratio_min']:.0%} of copy at T >= 16384, per-token ratio <= {TARGETS['per_token_ratio_max']}x, "
          f"T=1 <= {TARGETS['t1_vs_empty_max']}x the empty launch" + ("  (dry run: the numbers mean nothing)" if args.dry_run else ""))

    document = {
        "format": "dsa-bench-kv-insert-bench",
        "version": 1,
        "created": now_iso(),
        "command": " ".join(["python", *sys.argv]),
        "dry_run": args.dry_run,
        "timer": label,
        "solution_notes": notes,
        "settings": {"warmup": args.warmup, "iterations": args.iterations, "trials": args.trials, "block_size": args.block_size,
                     "max_position": args.max_position, "seed": args.seed, "l2_flush": "clean" if device.type == "cuda" else None,
                     "slots": "distinct random slots over 2T cache slots, none -1"},
        "environment": environment(device),
        "copy": copy,
        "empty_launch": empty,
        "targets": TARGETS,
        "summary": summary,
        "records": records,
        "tile_sweep": sweeps,
        "reference": reference,
        "failures": failures,
        "wall_s": time.perf_counter() - started,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1))
        print(f"wrote {args.out}")
    if failures:
        print(f"{len(failures)} correctness failure(s):", file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
