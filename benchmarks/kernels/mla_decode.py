#!/usr/bin/env python
"""Time the solution's FP8 sparse MLA decode (solutions/triton/decode) on a CUDA GPU, FlashMLA beside it when it imports.

    python benchmarks/kernels/mla_decode.py [--format V32 --format V4] [--hq 128 --hq 64] [--batch 2 --batch 128]
                                            [--iterations 30] [--trials 3] [--timer auto] [--no-flashmla] [--out results/mla_decode.json]
    python benchmarks/kernels/mla_decode.py --configs [--format V32 --hq 128 --batch 2]   # sweep the config table's knobs
    python benchmarks/kernels/mla_decode.py --list                                         # the configs the policy picks, no GPU
    python benchmarks/kernels/mla_decode.py --variant NAME=REV_OR_DIR [--variant ...]       # other builds of the CUDA kernel beside it
                                            [--time-failed-variants]                       # ablations: timed though they fail the check
    python benchmarks/kernels/mla_decode.py --cuda-splits 16 [--cuda-splits 32 ...]         # the CUDA kernel at forced split counts

Shapes: FlashMLA's production decode shapes by default (V3.2 and V4 records, h_q 128 and 64,
s_q 2, topk 2048, s_k 32768 per sequence, b in {2, 64, 74, 128}, block size 64). Per shape it
builds ``--sets`` input sets on the GPU the way the tests do (``kv_records``' writer, records only
at the tokens some index points to, every other byte NaN-producing, a random block table per
sequence), checks the solution's output (and FlashMLA's) against the definition's fp32 reference on the
dequantized records (out |diff| <= 1e-2 or <= 1e-2 |ref|, lse absolute <= 2.5e-4; a failing
candidate is reported FAIL and not timed), then times each candidate with
``dsa_bench.timing.bench.bench``: outputs re-poisoned and the L2 flushed before every call, the
sets alternating, CUPTI when ``cupti`` imports (first kernel start to last kernel end: FlashMLA's
splitkv + combine, the solution's kernel and its combine launch), else CUDA events, said in the
table. The solution's default path is timed (`cuda` in the table: the hand-written SM90 kernel),
and where that is the CUDA kernel its Triton kernel too (`triton`: the table's config for the
shape). Columns: latency (µs), TFLOPS by FlashMLA's formula 2 b s_q h_q topk (d_qk + 512), GB/s
of q + the distinct records read + out, and the solution's kernel / FlashMLA.

``--variant NAME=REV`` imports the solution as git has it at revision REV (an experiment's tag,
say), or ``NAME=DIR`` from a copy of ``solutions/triton`` in DIR (``git archive TAG solutions/triton
| tar -x -C DIR --strip-components 2``: for a machine without the repository's history), as a
package of its own, builds its CUDA kernel, and times its entry beside the shipped build, checked
the same way (`variant NAME` in the table): a side-by-side measurement of an experiment in one
run, whatever its scratch or C ABI.

``--cuda-splits N`` (repeatable) also times the shipped CUDA kernel with every query token split N
ways (`splits=N` in the table; the policy's own schedule is the `cuda` row), checked the same way: the
schedule's choice against its neighbours without a policy variant. A count the kernel refuses for the
shape (more splits than tiles) is reported as an error row.

FlashMLA (``sgl-flash-mla``, BRIEF §2.4) is called as ``get_mla_metadata()`` then
``flash_mla_with_kvcache(q, cache, None, None, 512, meta, softmax_scale=..., is_fp8_kvcache=True,
indices=..., use_legacy=True, kv_format=...)``; its first call (a warm-up, untimed) fills the
schedule metadata, reused while the shapes stay the same; its lse [b, h_q, s_q] is transposed
for the check.

``--configs`` (the Triton kernel's knobs) times, per shape, the policy's config and then one knob at a time (block_n 32 / 64
/ 128, num_stages 1 / 2, l2_prefetch, splits S/2, S, 2S and 1 with each combine that applies,
partial dtype; ``--more-knobs`` adds 16 warps and 3 stages), keeping the best so far (coordinate
descent: ~12 configs per shape, compiled kernels shared across shapes of one format), and
prints the best per shape and CONFIG_TABLE rules to paste into solutions/triton/decode/policy.py.
The whole default sweep is meant to fit one device call of < 4 minutes (short trials: 2 warm-up
calls, 10 iterations, 1 trial); narrow it with --format / --hq / --batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dsa_bench.definitions import kv_records as kvr
from dsa_bench.definitions import mla_decode
from dsa_bench.results.environment import environment
from dsa_bench.results.records import now_iso
from dsa_bench.timing.bench import bench

ROOT = Path(__file__).resolve().parents[2]
FORMATS = {"V32": kvr.V32, "V4": kvr.V4}
OUT_TOL = 1e-2
LSE_ATOL = 2.5e-4
#: FlashMLA's numbers on the H200 (BRIEF §2.4, kernel spans after a clean L2 flush), µs, by (format, h_q, b)
FLASHMLA_H200_US = {("V32", 128, 2): 19.5, ("V32", 128, 64): 180, ("V32", 128, 74): 217, ("V32", 128, 128): 353,
                    ("V32", 64, 2): 19.8, ("V32", 64, 128): 222, ("V4", 128, 2): 21.3, ("V4", 128, 64): 174,
                    ("V4", 128, 74): 209, ("V4", 128, 128): 339, ("V4", 64, 2): 20.0, ("V4", 64, 128): 246}  # fmt: skip


def solution_package(package: str, folder: Path) -> str:
    """``package`` registered as a package rooted at ``folder`` (a copy of solutions/triton), as the
    harness imports an entry, so that its modules import each other relatively; returns the name."""
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [str(folder)]
        sys.modules[package] = module
    return package


def load_decode():
    """The decode modules (entry, config) of the shipped solution, without importing the other
    families' entries (the attention's builds its CUDA extension at import)."""
    package = solution_package("dsa_bench_kernels_triton_solution", ROOT / "solutions" / "triton")
    return importlib.import_module(f"{package}.decode.entry"), importlib.import_module(f"{package}.decode.policy")


#: what a copy of solutions/triton must hold to be a variant: the decode's entry and the common helpers
VARIANT_FILES = ("decode/entry.py", "decode/cuda.py", "common/cuda_build.py")


def variant_sources(spec: str, into: Path) -> tuple[str, Path]:
    """``NAME=REV`` or ``NAME=DIR`` (see the module doc) as (name, a copy of solutions/triton as
    git has it at REV or as DIR holds it). Raises ValueError naming what is wrong."""
    name, sep, source = spec.partition("=")
    if not sep or not name.isidentifier() or not source:
        raise ValueError(f"--variant {spec!r}: expected NAME=REV or NAME=DIR (NAME a Python identifier)")
    folder = into / name
    if Path(source).is_dir():
        missing = [f for f in VARIANT_FILES if not (Path(source) / f).is_file()]
        if missing:
            raise ValueError(f"--variant {spec!r}: {source} has no {', '.join(missing)} (expected a copy of solutions/triton)")
        shutil.copytree(Path(source), folder, ignore=shutil.ignore_patterns("__pycache__"))
        return name, folder
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", source, "solutions/triton"], capture_output=True,
                             check=False)  # fmt: skip
    if archive.returncode != 0:
        raise ValueError(f"--variant {spec!r}: {source} is neither a folder nor a git revision with solutions/triton: "
                         f"{archive.stderr.decode(errors='replace').strip()[-200:]}")  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():  # solutions/triton/<path> -> <folder>/<path>
            member.name = member.name.removeprefix("solutions/triton/")
        tar.extractall(folder, filter="data")
    return name, folder


def import_variant(name: str, folder: Path):
    """The variant's decode modules (entry, cuda), imported from its own copy of solutions/triton as
    a package of its own, so that its Python, its scratch and its C ABI go together."""
    package = solution_package(f"dsa_bench_kernels_variant_{name}", folder)
    return importlib.import_module(f"{package}.decode.entry"), importlib.import_module(f"{package}.decode.cuda")


@dataclasses.dataclass(frozen=True)
class Shape:
    kv_format: str
    h_q: int
    b: int
    s_q: int
    topk: int
    s_k: int
    block_size: int

    @property
    def fmt(self) -> kvr.KvRecordFormat:
        return FORMATS[self.kv_format]

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.s_q * self.h_q * self.topk * (self.fmt.d_qk + 512)

    def __str__(self) -> str:
        return f"{self.kv_format} h{self.h_q} b{self.b} s_q{self.s_q} topk{self.topk}"


def make_inputs(shape: Shape, seed: int, device: torch.device) -> dict[str, Any]:
    """One input set: a paged cache of b sequences of s_k tokens (a random block table each),
    records written only at the selected tokens, NaN-producing bytes elsewhere."""
    fmt, bs = shape.fmt, shape.block_size
    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-shape.s_k // bs)
    num_blocks = shape.b * blocks_per_seq
    backing = torch.full((num_blocks, fmt.page_stride(bs)), kvr.FP8_NAN_BYTE, dtype=torch.uint8, device=device)
    if fmt.scale_dtype == "fp32":
        fmt.scales(backing, bs).fill_(float("nan"))
    block_table = torch.randperm(num_blocks, generator=g, device=device).view(shape.b, blocks_per_seq)
    rows = shape.b * shape.s_q
    positions = torch.argsort(torch.rand(rows, shape.s_k, generator=g, device=device), dim=1)[:, : shape.topk]  # distinct
    batch = torch.arange(rows, device=device) // shape.s_q
    indices = (block_table[batch[:, None], positions // bs] * bs + positions % bs).to(torch.int32)
    used = torch.unique(indices)
    x = torch.randn(used.numel(), fmt.input_dims, generator=g, device=device) * 2
    fmt.write(backing, bs, used, fmt.quantize(x, "flashmla"))
    cache = backing.as_strided((num_blocks, bs, 1, fmt.bytes_per_token), (backing.stride(0), fmt.bytes_per_token, fmt.bytes_per_token, 1))
    q = torch.randn(shape.b, shape.s_q, shape.h_q, fmt.d_qk, generator=g, device=device).to(torch.bfloat16)
    return {"q": q, "kv_cache": cache, "backing": backing, "indices": indices.view(shape.b, shape.s_q, shape.topk),
            "sm_scale": fmt.d_qk**-0.55, "distinct_tokens": int(used.numel())}  # fmt: skip


def reference(shape: Shape, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition's fp32 reference (``mla_decode.attend``, no sink): out [b, s_q, h_q, 512] and
    natural-log lse on the dequantized records."""
    no_sink = torch.full((shape.h_q,), float("-inf"), device=inputs["q"].device)
    return mla_decode.attend(shape.fmt, inputs["q"], inputs["kv_cache"], inputs["indices"], inputs["sm_scale"], no_sink)


