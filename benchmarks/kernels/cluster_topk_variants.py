#!/usr/bin/env python
"""Where the long-row top-k kernels' time goes: variants of ``topk_cluster.cuh`` and ``topk_long.cuh`` timed side by side, on a CUDA GPU.

    python benchmarks/kernels/cluster_topk_variants.py [--variant shipped --variant match_any ...]

Each variant is a copy of the shipped top-k sources with one edit made at a fixed anchor (the script
fails if the kernel no longer has it), built by the solution's own ``cuda_build`` for this GPU into
its own library and called through the library's C entry (``dsa_topk_long_select``; cluster = 1 for the
cluster kernel's variants, 0 for the multi-pass kernel's) on the same score rows:

- ``shipped``: the kernel as it is;
- ``match_any``: the first level's histogram by the filtered kernel's warp-aggregated ``histogram_add``
  (``match.any``) instead of ``histogram_add_spread``;
- ``cut_load``, ``cut_range``, ``cut_level0``: the kernel stopped after its loads, after the
  cluster-wide key range, after the first cluster-wide level (their outputs are not a top-k);
- ``pull``: the owners sum their bins by remote loads of every block's histogram instead of each
  block pushing its non-empty bins by remote atomics;
- ``long``: the multi-pass top-k (``topk_long.cuh``, four launches) as it is;
- ``long_match_any``: the multi-pass top-k with its three histograms updated by ``match.any``'s
  ``histogram_add`` instead of ``histogram_add_spread`` (as it was before 2026-12-07).

Rows: |randn| scores of B x L tokens (and a near-constant row: 99 % of the scores 1.0). Each line
gives the top-k alone (the harness's timer and clean L2 flush through ``bench``, 3 warm-up and 20
timed calls, one trial) and, for the variants that finish, whether every id holds a score at or
above the row's 2048th (``torch.topk``).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from dsa_bench.timing.bench import bench

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "triton"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from indexer_long import import_solution  # noqa: E402

long_topk = import_solution()[3]  # the solution's indexer/cuda_topk_long.py: the library's sources and C signatures
cuda_build = sys.modules[long_topk.__package__.rsplit(".", 1)[0] + ".common.cuda_build"]
TOPK = 2048
CUT = "\n  cluster_sync();\n  return;\n"
PUSH = """  int* owned = s.owned[level];
  for (int b = tid; b < kClusterBins; b += kClusterThreads) {
    const int c = s.hist[b];
    if (c != 0) atomicAdd(cluster_peer(owned + b % kPer, b / kPer), c);
  }
  cluster_sync();"""
PULL = """  int* owned = s.owned[level];
  cluster_sync();
  {
    const int rank = cluster_rank();
    for (int b = tid; b < kPer; b += kClusterThreads) {
      int sum = 0;
      for (int j = 0; j < kBlocks; ++j) sum += cluster_peer(s.hist, j)[rank * kPer + b];
      owned[b] = sum;
    }
  }
  cluster_sync();"""
#: variants of the multi-pass kernel (the others are the cluster kernel's)
MULTI_PASS = ("long", "long_match_any")
FINISHES = ("shipped", "match_any", "pull", *MULTI_PASS)
VARIANTS = (*FINISHES, "cut_load", "cut_range", "cut_level0")
ROWS = ((1, 131072, "randn"), (8, 65536, "randn"), (1, 131072, "near_const"), (32, 32768, "randn"), (64, 32768, "randn"),
        (64, 131072, "randn"))  # fmt: skip
#: the multi-pass kernel's histogram updates (levels 3, 1, 2 in file order)
SPREAD_UPDATES = (
    "histogram_add_spread(s.hist, level_bin<kLongLevels - 1>(",
    "histogram_add_spread(s.hist, level_bin<0>(",
    "histogram_add_spread(s.hist, level_bin<kLevel + 1>(",
)


def _replace(text: str, old: str, new: str, header: str = "topk_cluster.cuh") -> str:
    if old not in text:
        raise SystemExit(f"{header} no longer has the anchor {old.splitlines()[0]!r}: update this script")
    return text.replace(old, new)


def long_variant_source(name: str, text: str) -> str:
    """topk_long.cuh as variant ``name`` has it."""
    if name != "long_match_any":
        return text
    for old in SPREAD_UPDATES:
        text = _replace(text, old, old.replace("histogram_add_spread(", "histogram_add("), "topk_long.cuh")
    return text


def variant_source(name: str, text: str) -> str:
    """topk_cluster.cuh as variant ``name`` has it."""
    if name == "shipped" or name in MULTI_PASS:
        return text
    if name == "match_any":
        return _replace(text, "histogram_add_spread(s.hist, range_bin(", "histogram_add(s.hist, range_bin(")
    if name == "pull":
        return _replace(text, PUSH, PULL)
    if name == "cut_load":
        anchor = "  // This block's key range, then the row's"
        return _replace(text, anchor, "  if (candidates == 12345u) a.out[0] = keys[0] + keys[7];\n  return;\n" + anchor)
    if name == "cut_range":
        anchor = "  lo = s.row_lo;\n  hi = s.row_hi;\n"
        return _replace(text, anchor, anchor + CUT)
    if name == "cut_level0":
        anchor = "    const Threshold t = cluster_level<kBlocks>(level, keys, candidates, lo, shift, need, id_of, out_row, s);\n"
        return _replace(text, anchor, anchor + "    cluster_sync();\n    return;\n")
    raise SystemExit(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}")


def build(name: str, work: Path) -> Any:
    """Variant ``name``'s library (a cuda_build.CudaLibrary), built by the solution's own build code from
    a copy of its sources; the build cache is keyed by the sources, so each variant gets its own."""
    copy = work / name / "triton"
    shutil.copytree(SOLUTION, copy, ignore=shutil.ignore_patterns("__pycache__"))
    header = copy / "indexer" / "csrc" / "topk_cluster.cuh"
    header.write_text(variant_source(name, header.read_text()))
    header = copy / "indexer" / "csrc" / "topk_long.cuh"
    header.write_text(long_variant_source(name, header.read_text()))
    return cuda_build.load_library(f"{long_topk.STEM}_{name}", f"{long_topk.WHAT} ({name})", copy / "indexer", long_topk.SOURCES,
                                   long_topk.HEADERS, long_topk.PREFIX, long_topk.SIGNATURES)  # fmt: skip


def rows(batch: int, length: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    scores = torch.randn(batch, length, device="cuda", generator=generator).abs()
    if kind == "near_const":
        noise = torch.rand(batch, length, device="cuda", generator=generator) < 0.01
        scores = torch.where(noise, scores, torch.ones_like(scores))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="repeatable; default all")
    args = parser.parse_args()
    names = args.variant or list(VARIANTS)
    device = torch.device("cuda")
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(names)) as pool:
        libraries = dict(zip(names, pool.map(lambda n: build(n, Path(tmp)), names), strict=True))
        generator = torch.Generator(device="cuda").manual_seed(0)
        print(f"device: {torch.cuda.get_device_name()}; top-k alone, µs")
        for batch, length, kind in ROWS:
            scores = rows(batch, length, kind, generator)
            lens = torch.full((batch,), length, dtype=torch.int32, device=device)
            table = torch.arange(batch * length // 64, dtype=torch.int32, device=device).view(batch, length // 64)
            out = torch.empty(batch, TOPK, dtype=torch.int32, device=device)
            kth = torch.topk(scores, TOPK, dim=1).values[:, -1:]
            scratch, candidates = long_topk.scratch_for(device, batch, length)  # zero before and after every call
            for name in names:
                stream = torch.cuda.current_stream().cuda_stream
                buffers = (scratch.data_ptr(), candidates.data_ptr()) if name in MULTI_PASS else (None, None)
                select_args = (0, stream, scores.data_ptr(), length, lens.data_ptr(), table.data_ptr(), length // 64, out.data_ptr(),
                               TOPK, *buffers, batch, length, TOPK, 0, int(name not in MULTI_PASS))  # fmt: skip
                call = functools.partial(libraries[name].call, "select", *select_args)
                us = bench(lambda _, call=call: call(), device=device, warmup=3, iterations=20, trials=1).mean_ms * 1e3
                exact = ""
                if name in FINISHES:  # physical id = b * length + position for this table
                    exact = f"  top-k set: {bool((torch.gather(scores, 1, out.long() % length) >= kth).all())}"
                print(f"B={batch} L={length} {kind:10s} {name:11s} {us:6.1f}{exact}", flush=True)


if __name__ == "__main__":
    main()
