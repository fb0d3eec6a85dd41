"""How the indexer's kernels are tiled and which top-k a call takes: the score and emit tiles, the long-row rule.

The tiles are chosen per call from its shape (and whether the kernels run under the Triton
interpreter, which runs programs one after another: few large programs there); the measurements
behind the GPU choices are in the comments and docs/kernels/indexer.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from ..common.interpreter import INTERPRETED
from .shapes import PAGE_SIZE, TOPK

# --------------------------------------------------------------------------- score and emit tiles


#: Precisions of the score kernel's key-query dot. Each product of two e4m3 values is exact in
#: fp32; they differ in how the 128 products of a dot are summed.
DOTS = {
    # Hopper's FP8 wgmma: the whole dot in the tensor core's accumulator (4 k=32 steps, about 13
    # fraction bits kept per step, toward zero), like DeepGEMM's paged-logits kernel. Its error
    # is what the checker's derived tie tolerance models (docs/checks.md), with 4x margin.
    "fp8": "native FP8 tensor-core dot",
    # FP8 -> fp16 is exact (every e4m3 value is an fp16 value): exact products summed in fp32.
    "fp16": "exact fp16 tensor-core dot of the FP8 values",
    "fp32": "exact fp32 dot of the FP8 values",
}


@dataclass(frozen=True)
class ScoreTile:
    """Launch shape of the score kernel: ``pages`` cache pages (64 tokens each) of one row per
    tile, ``loop_pages`` one-page tiles per program in a software-pipelined loop (the query and
    weights are loaded once per program; ``num_stages`` sets the pipeline depth).

    ``dot`` is the precision of the key-query dot (see ``DOTS``): ``"fp8"`` the native FP8
    tensor-core MMA (the GPU's choice), ``"fp16"`` the FP8 values converted to fp16 (exact),
    ``"fp32"`` converted to fp32 (equally exact; the interpreter's choice, because numpy runs
    fp32 matmuls through BLAS but fp16 ones through slow loops).
    """

    pages: int
    num_warps: int
    dot: str = "fp16"
    num_stages: int = 1
    loop_pages: int = 1
    #: Grid order: False puts a row's tiles next to each other in launch order (axis 0 = tile),
    #: True puts every row's first tile first (axis 0 = row), so a long row's pages are not
    #: left to the last programs launched.
    rows_first: bool = False

    def __post_init__(self) -> None:
        """Tiling relations, checked when a tile is made: raises ValueError naming the tile."""
        if self.pages < 1 or self.pages & (self.pages - 1):
            raise ValueError(f"{self}: pages per tile must be a power of two")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError(f"{self}: num_warps must be 1, 2, 4 or 8")
        if self.loop_pages < 1 or (self.loop_pages > 1 and self.pages != 1):
            raise ValueError(f"{self}: loop_pages must be >= 1, and a looping program takes one-page tiles")
        if self.dot not in DOTS:
            raise ValueError(f"{self}: dot must be one of {sorted(DOTS)}")

    @property
    def pages_per_program(self) -> int:
        return self.pages * self.loop_pages

    @property
    def block_n(self) -> int:
        return self.pages * PAGE_SIZE


#: GPU tile. One program scores one page (64 tokens) against all 64 heads: keys [64 x 128] times
#: the transposed query [128 x 64] into a [64 tokens x 64 heads] fp32 tile, then ReLU, head
#: weights and the head sum. The kernel moves 8 KiB of keys per 1 MFLOP and its time is the
#: chain of dependent loads of each program, so many small programs (several per SM) win for
#: most calls; the largest ones (up to 31 rows x 91 pages = 2821 programs, four waves) loop over
#: pages instead (GPU_LOOP_TILES).
#: Four warps is the fewest that make one Hopper warpgroup, i.e. a wgmma m64n64k16 with the keys
#: from registers and q from shared memory (90 registers, 16 KiB of shared memory per program,
#: checked with an offline sm_90 compile). With two warps Triton falls back to mma.sync and
#: needs 194 registers, which costs more occupancy than the smaller program gains.
GPU_SCORE_TILE = ScoreTile(pages=1, num_warps=4, dot="fp8")
#: Interpreter tile: up to 32 pages (2048 tokens) per program. The interpreter runs programs one
#: after another, so big numpy-vectorised tiles are fast; 32 pages bounds the work wasted on the
#: overhang of a row's last tile (FP8 decoding is slow per element in the interpreter).
INTERPRETER_MAX_PAGES = 32

#: Emit kernel tiles: on a GPU 512 output slots per program (4 programs per row), under the
#: interpreter a whole 2048-slot row per program.
GPU_EMIT_BLOCK = 512
INTERPRETER_EMIT_BLOCK = TOPK
assert TOPK % GPU_EMIT_BLOCK == 0


#: Large calls (batch x max_num_pages one-page programs at least this many) loop over two
#: pages per program instead: several waves of one-page programs each pay the full chain of
#: dependent loads, while a looping program loads the query once and overlaps the next page's
#: keys with this page's dot. The page counts and thresholds are the fastest tiles of the score
#: kernel timed alone on the H200 (docs/kernels/indexer.md, "Score kernel";
#: benchmarks/h200/indexer_variants.json). The looping tile launches rows first, so that every
#: long row spreads over the whole launch instead of sitting in its last programs; the one-page
#: tile is slower that way. Production contexts (8K-128K tokens, batches up to 128: 16384 or more
#: one-page programs) loop over 16 pages with 3 stages, the fastest there
#: (benchmarks/kernels/indexer_long.py).
GPU_LOOP_TILES = (
    (16384, ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=16, num_stages=3, rows_first=True)),
    (2400, ScoreTile(pages=1, num_warps=4, dot="fp8", loop_pages=2, num_stages=2, rows_first=True)),
)


def default_score_tile(max_num_pages: int, batch: int = 1) -> ScoreTile:
    """The score tile for ``batch`` rows of block tables of ``max_num_pages`` columns."""
    if INTERPRETED:
        return ScoreTile(pages=min(INTERPRETER_MAX_PAGES, triton.next_power_of_2(max_num_pages)), num_warps=4, dot="fp32")
    for min_pages, tile in GPU_LOOP_TILES:
        if batch * max_num_pages >= min_pages:
            return tile
    return GPU_SCORE_TILE


def emit_block() -> int:
    """Output slots per program of the emit kernel."""
    return INTERPRETER_EMIT_BLOCK if INTERPRETED else GPU_EMIT_BLOCK


# --------------------------------------------------------------------------- shared-memory rows


#: Block tables of more than 8192 and at most SHARED_ROW_MAX_TOKENS tokens (topk_filtered.cuh's
#: kMtpSharedRowMaxLen: 1024 threads x 9 float4, an MTP batch's rows of 32K + 1 tokens included)
#: take the filtered top-k at every batch of at least SHARED_ROW_MIN_BATCH rows: one block per row
#: keeps the row's keys in shared memory and selects them on its fast path. Measured on the H100
#: (benchmarks/kernels/indexer_long.py, whole pipelines against the cluster and multi-pass top-ks
#: of the same score kernel; docs/kernels/indexer.md, "Shared-memory rows"), it beat both at
#: B = 4-128 with rows of 10K-32K tokens and on MTP rows of 32K and 32K + 1. One row alone stays on
#: the cluster top-k, which splits it over several SMs.
SHARED_ROW_MAX_TOKENS = 36864
SHARED_ROW_MIN_BATCH = 2
#: The filtered top-k's register rows end here (topk_filtered.cuh's kLongRowMaxLen).
LONG_ROW_REGISTER_TOKENS = 8192


def uses_shared_rows(batch: int, max_num_pages: int) -> bool:
    """Whether a call of ``batch`` rows of block tables of ``max_num_pages`` pages takes the filtered
    top-k with its rows in shared memory (before the cluster and long-row rules)."""
    return batch >= SHARED_ROW_MIN_BATCH and LONG_ROW_REGISTER_TOKENS < max_num_pages * PAGE_SIZE <= SHARED_ROW_MAX_TOKENS


# --------------------------------------------------------------------------- split rows


#: Block tables of more than SHARED_ROW_MAX_TOKENS tokens at batches of at least SPLIT_MIN_BATCH
#: rows take the split top-k (cuda_topk.split_topk): each row cut into chunks of SPLIT_LEN tokens,
#: one block per chunk selecting its top-k (in shared memory), then one block per row selecting among
#: its chunks' selections. Measured on the H100 (benchmarks/kernels/indexer_long.py --split,
#: docs/kernels/indexer.md, "Split rows"), whole pipelines: it beat the multi-pass top-k and the
#: filtered one at B = 64 x 128K (437.8 against 462.0 us), B = 128 x 64K (438.5 against 472.5), MTP
#: B = 64 x 64K (150.2 against 174.6) and the ragged batches of 32, 64 and 128 rows up to 128K
#: (93.4 / 123.6 / 222.1 against 99.6 / 135.8 / 241.3); it lost to the cluster top-k at B = 1 x 128K
#: and B = 8 x 64K, whose rows it splits into too few blocks to fill the GPU. 32768-token chunks were
#: the fastest on all but the ragged B = 32 (16384: 91.3) and all-equal rows.
SPLIT_LEN = 32768
SPLIT_MIN_BATCH = 32
#: its longest block table: SPLIT_MAX_CANDIDATES / k chunks (cuda_topk.py; 16 at k = 2048)
SPLIT_MAX_TOKENS = 16 * SPLIT_LEN


def uses_split_rows(batch: int, max_num_pages: int) -> bool:
    """Whether a call of ``batch`` rows of block tables of ``max_num_pages`` pages takes the split
    top-k (after the shared-memory rows' rule, before the cluster and long-row rules)."""
    tokens = max_num_pages * PAGE_SIZE
    return batch >= SPLIT_MIN_BATCH and SHARED_ROW_MAX_TOKENS < tokens <= SPLIT_MAX_TOKENS


# --------------------------------------------------------------------------- the long-row top-k


#: Block tables of more than this many tokens may take the long-row top-k (up to 8192 the
#: filtered top-k caches the whole row in its block's registers, its fast path; from 8193 to
#: 16384 its radix select was as fast as the long path on the H100, benchmarks/kernels/indexer_long.py).
LONG_PATH_MIN_TOKENS = 16384
#: Large batches keep one block per row (up to 132 rows are one wave of blocks, each row's time
#: growing with its length) where the long path's passes over every row cost more: measured on the
#: H100 (docs/kernels/indexer.md, "Long rows") the long path won at B <= 32 (32K-128K tokens) and at
#: B = 64 with 128K tokens, and lost at B = 64 with 32K tokens and at B = 128 x 32K. On the H200 it
#: took a ragged B = 128 batch of rows up to 128K tokens in 203.8 us against 297.7 with one block per
#: row, whose longest rows set that time (benchmarks/h200/indexer_long_paths.json; B = 128 x 128K
#: rows, no workload case, is taken by the same rule unmeasured).
LONG_PATH_MAX_BATCH = 32
#: Past LONG_PATH_MAX_BATCH rows: (largest batch, fewest tokens of the block table) that still take it.
#: Since the split rows (uses_split_rows, checked first, B >= 32 up to SPLIT_MAX_TOKENS) only block
#: tables longer than SPLIT_MAX_TOKENS reach this rule past B = 32.
LONG_PATH_WIDE = ((64, 65536), (128, 131072))


def uses_long_path(batch: int, max_num_pages: int) -> bool:
    """Whether a call of ``batch`` rows of block tables of ``max_num_pages`` pages takes the long-row top-k."""
    tokens = max_num_pages * PAGE_SIZE
    if tokens <= LONG_PATH_MIN_TOKENS:
        return False
    return batch <= LONG_PATH_MAX_BATCH or any(batch <= most and tokens >= fewest for most, fewest in LONG_PATH_WIDE)


#: The cluster top-k (one thread-block cluster of 2-16 blocks of 8192 scores per row, the row held
#: in the cluster's registers, one launch) takes block tables of more than CLUSTER_PATH_MIN_TOKENS
#: and at most CLUSTER_PATH_MAX_TOKENS tokens when the call's clusters fit one wave of blocks
#: (batch x blocks per row <= CLUSTER_PATH_MAX_BLOCKS, one 1024-thread block per SM; 132 SMs on the
#: H100 and H200), or two waves at B <= CLUSTER_PATH_TWO_WAVE_MAX_BATCH, where the device runs its
#: cluster (cuda_topk_long.cluster_capacity). Measured on the H100 (docs/kernels/indexer.md, "Cluster
#: top-k"), whole pipelines: it beat the multi-pass long top-k at B = 1 (32K, 128K), B = 8 x 64K and
#: B = 32 x 32K (128 blocks); in two waves it beat both others at B = 64 x 32K (256 blocks: 134 us,
#: the filtered top-k 154, the multi-pass one 143) and tied the multi-pass one on MTP rows of 32K
#: and 32K + 1 tokens (B = 32, 8 blocks a row: 67.6 against 66.2), while at B = 128 the filtered
#: top-k's one block per row already fills the GPU (B = 128 x 32K: 257 against 258); it lost in four
#: or more waves (B = 32 ragged up to 128K: 512 blocks; B = 64 x 128K, B = 128 x 64K: 1024). Since,
#: the shared-memory rows (uses_shared_rows, checked first) took every table of 8193-36864 tokens
#: from B = 2 on; the cluster keeps B = 1 and tables of 36865-131072 tokens.
CLUSTER_PATH_MIN_TOKENS = 8192
CLUSTER_PATH_MAX_TOKENS = 16 * 8192
CLUSTER_PATH_MAX_BLOCKS = 132
CLUSTER_PATH_TWO_WAVE_MAX_BATCH = 64
CLUSTER_BLOCK_TOKENS = 8192


def cluster_blocks(max_num_pages: int) -> int:
    """Blocks per row of the cluster top-k for block tables of ``max_num_pages`` pages (a power of two, at least 2)."""
    blocks = 2
    while blocks * CLUSTER_BLOCK_TOKENS < max_num_pages * PAGE_SIZE:
        blocks *= 2
    return blocks


def uses_cluster_path(batch: int, max_num_pages: int) -> bool:
    """Whether a call of ``batch`` rows of block tables of ``max_num_pages`` pages takes the cluster
    top-k (where the device runs its cluster; else ``uses_long_path`` decides)."""
    tokens = max_num_pages * PAGE_SIZE
    if not CLUSTER_PATH_MIN_TOKENS < tokens <= CLUSTER_PATH_MAX_TOKENS:
        return False
    blocks = batch * cluster_blocks(max_num_pages)
    return blocks <= CLUSTER_PATH_MAX_BLOCKS or (batch <= CLUSTER_PATH_TWO_WAVE_MAX_BATCH and blocks <= 2 * CLUSTER_PATH_MAX_BLOCKS)