def compare(out: torch.Tensor, lse: torch.Tensor, ref: tuple[torch.Tensor, torch.Tensor]) -> tuple[bool, float, float]:
    """(passed, max |out diff|, max |lse diff|) under the brief's rule."""
    out = out.float()
    diff = (out - ref[0]).abs()
    ok_out = bool(((diff <= OUT_TOL) | (diff <= OUT_TOL * ref[0].abs())).all()) and not out.isnan().any()
    lse_diff = (lse - ref[1]).abs()
    ok_lse = bool((lse_diff <= LSE_ATOL).all())
    return ok_out and ok_lse, float(diff.nan_to_num(float("inf")).max()), float(lse_diff.nan_to_num(float("inf")).max())


class Candidates:
    """The callables timed per shape: triton with a config, FlashMLA when it imports."""

    def __init__(self, entry, shape: Shape, sets: list[dict[str, Any]]) -> None:
        self.entry, self.shape, self.sets = entry, shape, sets
        b, s_q, h_q = shape.b, shape.s_q, shape.h_q
        device = sets[0]["q"].device
        self.outs = [(torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device=device), torch.empty(b, s_q, h_q, device=device))
                     for _ in sets]  # fmt: skip

    def poison(self, i: int) -> None:
        out, lse = self.outs[i % len(self.sets)]
        out.fill_(float("nan"))
        lse.fill_(float("nan"))

    def triton(self, config) -> Callable[[int], object]:
        fmt = self.shape.fmt

        def call(i: int) -> None:
            s = self.sets[i % len(self.sets)]
            out, lse = self.outs[i % len(self.sets)]
            self.entry.mla_decode(fmt, s["q"], s["kv_cache"], s["indices"], s["sm_scale"], None, None, out, lse, config)

        return call

    def flashmla(self, flash_mla) -> Callable[[int], object]:
        metas = [flash_mla.get_mla_metadata()[0] for _ in self.sets]  # one schedule per set: filled by its first call
        caches = [s["kv_cache"].view(torch.float8_e4m3fn) for s in self.sets]

        def call(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            k = i % len(self.sets)
            s = self.sets[k]
            out, lse = flash_mla.flash_mla_with_kvcache(
                s["q"], caches[k], None, None, 512, metas[k], softmax_scale=s["sm_scale"], is_fp8_kvcache=True, indices=s["indices"],
                use_legacy=True, kv_format=self.shape.kv_format,
            )  # fmt: skip
            return out, lse

        for k in range(len(self.sets)):  # the metadata is filled outside every timed call
            call(k)
        torch.cuda.synchronize()
        return call


def time_call(call, candidates: Candidates, args) -> tuple[float, str]:
    result = bench(call, warmup=args.warmup, iterations=args.iterations, trials=args.trials, prepare=candidates.poison, timer=args.timer)
    return result.mean_ms * 1e3, result.timer


def shapes_from(args) -> list[Shape]:
    return [Shape(f, h, b, args.s_q, args.topk, args.s_k, args.block_size) for f in args.format for h in args.hq for b in args.batch]


def row(shape: Shape, name: str, us: float | None, timer: str, check: tuple[bool, float, float] | None, bytes_moved: int) -> dict[str, Any]:
    record: dict[str, Any] = {"shape": str(shape), "candidate": name, "us": us, "timer": timer}
    if check is not None:
        record.update(passed=check[0], max_out_diff=check[1], max_lse_diff=check[2])
    if us:
        record.update(tflops=shape.flops / (us * 1e-6) / 1e12, gbps=bytes_moved / (us * 1e-6) / 1e9)
    return record


def bytes_moved(shape: Shape, inputs: dict[str, Any]) -> int:
    """q + the distinct records + out (bf16) + lse, as FlashMLA's tests count a decode's memory volume."""
    rows = shape.b * shape.s_q * shape.h_q
    return 2 * rows * shape.fmt.d_qk + inputs["distinct_tokens"] * shape.fmt.bytes_per_token + 2 * rows * 512 + 4 * rows


def check_triton(entry, shape: Shape, inputs, config, ref) -> tuple[tuple[bool, float, float], object]:
    b, s_q, h_q = shape.b, shape.s_q, shape.h_q
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=inputs["q"].device)
    lse = torch.full((b, s_q, h_q), float("nan"), device=inputs["q"].device)
    used = entry.mla_decode(shape.fmt, inputs["q"], inputs["kv_cache"], inputs["indices"], inputs["sm_scale"], None, None, out, lse, config)
    if out.is_cuda:
        torch.cuda.synchronize()
    return compare(out, lse, ref), used


