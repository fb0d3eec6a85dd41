#!/usr/bin/env python
"""Time the references: the batched ones of dsa_bench/definitions against the per-row spec
(tests/per_row_spec.py) and, with ``--baseline REV``, against the references of a git revision.

    python benchmarks/kernels/references.py [-w indexer_h64] [-w sparse_attention_h16] [-c 'indexer_12*']
        [--baseline 3e3fa1b] [--device cuda] [--out results/references.json]

For every case it builds the run's first correctness input set (``derive_seed(seed, case, "check",
0)``), checks the batched reference's output with the harness checker, then times, per variant:

- ``call``: the reference as the reference solution calls it; on a GPU through
  ``dsa_bench.timing.bench.bench`` (the run's timer, clean L2 flush, each trial's median averaged
  over trials), on a CPU the host clock's median over ``--repeats`` calls;
- ``wall``: the host time of one call including a device synchronize (what a run's wall time
  pays per call), the median (``--statistic min``: the minimum) over ``--repeats`` calls; on a
  CPU shared with other work ``--clock process --threads 1`` counts this process's CPU time on
  one thread instead, which other processes disturb far less;
- ``expect``: the judge side, ``definition.expect`` (host clock, synchronized, the same statistic).

Variants: ``batched`` (the current definitions), ``per_row`` (the per-row spec: for the indexer
the reference as it was before it was batched, for attention a per-token loop that never was the
shipped reference) and ``REV`` (the definitions' modules read from that revision with ``git show``;
3e3fa1b is the last commit before the references were batched). Prints a per-case table and the
totals per variant; ``--out`` writes everything as JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

from dsa_bench.definitions import indexer, sparse_attention
from dsa_bench.definitions.checks import judge
from dsa_bench.results.environment import environment
from dsa_bench.timing.bench import bench
from dsa_bench.workloads import Workload, build_inputs, derive_seed, load_workload

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the per-row spec lives with the tests
import per_row_spec  # noqa: E402

MODULES = {indexer.NAME: indexer, sparse_attention.NAME: sparse_attention}
MODULE_PATHS = {indexer.NAME: "dsa_bench/definitions/indexer.py", sparse_attention.NAME: "dsa_bench/definitions/sparse_attention.py"}


def per_row_variant(name: str) -> Callable[..., Any]:
    if name == indexer.NAME:
        return per_row_spec.indexer_per_row
    return per_row_spec.attention_per_token


def module_at(rev: str, name: str, folder: Path) -> types.ModuleType:
    """The definition module ``name`` as it was at git revision ``rev``."""
    source = subprocess.run(["git", "show", f"{rev}:{MODULE_PATHS[name]}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = folder / f"{rev}_{Path(MODULE_PATHS[name]).stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the module looks the module up while it executes
    spec.loader.exec_module(module)
    return module


def host_ms(fn: Callable[[], Any], device: torch.device, repeats: int, statistic: str = "median", clock: str = "wall") -> float:
    """Host time of ``fn()`` in ms (the median or the minimum over ``repeats`` calls), each call
    followed by a device synchronize; ``clock`` "process" counts this process's CPU time instead
    of the wall clock (on a CPU shared with other work, what the call itself costs)."""
    now = time.process_time if clock == "process" else time.perf_counter
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = now()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((now() - start) * 1e3)
    return min(samples) if statistic == "min" else statistics.median(samples)


def time_case(workload: Workload, case: Any, variants: dict[str, Callable[..., Any]], expects: dict[str, Callable[..., Any]],
              device: torch.device, args: argparse.Namespace) -> dict[str, Any]:
    definition = workload.definition
    inputs = build_inputs(definition, case, derive_seed(workload.settings.seed, case.id, "check", 0), device)
    axes = definition.axes(case.axes)
    expected = definition.expect(inputs)
    outputs = definition.reference(**inputs)
    verdict = judge(definition, axes, inputs, outputs, expected, workload.settings.tolerance, device)
    if not verdict.passed:
        raise SystemExit(f"{case.id}: the batched reference fails the checker: {verdict.message}")
    row: dict[str, Any] = {"case": case.id, "axes": dict(case.axes)}
    for label, fn in variants.items():
        def call(fn=fn):
            return fn(**inputs)
        row[f"{label}_wall_ms"] = host_ms(call, device, args.repeats, args.statistic, args.clock)
        if device.type == "cuda":
            result = bench(lambda i, call=call: call(), device=device, warmup=args.warmup, iterations=args.iterations, trials=args.trials)
            row[f"{label}_call_ms"], row[f"{label}_timer"] = result.mean_ms, result.timer
        else:  # without a device the call is its host time
            row[f"{label}_call_ms"], row[f"{label}_timer"] = row[f"{label}_wall_ms"], f"host {args.clock} clock, {args.statistic}"
    for label, fn in expects.items():
        row[f"{label}_expect_ms"] = host_ms(lambda fn=fn: fn(inputs), device, args.repeats, args.statistic, args.clock)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-w", "--workload", action="append", help="workload name (default: indexer_h64 and sparse_attention_h16)")
    parser.add_argument("-c", "--case", default="*", help="case id glob")
    parser.add_argument("--baseline", metavar="REV", help="also time the references of this git revision")
    parser.add_argument("--no-per-row", action="store_true", help="skip the per-row spec (slow on long workloads)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5, help="host-clock calls per figure")
    parser.add_argument("--statistic", choices=("median", "min"), default="median",
                        help="of the host-clock calls (min is the steadier figure on a shared CPU)")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="host figures from the wall clock or from this process's CPU time (CPU only; see --threads)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (a CPU measurement with --clock process: 1)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.clock == "process" and device.type == "cuda":
        parser.error("--clock process counts host CPU time only: use it on a CPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"environment": environment(device), "args": {k: str(v) for k, v in vars(args).items()}, "workloads": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.workload or ["indexer_h64", "sparse_attention_h16"]:
            workload = load_workload(ROOT / "workloads" / f"{name}.yaml")
            module = MODULES[workload.definition.name]
            variants: dict[str, Callable[..., Any]] = {"batched": module.reference}
            expects: dict[str, Callable[..., Any]] = {"batched": module.expect}
            if not args.no_per_row:
                variants["per_row"] = per_row_variant(workload.definition.name)
            if args.baseline:
                old = module_at(args.baseline, workload.definition.name, Path(scratch))
                variants[args.baseline] = old.reference
                expects[args.baseline] = old.expect
            rows = []
            for case in workload.cases:
                if fnmatch.fnmatchcase(case.id, args.case):
                    rows.append(time_case(workload, case, variants, expects, device, args))
                    print(f"{case.id}: " + ", ".join(f"{k} {v:.3f}" for k, v in rows[-1].items() if k.endswith("_ms")), flush=True)
            if not rows:
                raise SystemExit(f"no case of {name} matches {args.case!r}")
            totals = {k: sum(r[k] for r in rows) for k in rows[0] if k.endswith("_ms")}
            report["workloads"][name] = {"cases": rows, "totals_ms": totals}
            print(f"\n{name}: {len(rows)} cases on {device} (call timer: {rows[0]['batched_timer']}); sums over the cases")
            table = []
            figures = (("call", variants), ("wall", variants), ("expect", expects))
            for figure, labels in figures if device.type == "cuda" else figures[1:]:  # on a CPU a call is its wall time
                base = totals[f"batched_{figure}_ms"]
                for label in labels:
                    total = totals[f"{label}_{figure}_ms"]
                    table.append([figure, label, f"{total:.2f}", f"{total / base:.2f}x" if base else "-"])
            print(tabulate(table, headers=["figure", "variant", "total ms", "of batched"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
