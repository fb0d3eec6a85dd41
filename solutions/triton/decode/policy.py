"""How one decode call is tiled and launched: ``DecodeConfig``, the tunable table ``CONFIG_TABLE`` and the policy.

A config fixes the program tile (BLOCK_H heads x BLOCK_N records per step), the split count S
over the topk positions, Triton's num_warps / num_stages, how the S partials are combined and the
partials' storage. ``select_config`` takes the first ``CONFIG_TABLE`` rule that matches the call
(format, h_q, query tokens b * s_q); a rule's ``splits = 0`` lets ``auto_splits`` choose S from
the SM count. ``benchmarks/kernels/mla_decode.py --configs`` sweeps candidates on the GPU and
prints rules to paste here.

Combines (``combine``):

* ``auto``: S = 1 needs none; else ``barrier`` when the grid fits one program per SM (then it is
  co-resident: any kernel that launches at all fits one program per SM), else ``two_launch``.
  ``DSA_DECODE_TWO_LAUNCH=1`` forces ``two_launch`` (an environment where the SM count
  overstates what this process gets: MPS with an active-thread percentage, green contexts).
* ``barrier``: in the same launch behind the ticket barrier, each program combining 512 / S
  columns (refused when the grid could exceed one program per SM, and under the interpreter).
  The CUDA kernel has it too (its split programs merge an S-th of their unit's partials each);
  its ``auto`` takes it only where ``in_launch_combine_pays``, else ``two_launch``.
* ``last``: in the same launch, the last program to arrive combines the whole unit (any grid).
* ``two_launch``: a second kernel.
* ``none``: S = 1, the program writes the output itself (what ``auto`` resolves to at S = 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from .shapes import D_V, MIN_DOT_DIM
from .triton_kernels import TICKETS_PER_CALL

COMBINES = ("auto", "barrier", "last", "two_launch", "none")
#: which kernel a config runs: the Triton kernel (triton_kernels.py; GPU and interpreter) or the
#: hand-written SM90 one (cuda.py; V3.2 and V4 on an H100/H200)
KERNELS = ("triton", "cuda")
PARTIAL_DTYPES = ("bf16", "fp32")
#: Heads per program the kernel is designed for: acc [64, 512] fp32 is 128 registers per thread
#: at 8 warps, and 64 is wgmma's M (docs/kernels/mla_decode.md, "Tiling").
DESIGN_BLOCK_H = 64
MAX_SPLITS = 32  #: 512 / 32 = 16 value columns per combining program; divides TICKETS_PER_CALL


@dataclass(frozen=True)
class DecodeConfig:
    """One call's tiling. ``splits`` 0: chosen by ``auto_splits``; ``combine``: see the module docstring;
    ``l2_prefetch``: the next block's records are prefetched into L2 while the current one is
    attended (``prefetch.global.L2``; compiled code only); ``whole_tokens`` (CUDA kernel only): the
    first that many query tokens take one program per head block and only the later ones are split
    ``splits`` ways (``cuda_schedule``; 0: every token split)."""

    block_h: int = DESIGN_BLOCK_H
    block_n: int = 64
    splits: int = 0
    num_warps: int = 8
    num_stages: int = 1
    combine: str = "auto"
    partial_dtype: str = "fp32"
    l2_prefetch: bool = True
    kernel: str = "triton"
    whole_tokens: int = 0

    def validate(self, h_q: int, topk: int) -> None:
        """Raises ValueError naming the config and what it gets wrong for (h_q, topk)."""
        if self.kernel not in KERNELS:
            raise ValueError(f"{self}: kernel must be one of {', '.join(KERNELS)}")
        if self.kernel == "cuda":
            self._validate_cuda(h_q)
            return
        if self.whole_tokens:
            raise ValueError(f"{self}: whole_tokens is the CUDA kernel's schedule; the Triton kernel splits every token")
        if not _is_pow2(self.block_h) or self.block_h < MIN_DOT_DIM or h_q % self.block_h:
            raise ValueError(f"{self}: block_h must be a power of two >= {MIN_DOT_DIM} dividing h_q = {h_q}")
        if not _is_pow2(self.block_n) or self.block_n < MIN_DOT_DIM:
            raise ValueError(f"{self}: block_n must be a power of two >= {MIN_DOT_DIM} (a tl.dot dimension)")
        if self.splits < 1 or not _is_pow2(self.splits) or self.splits > MAX_SPLITS:
            raise ValueError(f"{self}: splits must be a power of two in [1, {MAX_SPLITS}] (0 only before auto_splits)")
        assert D_V % self.splits == 0 and TICKETS_PER_CALL % self.splits == 0
        split_len = -(-topk // self.splits)
        if self.block_n > split_len:
            raise ValueError(f"{self}: block_n {self.block_n} > split size {split_len} (topk {topk}) would read other splits' slots")
        if self.combine not in COMBINES:
            raise ValueError(f"{self}: combine must be one of {', '.join(COMBINES)}")
        if (self.combine == "none") != (self.splits == 1) and self.combine != "auto":
            raise ValueError(f"{self}: combine 'none' goes with exactly one split")
        if self.partial_dtype not in PARTIAL_DTYPES:
            raise ValueError(f"{self}: partial_dtype must be one of {', '.join(PARTIAL_DTYPES)}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"{self}: num_warps in 1..16 (a power of two), num_stages >= 1")

    def _validate_cuda(self, h_q: int) -> None:
        base = cuda_base_config(h_q)
        if self != replace(base, splits=self.splits, combine=self.combine, whole_tokens=self.whole_tokens):
            raise ValueError(f"{self}: the CUDA kernel's tiling is fixed ({base}); only splits, whole_tokens and combine vary")
        if h_q % self.block_h:
            raise ValueError(f"{self}: h_q = {h_q} must be a multiple of {self.block_h}")
        if not 1 <= self.splits <= MAX_SPLITS:
            raise ValueError(f"{self}: splits must be in [1, {MAX_SPLITS}]")
        if self.combine not in ("none", "two_launch", "barrier") or (self.combine == "none") != (self.splits == 1):
            raise ValueError(f"{self}: the CUDA kernel combines splits behind its ticket barrier ('barrier') or in a second "
                             "launch ('two_launch'); one split needs none")
        if self.whole_tokens < 0 or (self.splits == 1 and self.whole_tokens):
            raise ValueError(f"{self}: whole_tokens must be >= 0, and 0 with one split (every token is whole then)")


#: The hand-written SM90 kernel (cuda.py, csrc/): 64 heads x 64 records per step, two consumer
#: warpgroups and one producer warpgroup (V4: 12 warps) or two (V3.2: 16 warps; csrc/config.cuh's
#: m64_producer_groups decides, num_warps here is descriptive), two dequantized stages, fp16
#: partials with a per-thread fp32 scale merged by the library's own combine kernel
#: (csrc/decode_sm90.h). Only the split count is chosen per call.
CUDA_CONFIG = DecodeConfig(block_h=64, block_n=64, splits=0, num_warps=12, num_stages=2, combine="auto", partial_dtype="fp16",
                           l2_prefetch=True, kernel="cuda")  # fmt: skip


#: The 16/32-head CUDA kernel (csrc/kernel_m16.cuh): all h_q heads of a query token x 64 records
#: per step (16 heads mma.sync m16n8k16, 32 heads transposed wgmma: consumer_st.cuh), 16 warps (two warpgroups of the same producer
#: and eight consumer warps), two stages, the same fp16 partials and combine. Only the schedule varies.
CUDA_SMALL_HEADS = (16, 32)
M16_WARPS = 16  #: csrc/config.cuh's M16Roles with kM16ProducerGroups = 2: 2 x 4 producer warps + 8 consumer warps


def cuda_base_config(h_q: int) -> DecodeConfig:
    """The CUDA kernel's fixed tiling for ``h_q`` heads (splits 0: chosen per call)."""
    return replace(CUDA_CONFIG, block_h=h_q, num_warps=M16_WARPS) if h_q in CUDA_SMALL_HEADS else CUDA_CONFIG