def forced_splits(entry, config_mod, shape: Shape, candidates: Candidates, ref, args, moved: int) -> list[dict[str, Any]]:
    """--cuda-splits: the CUDA kernel with every query token split N ways, one record per N."""
    records = []
    for splits in args.cuda_splits:
        config = dataclasses.replace(config_mod.cuda_base_config(shape.h_q), splits=splits, whole_tokens=0,
                                     combine="none" if splits == 1 else "two_launch")  # fmt: skip
        try:
            check, _ = check_triton(entry, shape, candidates.sets[0], config, ref)
        except ValueError as exc:  # a count the kernel refuses for this shape
            records.append({"shape": str(shape), "candidate": f"splits={splits}", "us": None, "error": str(exc)[:300]})
            continue
        us, timer = time_call(candidates.triton(config), candidates, args) if check[0] else (None, "FAIL")
        records.append(row(shape, f"splits={splits}", us, timer, check, moved))
    return records


def sweep(entry, config_mod, shape: Shape, candidates: Candidates, ref, args, sms: int) -> list[dict[str, Any]]:
    """Coordinate descent over the config knobs from the policy's config; returns every timed record."""
    DecodeConfig = config_mod.DecodeConfig
    best = config_mod.select_config(shape.kv_format, shape.h_q, shape.b * shape.s_q, shape.topk, sms)
    tried: dict[Any, float | None] = {}
    records = []

    def attempt(config) -> float | None:
        key = dataclasses.astuple(config)
        if key in tried:
            return tried[key]
        us = None
        try:
            check, used = check_triton(entry, shape, candidates.sets[0], config, ref)
            if check[0]:
                us, timer = time_call(candidates.triton(config), candidates, args)
            else:
                timer = "FAIL"
            records.append(row(shape, f"triton {used}", us, timer, check, bytes_moved(shape, candidates.sets[0])))
        except Exception as exc:  # a config that does not compile or launch (shared memory, registers, refused combine)
            error = f"{type(exc).__name__}: {exc}"[:300]
            records.append({"shape": str(shape), "candidate": f"triton {config}", "us": None, "error": error})
        tried[key] = us
        print(f"  {config}: {'-' if us is None else f'{us:.1f} us'}", flush=True)
        return us

    best_us = attempt(best)
    units = shape.b * shape.s_q * (shape.h_q // best.block_h)
    split_options = sorted({s for s in (1, best.splits // 2, best.splits, best.splits * 2) if 1 <= s <= config_mod.MAX_SPLITS})
    knobs: list[list[Any]] = [
        [dataclasses.replace(best, block_n=n) for n in (32, 64, 128)],
        [dataclasses.replace(best, num_stages=n) for n in (1, 2)],
        [dataclasses.replace(best, l2_prefetch=v) for v in (True, False)],
        [DecodeConfig(**{**dataclasses.asdict(best), "splits": s, "combine": c})
         for s in split_options for c in (("none",) if s == 1 else ("barrier", "last", "two_launch"))
         if not (c == "barrier" and units * s > sms)],
        [dataclasses.replace(best, partial_dtype=d) for d in ("fp32", "bf16")],
    ]  # fmt: skip
    if shape.h_q < config_mod.DESIGN_BLOCK_H:  # 16 or 32 heads: a small accumulator, so fewer warps and more
        # programs per SM are in reach, and splits past the one-program-per-SM cost model's choice
        knobs.insert(0, [dataclasses.replace(best, num_warps=w) for w in (2, 4, 8)])
        knobs.append([DecodeConfig(**{**dataclasses.asdict(best), "splits": s, "combine": c})
                      for s in (1, 2, 4, 8, 16, 32) if s not in split_options
                      for c in (("none",) if s == 1 else ("last", "two_launch"))])
    if args.more_knobs:  # 16 warps (acc 64 registers, but 128 per thread at most: ~1 KB spilled), 3 stages
        knobs += [[dataclasses.replace(best, num_warps=16)], [dataclasses.replace(best, num_stages=3)]]
    for options in knobs:
        for option in options:
            if option.splits == 1 and option.partial_dtype != best.partial_dtype:
                continue  # no partials at one split
            option = dataclasses.replace(option, block_n=min(option.block_n, -(-shape.topk // option.splits)))
            us = attempt(option)
            if us is not None and (best_us is None or us < best_us):
                best, best_us = option, us
    print(f"  best: {best} {best_us if best_us is None else f'{best_us:.1f} us'}")
    records.append({"shape": str(shape), "best": dataclasses.asdict(best), "best_us": best_us})
    return records


def print_rules(best: dict[Shape, dict[str, Any]]) -> None:
    print("\n# CONFIG_TABLE rules from this sweep (paste above the catch-all in solutions/triton/decode/policy.py):")
    for shape in sorted(best, key=lambda s: (s.kv_format, s.h_q, s.b)):
        fields = ", ".join(f"{k}={v!r}" for k, v in best[shape].items())
        print(f"    ConfigRule({shape.kv_format!r}, {shape.h_q}, {shape.b * shape.s_q}, DecodeConfig({fields})),")


def list_configs(config_mod, shapes: list[Shape], sms: int) -> None:
    for shape in shapes:
        config = config_mod.select_config(shape.kv_format, shape.h_q, shape.b * shape.s_q, shape.topk, sms)
        tokens = shape.b * shape.s_q
        programs = tokens * (shape.h_q // config.block_h) * config.splits
        print(f"{shape}: {config} -> {programs} programs")
        if shape.h_q in (16, 32) or shape.h_q % 64 == 0:  # the SM90 kernel's schedule (both of FORMATS)
            cuda = config_mod.cuda_config(tokens, shape.h_q, shape.topk, sms)
            split = tokens - cuda.whole_tokens if cuda.splits > 1 else 0  # one split: every token whole
            whole = tokens - split
            programs = (whole + split * cuda.splits) * (shape.h_q // cuda.block_h)
            split_part = f", {split} split {cuda.splits} ways" if split else ""
            print(f"{shape}: SM90 CUDA kernel: {whole} tokens whole{split_part} -> {programs} programs")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", action="append", choices=sorted(FORMATS), help="record format (repeatable; default V32 and V4)")
    p.add_argument("--hq", action="append", type=int, help="query heads (repeatable; default 128 and 64)")
    p.add_argument("--batch", action="append", type=int, help="batch sizes (repeatable; default 2, 64, 74, 128)")
    p.add_argument("--s-q", type=int, default=2)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--s-k", type=int, default=32768, help="tokens per sequence")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--sets", type=int, default=2, help="input sets the timed calls rotate among")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--timer", default="auto", choices=("auto", "cupti", "events"))
    p.add_argument("--no-flashmla", action="store_true", help="do not run FlashMLA even when it imports")
    p.add_argument("--configs", action="store_true", help="sweep the config knobs per shape (coordinate descent)")
    p.add_argument("--more-knobs", action="store_true", help="with --configs: also 16 warps and 3 stages")
    p.add_argument("--list", action="store_true", help="print the config the policy picks per shape (H200: 132 SMs without a GPU)")
    p.add_argument("--out", type=Path, help="write the records as JSON")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=REV_OR_DIR",
                   help="also time the CUDA kernel built from git revision REV or from DIR, a copy of solutions/triton")  # fmt: skip
    p.add_argument("--cuda-splits", type=int, action="append", default=[], metavar="N",
                   help="also time the CUDA kernel with every query token split N ways (repeatable)")  # fmt: skip
    p.add_argument("--time-failed-variants", action="store_true",
                   help="time a --variant even when it fails the check (an ablation that skips part of the work)")  # fmt: skip
    p.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="no GPU: build the inputs and check the kernels under the Triton interpreter, untimed (pass small shapes)",
    )
    args = p.parse_args(argv)
    args.format = args.format or ["V32", "V4"]
    args.hq = args.hq or [128, 64]
    args.batch = args.batch or [2, 64, 74, 128]
    if args.configs:  # a sweep times many configs: fewer, shorter trials
        args.iterations, args.trials, args.warmup = min(args.iterations, 10), 1, min(args.warmup, 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    entry, config_mod = load_decode()
    shapes = shapes_from(args)
    if args.list:
        list_configs(config_mod, shapes, torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132)
        return 0
    if args.cpu_dry_run:
        return dry_run(entry, config_mod, shapes, args)
    if not torch.cuda.is_available():
        print("mla_decode.py times on a CUDA GPU; --list and --cpu-dry-run work without one", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    package = entry.__name__.rsplit(".", 2)[0]
    cuda_build = importlib.import_module(f"{package}.common.cuda_build")
    variants = []
    scratch = tempfile.TemporaryDirectory(prefix="mla_decode_variants_")  # the variants' modules import from it until the end
    try:
        for spec in args.variant:
            name, folder = variant_sources(spec, Path(scratch.name))
            variant_entry, variant_cuda = import_variant(name, folder)
            variant_cuda.load_decode_extension()  # built for this GPU now: a build error stops the run before any timing
            variants.append((name, variant_entry))
            print(f"variant {name}: built from {spec.partition('=')[2]}", flush=True)
    except Exception as exc:  # a bad --variant, a build error, or the variant's own Python failing to import
        known = isinstance(exc, (ValueError, cuda_build.CudaBuildError))
        print(f"mla_decode.py: {exc}" if known else f"mla_decode.py: the variant does not load: {type(exc).__name__}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    flash_mla, why_not = None, "--no-flashmla"
    if not args.no_flashmla:
        try:
            import flash_mla  # type: ignore[import-not-found]
        except Exception as exc:  # not installed, wrong torch, not SM90/SM100
            flash_mla, why_not = None, f"{type(exc).__name__}: {exc}"
    print(f"FlashMLA: {'imported' if flash_mla else 'not run (' + why_not + ')'}; {sms} SMs; {torch.cuda.get_device_name(device)}")
    records: list[dict[str, Any]] = []
    best: dict[Shape, dict[str, Any]] = {}
    started = time.time()
    for shape in shapes:
        print(f"{shape}:", flush=True)
        sets = [make_inputs(shape, seed, device) for seed in range(args.sets)]
        ref = reference(shape, sets[0])
        moved = bytes_moved(shape, sets[0])
        candidates = Candidates(entry, shape, sets)
        if args.configs:
            swept = sweep(entry, config_mod, shape, candidates, ref, args, sms)
            records += swept
            if swept[-1].get("best_us") is not None:
                best[shape] = swept[-1]["best"]
        else:
            check, used = check_triton(entry, shape, sets[0], None, ref)
            us, timer = time_call(candidates.triton(None), candidates, args) if check[0] else (None, "FAIL")
            records.append(row(shape, f"triton {used}", us, timer, check, moved))
            if used.kernel == "cuda":  # the variant builds, then the Triton kernel the solution runs elsewhere, side by side
                for name, variant_entry in variants:
                    theirs = Candidates(variant_entry, shape, sets)
                    check, _ = check_triton(variant_entry, shape, sets[0], None, ref)
                    if check[0] or args.time_failed_variants:
                        us, timer = time_call(theirs.triton(None), theirs, args)
                        timer = timer if check[0] else f"FAIL, timed: {timer}"
                    else:
                        us, timer = None, "FAIL"
                    records.append(row(shape, f"variant {name}", us, timer, check, moved))
                records += forced_splits(entry, config_mod, shape, candidates, ref, args, moved)
                config = config_mod.select_config(shape.kv_format, shape.h_q, shape.b * shape.s_q, shape.topk, sms)
                check, used = check_triton(entry, shape, sets[0], config, ref)
                us, timer = time_call(candidates.triton(config), candidates, args) if check[0] else (None, "FAIL")
                records.append(row(shape, f"triton {used}", us, timer, check, moved))
        if flash_mla is not None and shape.kv_format in ("V32", "V4"):
            try:
                call = candidates.flashmla(flash_mla)
                out, lse = call(0)
                torch.cuda.synchronize()
                check = compare(out, lse.transpose(1, 2), ref)
                us, timer = time_call(call, candidates, args) if check[0] else (None, "FAIL")
                records.append(row(shape, "flashmla", us, timer, check, moved))
            except Exception as exc:
                records.append({"shape": str(shape), "candidate": "flashmla", "us": None, "error": f"{type(exc).__name__}: {exc}"[:300]})
        del sets, candidates, ref
        torch.cuda.empty_cache()
    print_table(records, shapes)
    if best:
        print_rules(best)
    print(f"\n{len(shapes)} shapes in {time.time() - started:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": " ".join(sys.argv), "date": now_iso(), "environment": environment(device), "records": records}
        args.out.write_text(json.dumps(doc, indent=1, default=str))
        print(f"wrote {args.out}")
    failed = [r["candidate"] + " on " + r["shape"] for r in records if r.get("passed") is False]
    if failed:
        print("FAILED the check: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


def dry_run(entry, config_mod, shapes: list[Shape], args) -> int:
    """Inputs, reference and check of this script on the CPU: the interpreter's config and two
    split configs per shape (the GPU's barrier cannot run there)."""
    DecodeConfig = config_mod.DecodeConfig
    failed = 0
    for shape in shapes:
        inputs = make_inputs(shape, 0, torch.device("cpu"))
        ref = reference(shape, inputs)
        block_n = min(32, shape.topk // 2)
        split_configs = [DecodeConfig(block_n=block_n, splits=2, combine=combine) for combine in ("two_launch", "last")]
        for config in (None, *split_configs):
            check, used = check_triton(entry, shape, inputs, config, ref)
            failed += not check[0]
            print(f"{shape}: {used}: {'PASS' if check[0] else 'FAIL'} (max |out diff| {check[1]:.3g}, max |lse diff| {check[2]:.3g})")
    return 1 if failed else 0


def print_table(records: list[dict[str, Any]], shapes: list[Shape]) -> None:
    header = f"{'shape':<28} {'candidate':<12} {'us':>9} {'TFLOPS':>7} {'GB/s':>6} {'check':>6} {'vs flashmla':>11} {'H200 anchor':>11}"
    print(f"\n{header}  timer")
    for shape in shapes:
        mine = [r for r in records if r["shape"] == str(shape) and "candidate" in r]
        flash = next((r["us"] for r in mine if r["candidate"] == "flashmla" and r.get("us")), None)
        shown = []
        for kernel in ("cuda", "triton"):  # the solution's kernels: the best timed row of each
            rows = [r for r in mine if r["candidate"].startswith("triton") and f"kernel='{kernel}'" in r["candidate"]]
            timed = [r for r in rows if r.get("us")]
            shown += [min(timed, key=lambda r: r["us"])] if timed else rows[:1]
        shown += [r for r in mine if r["candidate"].startswith(("variant ", "splits="))]
        shown += [r for r in mine if r["candidate"] == "flashmla"]
        anchor = FLASHMLA_H200_US.get((shape.kv_format, shape.h_q, shape.b))
        for r in shown:
            if r["candidate"] == "flashmla" or r["candidate"].startswith(("variant ", "splits=")):
                name = r["candidate"].removeprefix("variant ")
            else:
                name = "cuda" if "kernel='cuda'" in r["candidate"] else "triton"
            us = r.get("us")
            ratio = f"{flash / us:.2f}x" if us and flash and name != "flashmla" else ""
            check = "error" if "error" in r else ("PASS" if r.get("passed") else "FAIL")
            print(f"{str(shape):<28} {name:<12} {us or float('nan'):>9.1f} {r.get('tflops', float('nan')):>7.0f} "
                  f"{r.get('gbps', float('nan')):>6.0f} {check:>6} {ratio:>11} {anchor or '':>11}  {r.get('timer', '')}")  # fmt: skip
        for r in mine:
            if "error" in r:
                print(f"    {r['candidate']}: {r['error']}")


if __name__ == "__main__":
    sys.exit(main())
