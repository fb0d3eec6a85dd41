"""How one call of the sparse attention is tiled and launched: ``Plan``, and the policies that pick one.

On a GPU the CUDA kernel runs (``cuda_plan``, tuned on the H200: the CUDA_POLICY_* constants);
under the Triton interpreter the Triton kernels do (``interpreter_plan``). ``default_plan``
picks between them. ``Plan.validate`` raises ValueError naming what a plan gets wrong.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from ..common.interpreter import interpreted
from . import cuda
from .shapes import D_CKV, TOPK

#: The Triton kernels' paths (interpreter only), then the CUDA kernel's, each with its combine
#: (cuda.COMBINES): ``cuda`` behind a global-memory barrier when the grid is co-resident
#: (its launcher checks), ``cuda_two_launch`` always in a second launch, ``cuda_cluster`` through
#: distributed shared memory within the token's thread-block cluster.
TRITON_PATHS = ("dsplit", "two_launch")
PATHS = (*TRITON_PATHS, "cuda", "cuda_two_launch", "cuda_cluster")
CUDA_COMBINES = {"cuda": "barrier", "cuda_two_launch": "two_launch", "cuda_cluster": "cluster"}
CUDA_PATHS = tuple(CUDA_COMBINES)
#: How the CUDA kernel keeps a split's partial output on every path: bf16 units (in global
#: memory, or bulk-copied between the cluster's shared memories); m, l and lse stay fp32.
CUDA_PARTIAL_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Plan:
    """How one call is tiled and launched.

    ``splits``: for ``dsplit`` the number of value slices (each SLICE_D = 512 / splits columns);
    for the others the number of slot splits S (each of 2048 / S slots, strided).
    ``num_stages``: Triton's software-pipeline stages; for the CUDA kernel its gather stages
    (cuda.STAGES, fixed).
    ``gather_lag``: CUDA kernel only, SM cycles: a tile is requested once the tile before it has
    landed or this long after that one was requested (0: two tiles in flight at once;
    cuda.GATHER_LAG_ON_LANDING: only once the one before has landed).
    ``partial_dtype``: storage of the split paths' partial acc (m and l are always fp32).
    """

    path: str
    splits: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1
    partial_dtype: torch.dtype = torch.float32
    gather_lag: int = 0

    def validate(self) -> None:
        """Tiling relations, checked on the host too so a bad plan fails with a clear message: raises
        ValueError naming the plan and what it gets wrong (the kernels' ``tl.static_assert`` and
        the CUDA launcher's checks would otherwise be the first to object)."""
        if self.path not in PATHS:
            raise ValueError(f"unknown path {self.path!r}: the paths are {', '.join(PATHS)}")
        if self.path in CUDA_PATHS:
            lo = cuda.MIN_SPLITS
            hi = cuda.MAX_CLUSTER_SPLITS if self.path == "cuda_cluster" else cuda.MAX_SPLITS
            if not (_is_pow2(self.splits) and lo <= self.splits <= hi):
                raise ValueError(f"{self}: the CUDA kernel takes power-of-two splits in [{lo}, {hi}] here")
            if self.block_n != cuda.TILE_SLOTS:
                raise ValueError(f"{self}: the CUDA kernel's tile is {cuda.TILE_SLOTS} slots")
            if self.num_stages != cuda.STAGES:
                raise ValueError(f"{self}: the CUDA kernel has {cuda.STAGES} gather stages")
            if not 0 <= self.gather_lag <= cuda.GATHER_LAG_ON_LANDING:
                raise ValueError(f"{self}: the gather lag is in [0, {cuda.GATHER_LAG_ON_LANDING}] cycles")
            if self.partial_dtype != CUDA_PARTIAL_DTYPE:
                raise ValueError(f"{self}: the CUDA kernel keeps {CUDA_PARTIAL_DTYPE} partials")
            return
        if self.gather_lag != 0:
            raise ValueError(f"{self}: only the CUDA kernel has a gather lag")
        if not (_is_pow2(self.splits) and _is_pow2(self.block_n)):
            raise ValueError(f"{self}: splits and block_n must be powers of two")
        if self.block_n < 16:
            raise ValueError(f"{self}: tl.dot needs blocks of at least 16 slots")
        if self.partial_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{self}: partials are fp32 or bf16")
        if self.path == "dsplit":
            if D_CKV % self.splits or D_CKV // self.splits < 16:
                raise ValueError(f"{self}: value slices of >= 16 columns")
            if TOPK % self.block_n:
                raise ValueError(f"{self}: blocks must tile {TOPK} slots")
            return
        if not 2 <= self.splits <= D_CKV or TOPK % self.splits:
            raise ValueError(f"{self}: splits must divide {TOPK}")
        split_size = TOPK // self.splits
        if self.block_n > split_size:
            raise ValueError(f"{self}: block_n {self.block_n} > split size {split_size} would read out of range")
        if split_size % self.block_n:
            raise ValueError(f"{self}: block_n must divide the split size {split_size}")
        if D_CKV % self.splits:
            raise ValueError(f"{self}: the combine slices {D_CKV} columns per split")


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


#: Largest token count the interpreter sends to the value-split (dsplit) kernel: the brief's
#: T <= 2 short path, so the harness's CPU run exercises both Triton kernels.
DSPLIT_MAX_TOKENS_INTERPRETER = 2


def default_plan(num_tokens: int, device: torch.device) -> Plan:
    """The plan ``kernel`` uses for ``num_tokens`` tokens on ``device``."""
    if interpreted(device):
        return interpreter_plan(num_tokens)
    resident, clusters = cuda_residency(cuda.device_index(device))
    return cuda_plan(num_tokens, resident, clusters, force_two_launch=os.environ.get("DSA_ATTN_TWO_LAUNCH") == "1")


@functools.cache
def cuda_residency(device_index: int) -> tuple[int, int]:
    """(programs, clusters of CUDA_POLICY_CLUSTER_SPLITS programs) the CUDA kernel keeps
    resident at once on the device: fixed per device, so asked once."""
    with torch.cuda.device(device_index):
        return cuda.resident_programs(), cuda.resident_clusters(CUDA_POLICY_CLUSTER_SPLITS)


#: The GPU policy's split counts, the fastest on the H200 (docs/kernels/attention.md, "Policy";
#: benchmarks/h200/attention_variants.json).
#: T <= CUDA_POLICY_WIDE_TOKENS: 32 splits with the global-memory barrier (more SMs share a full
#: row's gather; a cluster holds at most 16 programs). Up to one cluster per token resident at
#: once: clusters of 16 with the cluster combine. Beyond: the barrier with the most splits up
#: to CUDA_POLICY_MAX_SPLITS that keep the grid co-resident (16 beat 64 at every T: the combine
#: reads S partials), and past that the fewest splits and two launches.
#: Gather lags (SM cycles), measured where a program has two tiles (16 splits): the cluster
#: combine's CUDA_POLICY_CLUSTER_LAG and the barrier's CUDA_POLICY_BARRIER_LAG (T = 8) let the
#: first tile take the bandwidth first, so its math overlaps the second tile's gather. With 32
#: splits a program has one tile, and 8 splits (T > 8, four tiles) were not measured: lag 0 there.
CUDA_POLICY_WIDE_TOKENS = 2
CUDA_POLICY_WIDE_SPLITS = 32
CUDA_POLICY_CLUSTER_SPLITS = 16
CUDA_POLICY_MAX_SPLITS = 16
CUDA_POLICY_CLUSTER_LAG = 1000
CUDA_POLICY_BARRIER_LAG = 2000


def cuda_plan(num_tokens: int, resident: int, resident_clusters: int = 0, force_two_launch: bool = False) -> Plan:
    """GPU policy (see CUDA_POLICY_*): ``resident`` programs and ``resident_clusters`` clusters
    of CUDA_POLICY_CLUSTER_SPLITS programs fit the GPU at once; ``force_two_launch`` takes the
    barrier policy's split count with the combine always launched separately."""
    if not force_two_launch:
        if num_tokens <= CUDA_POLICY_WIDE_TOKENS and num_tokens * CUDA_POLICY_WIDE_SPLITS <= resident:
            return cuda_kernel_plan("cuda", CUDA_POLICY_WIDE_SPLITS)
        if num_tokens <= resident_clusters:
            return cuda_kernel_plan("cuda_cluster", CUDA_POLICY_CLUSTER_SPLITS, CUDA_POLICY_CLUSTER_LAG)
    splits = CUDA_POLICY_MAX_SPLITS
    while splits > cuda.MIN_SPLITS and num_tokens * splits > resident:
        splits //= 2
    lag = CUDA_POLICY_BARRIER_LAG if splits == CUDA_POLICY_MAX_SPLITS else 0
    return cuda_kernel_plan("cuda_two_launch" if force_two_launch else "cuda", splits, lag)


def cuda_kernel_plan(path: str, splits: int, gather_lag: int = 0) -> Plan:
    """A validated plan of the CUDA kernel: ``path`` one of CUDA_PATHS (its combine), ``splits``
    per token, ``gather_lag`` in SM cycles (see Plan)."""
    plan = Plan(path, splits=splits, block_n=cuda.TILE_SLOTS, num_warps=8, num_stages=cuda.STAGES,
                partial_dtype=CUDA_PARTIAL_DTYPE, gather_lag=gather_lag)
    plan.validate()
    return plan


def interpreter_plan(num_tokens: int) -> Plan:
    """The interpreter runs programs one by one in Python and its cost grows with the elements
    each program touches, so it gets the fewest, largest programs (two value slices, or two
    splits of 1024 strided slots); the tests exercise smaller tilings too."""
    if num_tokens <= DSPLIT_MAX_TOKENS_INTERPRETER:
        return Plan("dsplit", splits=2, block_n=512)
    return Plan("two_launch", splits=2, block_n=512)