def cuda_config(tokens: int, h_q: int, topk: int, sm_count: int) -> DecodeConfig:
    """The CUDA kernel's config of a call: ``cuda_schedule`` over its one-program-per-SM grid (at 16
    and 32 heads one program per query token and split, e.g. b = 8, s_q = 1: 8 x 16 programs), and
    when a token is split, the combine ``resolve_cuda_combine`` picks."""
    base = cuda_base_config(h_q)
    whole, splits = cuda_schedule(tokens, h_q // base.block_h, topk, base.block_n, sm_count)
    return resolve_cuda_combine(replace(base, splits=splits, whole_tokens=whole), tokens, h_q, sm_count)


#: consumer threads of a CUDA program, which share its unit's merge in the in-launch combine
CUDA_CONSUMER_THREADS = 256


def in_launch_combine_pays(h_q: int, splits: int) -> bool:
    """Whether ``auto`` takes the CUDA kernel's in-launch combine (where it is safe): at 16 and 32
    heads when each consumer thread merges at most one 8-byte fragment of its unit (h_q * D_V / 4
    fragments over ``splits`` programs of 256 threads: 16 heads from 8 splits, 32 from 16). A thread
    with two passed over every split's lse twice and lost to the combine kernel (H100, kernels alone,
    docs/kernels/mla_decode.md: h_q 128, b = 2, s_q 2, 23.9 against 19.3 us; 32 heads, b = 8, s_q 2, 24.8
    against 22.9); with one it won (16 heads, b = 1, s_q 1: 12.5 against 13.6)."""
    return h_q in CUDA_SMALL_HEADS and h_q * D_V // 4 <= splits * CUDA_CONSUMER_THREADS


def resolve_cuda_combine(config: DecodeConfig, tokens: int, h_q: int, sm_count: int) -> DecodeConfig:
    """``config`` (a CUDA kernel's) with ``auto`` resolved: the in-launch combine (``barrier``) where
    ``in_launch_combine_pays`` and the grid is safe for it (``resolve_combine``), else the combine kernel."""
    if config.combine == "auto" and config.splits > 1 and not in_launch_combine_pays(h_q, config.splits):
        config = replace(config, combine="two_launch")
    return resolve_combine(config, cuda_programs(tokens, h_q, config.splits, config.whole_tokens), sm_count, interpreted=False)


def cuda_programs(tokens: int, h_q: int, splits: int, whole_tokens: int) -> int:
    """The CUDA kernel's grid: one program per head block of every whole token and per split of the rest."""
    head_blocks = h_q // cuda_base_config(h_q).block_h
    return (whole_tokens + (tokens - whole_tokens) * splits) * head_blocks


#: cuda_schedule's cost model, in tiles of 64 records: what a program costs besides its tiles (its
#: barriers, Q, the first gather), what a split program adds (its partial), the combine launch, and
#: what each split adds to the combine (it reads the splits' partials one after the other). The last
#: was fitted on an H100 at b = 1: at 16 heads, s_q 1, topk 2048, 4 / 8 / 16 / 32 splits took
#: 24.4 / 15.8 / 13.1 / 15.7 µs (16 splits of two tiles beat 32 of one), while at topk 1024 (s_q 2), 16
#: splits of one tile took 11.8 µs against 12.4 with 8; a tenth of a tile a split picks both.
PROGRAM_OVERHEAD_TILES = 1
SPLIT_OVERHEAD_TILES = 1
COMBINE_TILES = 1
COMBINE_TILES_PER_SPLIT = 0.1


def cuda_schedule(tokens: int, head_blocks: int, topk: int, block_n: int, sm_count: int) -> tuple[int, int]:
    """(whole_tokens, splits) for the CUDA kernel (one program per SM, programs started in grid
    order): the first ``whole_tokens`` query tokens take one program per head block, the rest
    ``splits`` programs each, which fill the SMs the whole rows leave idle. Equal programs started
    together run in waves, so the model's time is k waves of whole programs (k = 0, 1, ...), then
    the waves of the split programs, then the combine; the least wins, ties to fewer splits and
    fewer split tokens. E.g. 132 SMs, topk 2048, h_q 128 (two head blocks): b * s_q = 148 (b = 74)
    -> 132 whole tokens (two waves) and 16 split 4 ways (one wave) instead of every token split in 2
    (4.5 waves); 4 (b = 2) -> (0, 16); 256 -> (256, 1)."""
    tiles = max(-(-topk // block_n), 1)
    whole_cost = tiles + PROGRAM_OVERHEAD_TILES
    best: tuple[float, int, int] = (float("inf"), 0, 1)
    units = tokens * head_blocks
    for waves in range(-(-units // sm_count) + 1):
        whole = min(tokens, waves * sm_count // head_blocks)
        rest = tokens - whole
        whole_time = -(-whole * head_blocks // sm_count) * whole_cost
        for splits in range(1, min(MAX_SPLITS, tiles) + 1):
            if rest == 0 and splits > 1:
                break
            split_cost = -(-tiles // splits) + PROGRAM_OVERHEAD_TILES + (SPLIT_OVERHEAD_TILES if splits > 1 else 0)
            combine = COMBINE_TILES + COMBINE_TILES_PER_SPLIT * splits if splits > 1 else 0
            time = whole_time + -(-rest * head_blocks * splits // sm_count) * split_cost + combine
            if time < best[0]:
                best = (time, whole, splits)
    _, whole, splits = best
    return (0, 1) if splits == 1 else (whole, splits)


@dataclass(frozen=True)
class ConfigRule:
    """Applies to calls of ``kv_format`` (None: any) with ``h_q`` heads (None: any) and at most
    ``max_tokens`` query tokens b * s_q."""

    kv_format: str | None
    h_q: int | None
    max_tokens: int
    config: DecodeConfig


#: First match wins; the last rule catches everything. Not yet tuned on the H200: every rule is
#: the design point (64 x 64 tiles, 8 warps, 1 stage, L2 prefetch) with the split count from auto_splits.
#: Paste the rules benchmarks/kernels/mla_decode.py --configs prints above the catch-all.
CONFIG_TABLE: tuple[ConfigRule, ...] = (ConfigRule(None, None, 2**31, DecodeConfig()),)

#: Interpreter configs: its cost grows with the elements each program touches and it runs
#: programs one after another, so the fewest, largest programs (the tests exercise the others).
INTERPRETER_CONFIG = DecodeConfig(block_h=64, block_n=64, splits=1, num_warps=4, num_stages=1, combine="none", l2_prefetch=False)

#: auto_splits' cost model: a split adds this much work, in BLOCK_N-record steps, for writing and
#: combining its partial (a rough guess, to be tuned with --configs).
SPLIT_OVERHEAD_STEPS = 2


def auto_splits(units: int, topk: int, block_n: int, sm_count: int) -> int:
    """Split count for ``units`` = b * s_q * h_q / BLOCK_H programs' worth of rows on ``sm_count``
    SMs (one program per SM): the S in 1, 2, 4, ... MAX_SPLITS (block_n <= topk / S) whose waves
    times steps per program, plus SPLIT_OVERHEAD_STEPS for S > 1, is least; ties go to fewer
    splits. E.g. 132 SMs, topk 2048, 64-record steps: 8 units (b = 2, h_q 128) -> 16, 4 -> 32,
    256 -> 1, 296 (b = 74) -> 2."""
    best, best_cost = 1, float("inf")
    splits = 1
    while splits <= MAX_SPLITS and block_n <= -(-topk // splits):
        waves = -(-units * splits // sm_count)
        steps = -(-topk // (splits * block_n)) + (SPLIT_OVERHEAD_STEPS if splits > 1 else 0)
        cost = waves * steps
        if cost < best_cost:
            best, best_cost = splits, cost
        splits *= 2
    return best


def select_config(
    kv_format: str, h_q: int, tokens: int, topk: int, sm_count: int, table: tuple[ConfigRule, ...] = CONFIG_TABLE
) -> DecodeConfig:
    """The GPU config of a call: the first matching rule, its split count and block_n fitted to
    ``topk`` (block_n halved while it exceeds the split), block_h to ``h_q`` (16 or 32 heads: one head
    block of h_q, a tl.dot M of 16 or 32; on SM90 the CUDA kernels take these calls: ``cuda_config``), validated."""
    for rule in table:
        if rule.kv_format in (None, kv_format) and rule.h_q in (None, h_q) and tokens <= rule.max_tokens:
            config = rule.config
            break
    else:
        raise ValueError(f"no CONFIG_TABLE rule matches {kv_format} h_q={h_q} with {tokens} query tokens")
    block_n = config.block_n
    while block_n > MIN_DOT_DIM and block_n > topk:
        block_n //= 2
    config = replace(config, block_n=block_n, block_h=min(config.block_h, h_q))
    if config.splits == 0:
        config = replace(config, splits=auto_splits(tokens * (h_q // config.block_h), topk, block_n, sm_count))
    config = resolve_combine(config, tokens * (h_q // config.block_h) * config.splits, sm_count, interpreted=False)
    config.validate(h_q, topk)
    return config


def interpreter_config(h_q: int, topk: int) -> DecodeConfig:
    """The interpreter's config: one program per (token, head block), steps of up to 128 records."""
    block_n = 128
    while block_n > MIN_DOT_DIM and block_n > topk:
        block_n //= 2
    config = replace(INTERPRETER_CONFIG, block_n=block_n, block_h=min(INTERPRETER_CONFIG.block_h, h_q))
    config.validate(h_q, topk)
    return config


def resolve_combine(config: DecodeConfig, programs: int, sm_count: int, interpreted: bool) -> DecodeConfig:
    """``config`` with ``auto`` resolved to a concrete combine for a grid of ``programs``; raises
    ValueError for a barrier that could deadlock (grid beyond one program per SM, or the interpreter)."""
    if config.splits == 1:
        return replace(config, combine="none")
    force_two = os.environ.get("DSA_DECODE_TWO_LAUNCH") == "1"
    combine = config.combine
    divides = TICKETS_PER_CALL % config.splits == 0
    if combine == "auto":
        combine = "barrier" if not interpreted and not force_two and programs <= sm_count and divides else "two_launch"
    if combine == "barrier":
        if interpreted:
            raise ValueError(f"{config}: the barrier spins and would never end under the Triton interpreter")
        if programs > sm_count:
            raise ValueError(f"{config}: a barrier grid of {programs} programs may exceed the {sm_count} resident at once")
        if not divides:
            raise ValueError(f"{config}: a barrier needs splits dividing {TICKETS_PER_CALL} (the ticket words' step)")
    return replace(config, combine=combine)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
