#!/usr/bin/env python
"""The triton indexer at production contexts (8K-128K tokens, batches 1-64, ragged), on a CUDA GPU.

    python benchmarks/kernels/indexer_long.py [--case 'b1_*'] [--no-variants] [--json results/indexer_long.json]

Self-contained (no peers, no workload files, no pydantic): it imports the solution package
straight from ``solutions/triton`` and builds each case's inputs with the indexer definition's
own generator (``dsa_bench.definitions.indexer.generate``). Per case it

1. checks the entry (``kernel``: the long-row top-k past 8192 tokens per block table) and the
   previous pipeline (the same score kernel, then the one-block-per-row filtered top-k as its
   dependent launch) with the harness checker, and the long-row top-k alone on the score buffer
   against ``torch.topk`` exactly (the same multiset of scores per row);
2. times, with ``dsa_bench.timing.bench.bench`` (clean L2 flush before every call): the entry,
   the previous pipeline, the score kernel alone, the long-row top-k alone; on block tables of
   8193-32768 tokens also the one-block top-k with its radix select forced (``radix``: what those
   rows took before the shared-memory rows) and both one-block top-ks alone, checked exactly;
3. with ``--variants``' cases, the score kernel alone in a few looping tiles (``--tiles`` picks some), each
   tile's scores compared bitwise with the policy tile's;
4. with ``--split``, the split top-k (rows cut into chunks of each given length, a block per chunk,
   then a block per row over the chunks' selections): its pipeline checked and timed, and the
   top-k alone checked exactly and timed (columns ``split<N>k``);
5. with ``--profile``'s cases, after all the timing, each kernel of the entry's scored path (torch.profiler).

Score distributions (``--case`` names end in them): ``plain`` (the generator's), ``neg`` (head
weights all negative: every score <= 0), ``x1e3`` / ``x1e-4`` (weights scaled), ``mixed``
(weights of random sign), ``const`` (one distinct key: every score of a row equal), ``ties3``
(three distinct keys). Prints one line per case as it goes and a table at the end.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dsa_bench.definitions import indexer  # noqa: E402
from dsa_bench.definitions.base import InputRng, Tolerance, poison_  # noqa: E402
from dsa_bench.definitions.checks import judge  # noqa: E402
from dsa_bench.timing.bench import bench  # noqa: E402

K = indexer.TOPK


def import_solution():
    """solutions/triton as a package (what dsa_bench.run.loader does, without the yaml model)."""
    name = "dsa_long_bench_solution"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(ROOT / "solutions" / "triton")]
        sys.modules[name] = package
    entry = importlib.import_module(f"{name}.indexer.entry")
    modules = ("indexer.triton_kernels", "indexer.cuda_topk", "indexer.cuda_topk_long", "common.launch_graphs")
    return entry, *(importlib.import_module(f"{name}.{module}") for module in modules)


def ragged_lengths(batch: int, lo: int, hi: int) -> list[int]:
    """A serving batch's spread: lengths geometric from lo to hi (a few long, many short), shuffled."""
    lens = np.geomspace(lo, hi, batch).round().astype(int)
    return np.random.default_rng(batch).permutation(lens).tolist()


SHAPES = {
    "b1_l32k": [32768],
    "b1_l128k": [131072],
    "b8_l64k": [65536] * 8,
    "b32_l32k": [32768] * 32,
    "b64_l128k": [131072] * 64,
    "b32_ragged": ragged_lengths(32, 4096, 131072),
    "b64_ragged": ragged_lengths(64, 1024, 131072),
    "b128_ragged": ragged_lengths(128, 1024, 131072),
    "b128_l8k": [8192] * 128,
    "b32_l8k": [8192] * 32,
    "b128_l16k": [16384] * 128,
    "b32_l16k": [16384] * 32,
    "b8_l16k": [16384] * 8,
    "b128_l32k": [32768] * 128,
    "b64_l32k": [32768] * 64,
    "b128_l64k": [65536] * 128,
    "b4_l10k": [10000, 8193, 2049, 100],
    # MTP: each sequence's two query rows (lengths L and L + 1) read one block-table row
    "mtp_b32_l32k": [32768, 32769] * 16,
    "mtp_b64_l64k": [65536, 65537] * 32,
}
#: rows per sequence of the MTP shapes (the others: one)
ROWS_PER_SEQUENCE = {"mtp_b32_l32k": 2, "mtp_b64_l64k": 2}
DISTRIBUTIONS = ("plain", "neg", "x1e3", "x1e-4", "mixed", "const", "ties3")
DEFAULT_CASES = [f"{s}/plain" for s in SHAPES] + [f"{s}/{d}" for s in ("b1_l128k", "b8_l64k", "b32_l32k") for d in DISTRIBUTIONS[1:]]


def build(shape: str, distribution: str, device: torch.device, seed: int = 7) -> tuple[dict, dict]:
    lens = SHAPES[shape]
    max_pages = -(-max(lens) // 64)
    axes = {"batch_size": len(lens), "max_num_pages": max_pages, "num_pages": sum(-(-n // 64) for n in lens) + 8}
    params = {"k_index_cache_fp8": {"distinct_keys": {"const": 1, "ties3": 3}[distribution]}} if distribution in ("const", "ties3") else {}
    if shape in ROWS_PER_SEQUENCE:
        params["block_table"] = {"rows_per_sequence": ROWS_PER_SEQUENCE[shape]}
    inputs = indexer.generate(axes, {"seq_lens": torch.tensor(lens, dtype=torch.int32)}, params, InputRng(seed, device))
    w = inputs["weights"]
    if distribution == "neg":
        w.copy_(-w.abs())
    elif distribution == "x1e3":
        w.mul_(1e3)
    elif distribution == "x1e-4":
        w.mul_(1e-4)
    elif distribution == "mixed":
        w.mul_(torch.where(torch.rand(w.shape, device=device) < 0.5, -1.0, 1.0))
    return indexer.DEFINITION.axes(axes), inputs


def args_of(inputs) -> list[torch.Tensor]:
    return [inputs[spec.name] for spec in indexer.DEFINITION.inputs]


def exact_topk_failure(scores: torch.Tensor, seq_lens: torch.Tensor, table: torch.Tensor, out: torch.Tensor) -> str | None:
    """None when every row of ``out`` holds ids of exactly torch.topk's multiset of scores."""
    for b, n in enumerate(seq_lens.tolist()):
        row = out[b]
        want = min(K, n)
        if int((row >= 0).sum()) != want or bool((row < -1).any()):
            return f"row {b}: {int((row >= 0).sum())} ids, want {want}"
        if n <= K:
            continue
        ids = (table[b].long()[:, None] * 64 + torch.arange(64, device=row.device)).reshape(-1)[:n]
        lookup = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long, device=row.device)
        lookup[ids] = torch.arange(n, device=row.device)
        if int(row.max()) >= lookup.numel():
            return f"row {b}: id off the row"
        pos = lookup[row.long()]
        if bool((pos < 0).any()) or pos.unique().numel() != want:
            return f"row {b}: unreachable or duplicate ids"
        chosen = torch.sort(scores[b, pos], descending=True).values
        best = torch.topk(scores[b, :n], want).values
        if not torch.equal(chosen, best):
            return f"row {b}: not the exact top-{want}"
    return None


def us(result) -> float:
    return result.mean_ms * 1e3


#: score tiles timed on --variants' cases: (pages per program, pipeline stages, rows first)
TILES = ((1, 1, False), (2, 2, True), (4, 2, True), (4, 3, True), (8, 3, True), (8, 4, True), (16, 3, True), (16, 4, True), (32, 3, True),
         (32, 4, True))


def tile_name(pages: int, stages: int, rows_first: bool) -> str:
    return f"loop{pages}_s{stages}{'_rf' if rows_first else ''}"


def kernel_times_us(fn, iterations: int = 5) -> dict[str, float]:
    """Mean GPU time per call of each kernel ``fn()`` launches (eagerly), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            name = event.name.split("(")[0].split("<")[0][-40:]
            times[name] = times.get(name, 0.0) + event.device_time / iterations
    return {k: round(v, 1) for k, v in times.items()}


def profile_case(case: str, entry, device: torch.device) -> dict[str, float]:
    """Per-kernel GPU times of the entry's scored path on ``case`` (torch.profiler). Run after every
    timing of the process: once torch.profiler has run, the harness's CUPTI timer sees no activity."""
    shape, distribution = case.split("/")
    _, inputs = build(shape, distribution, device)
    a = args_of(inputs)
    out = torch.empty((inputs["block_table"].shape[0], K), dtype=torch.int32, device=device)
    return kernel_times_us(lambda: entry.scored_path(entry.select_topk_cuda, True, *a, out))


#: block tables whose rows the one-block top-k keeps in shared memory (topk_filtered.cuh's SharedRow);
#: before, their rows took the radix select, which its ``fast_candidates=0`` still forces
SHARED_ROW_TOKENS = (8192, 36864)


def run_case(case: str, entry, score, topk, topk_long, graphs, old, args: argparse.Namespace, timed: dict) -> dict:
    """Checks and times one case (see the module doc); returns its row."""
    device = timed["device"]
    shape, distribution = case.split("/")
    axes, inputs = build(shape, distribution, device)
    a = args_of(inputs)
    batch, max_pages = inputs["block_table"].shape
    out = torch.empty((batch, K), dtype=torch.int32, device=device)
    expected = indexer.expect(inputs)
    verdict = {}
    forced = entry.scored_pipeline(topk_long.long_topk, dependent=True)
    pipelines = {"new": entry.kernel, "old": lambda *x: entry.run_pipeline(old, *x), "long": lambda *x: entry.run_pipeline(forced, *x)}
    cluster_fits = max_pages * 64 <= topk_long.CLUSTER_MAX_LEN and topk_long.cluster_capacity(device, max_pages * 64) > 0
    if cluster_fits:
        clustered = entry.scored_pipeline(topk_long.cluster_topk, dependent=True)
        pipelines["cluster"] = lambda *x: entry.run_pipeline(clustered, *x)
    shared_rows = SHARED_ROW_TOKENS[0] < max_pages * 64 <= SHARED_ROW_TOKENS[1]
    radix_topk = functools.partial(topk.filtered_topk, fast_candidates=0)
    if shared_rows:
        radix = entry.scored_pipeline(radix_topk, dependent=True)
        pipelines["radix"] = lambda *x: entry.run_pipeline(radix, *x)
    splits = {}  # name -> the split top-k of that chunk length, where the call's shape allows it
    for split_len in (int(n) for n in args.split.split(",") if n):
        if topk.split_chunks(max_pages * 64, split_len) * K <= topk.SPLIT_MAX_CANDIDATES:
            name = f"split{split_len // 1024}k"
            splits[name] = functools.partial(topk.split_topk, split_len=split_len)
            split_pipeline = entry.scored_pipeline(splits[name], dependent=True)
            pipelines[name] = lambda *x, g=split_pipeline: entry.run_pipeline(g, *x)
    if args.no_old:
        del pipelines["old"]
    for name, fn in pipelines.items():
        poison_(out)
        fn(*a, out)
        result = judge(indexer.DEFINITION, axes, inputs, {"topk_indices": out}, expected, Tolerance(), device)
        verdict[name] = "PASS" if result.passed else f"FAIL {result.message[:120]}"
    del expected
    lens, table = inputs["seq_lens"], inputs["block_table"]
    scores = torch.empty((batch, max_pages * 64), dtype=torch.float32, device=device)
    score.launch_scores(*a[:5], scores, skip_short_rows=True)
    alone = torch.empty_like(out)
    poison_(alone)
    topk_long.long_topk(scores, lens, table, alone)
    torch.cuda.synchronize()
    verdict["long_topk_exact"] = exact_topk_failure(scores, lens, table, alone) or "PASS"
    if cluster_fits:
        poison_(alone)
        topk_long.cluster_topk(scores, lens, table, alone)
        torch.cuda.synchronize()
        verdict["cluster_topk_exact"] = exact_topk_failure(scores, lens, table, alone) or "PASS"
    if shared_rows:
        for name, select in (("filtered_topk_exact", topk.filtered_topk), ("radix_topk_exact", radix_topk)):
            poison_(alone)
            select(scores, lens, table, alone)
            torch.cuda.synchronize()
            verdict[name] = exact_topk_failure(scores, lens, table, alone) or "PASS"
    for name, select in splits.items():
        poison_(alone)
        select(scores, lens, table, alone)
        torch.cuda.synchronize()
        verdict[f"{name}_topk_exact"] = exact_topk_failure(scores, lens, table, alone) or "PASS"
    row = {"case": case, "batch": batch, "max_len": max_pages * 64, "tokens": int(lens.sum()), **verdict}
    for name, fn in pipelines.items():
        row[f"{name}_us"] = us(bench(lambda i, fn=fn: fn(*a, out), prepare=lambda i: poison_(out), **timed))
    # the parts alone, each replayed as a CUDA graph (no host launch time in the numbers)
    score_alone = graphs.LaunchGraphs(lambda *x: score.launch_scores(*x, skip_short_rows=True))
    row["score_us"] = us(bench(lambda i: score_alone(*a[:5], scores), **timed))
    topk_alone = graphs.LaunchGraphs(topk_long.long_topk)
    row["long_topk_us"] = us(bench(lambda i: topk_alone(scores, lens, table, alone), **timed))
    if cluster_fits:
        cluster_alone = graphs.LaunchGraphs(topk_long.cluster_topk)
        row["cluster_topk_us"] = us(bench(lambda i: cluster_alone(scores, lens, table, alone), **timed))
    if shared_rows:
        for name, select in (("filtered_topk", topk.filtered_topk), ("radix_topk", radix_topk)):
            alone_graph = graphs.LaunchGraphs(select)
            row[f"{name}_us"] = us(bench(lambda i, g=alone_graph: g(scores, lens, table, alone), **timed))
    for name, select in splits.items():
        alone_graph = graphs.LaunchGraphs(select)
        row[f"{name}_topk_us"] = us(bench(lambda i, g=alone_graph: g(scores, lens, table, alone), **timed))
    row["key_floor_us"] = row["tokens"] * 132 / 4.24e12 * 1e6
    if case in args.variants.split(","):
        variants = {}
        policy_scores = torch.full_like(scores, float("nan"))
        score.launch_scores(*a[:5], policy_scores, skip_short_rows=True)
        for pages, stages, rows_first in TILES:
            name = tile_name(pages, stages, rows_first)
            if args.tiles and name not in args.tiles.split(","):
                continue
            tile = entry.policy.ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=pages, num_stages=stages, rows_first=rows_first)
            tiled = graphs.LaunchGraphs(lambda *x, tile=tile: score.launch_scores(*x, skip_short_rows=True, tile=tile))
            t = us(bench(lambda i, tiled=tiled: tiled(*a[:5], scores), **timed))
            variants[name] = round(t, 1)
            # the tile's scores against the policy tile's, on the rows both score (L > k; -inf past L)
            tiled_scores = torch.full_like(scores, float("nan"))
            score.launch_scores(*a[:5], tiled_scores, skip_short_rows=True, tile=tile)
            scored = lens > K
            same = torch.equal(tiled_scores[scored], policy_scores[scored])
            variants[f"{name}_same_scores"] = same
        row["score_tiles_us"] = variants
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", default=[], help="shape/distribution glob (repeatable); default: DEFAULT_CASES")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--variants", default="b1_l128k/plain,b8_l64k/plain,b64_l128k/plain,b32_ragged/plain", help="cases timing score tiles")
    p.add_argument(
        "--profile", default="b1_l128k/plain,b8_l64k/plain,b64_l128k/plain,b1_l128k/const", help="cases with a per-kernel profile"
    )
    p.add_argument("--no-old", action="store_true", help="skip the previous pipeline")
    p.add_argument("--tiles", default="", help="score tiles --variants times, comma-separated names (default: all of TILES)")
    p.add_argument("--split", default="", help="chunk lengths of the split top-k to check and time, comma-separated (e.g. 8192,32768)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    entry, score, topk, topk_long, graphs = import_solution()
    print("notes:", entry.solution_notes(), flush=True)
    all_cases = [f"{s}/{d}" for s in SHAPES for d in DISTRIBUTIONS]
    cases = [c for c in all_cases if any(fnmatch.fnmatch(c, g) for g in args.case)] if args.case else DEFAULT_CASES
    old = entry.scored_pipeline(topk.filtered_topk, dependent=True)
    rows = []
    for case in cases:
        timed = dict(warmup=args.warmup, iterations=args.iterations, trials=1, device=device)
        rows.append(run_case(case, entry, score, topk, topk_long, graphs, old, args, timed))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    for row in rows:  # last: the profiler leaves CUPTI blind for the rest of the process
        if row["case"] in args.profile.split(","):
            row["kernels_us"] = profile_case(row["case"], entry, device)
            torch.cuda.empty_cache()
    columns = ("new", "old", "old/new", "long", "cluster", "radix", "score", "ltopk", "ctopk", "ftopk", "rtopk", "floor")
    print(f"\n{'case':<22} " + " ".join(f"{c:>8}" if i < 5 or c == "score" else f"{c:>7}" for i, c in enumerate(columns)) + "  checks")
    for r in rows:
        old_us = r.get("old_us", float("nan"))
        names = ("new", "old", "long", "cluster", "radix")
        names += ("long_topk_exact", "cluster_topk_exact", "filtered_topk_exact", "radix_topk_exact")
        checks = " ".join(f"{k}={r[k][:4]}" for k in names if k in r)
        nan = float("nan")
        times = f"{r['new_us']:8.1f} {old_us:8.1f} {old_us / r['new_us']:7.2f} {r['long_us']:8.1f} {r.get('cluster_us', nan):8.1f}"
        times += f" {r.get('radix_us', nan):8.1f} {r['score_us']:8.1f} {r['long_topk_us']:7.1f} {r.get('cluster_topk_us', nan):7.1f}"
        times += f" {r.get('filtered_topk_us', nan):7.1f} {r.get('radix_topk_us', nan):7.1f}"
        times += f" {r['key_floor_us']:7.1f}"
        print(f"{r['case']:<22} {times}  {checks}")
    for r in rows:
        split_names = sorted(k[: -len("_topk_us")] for k in r if k.startswith("split") and k.endswith("_topk_us"))
        if split_names:
            cells = ", ".join(
                f"{n} {r[n + '_us']:.1f} (top-k alone {r[n + '_topk_us']:.1f}; {r[n][:4]}/{r[n + '_topk_exact'][:4]})" for n in split_names
            )
            print(f"{r['case']:<22} new {r['new_us']:.1f}; {cells}")
    for r in rows:
        for key in ("score_tiles_us", "kernels_us"):
            if key in r:
                print(r["case"], key, r[key])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
