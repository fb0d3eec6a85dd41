"""The hand-written CUDA sparse attention (``csrc/attention_sm90.cu``): its build, a checked entry, and a call's buffers.

The kernels and a small C ABI (``csrc/attention_capi.cpp``: device pointers, strides, the
stream and the device) are one shared library, built by ``common/cuda_build.py`` and called
through ctypes. ``run`` checks every argument in Python before the call (the C side's checks
only guard the pointers it hands on) and passes torch's current stream at call time, so the
launch is captured like any other when that stream is capturing a CUDA graph.

``launch`` is ``run`` with the scratch a call needs and the barrier words, which persist across
calls: zeroed once when allocated, kept per (device, stream), while scratch is allocated per
call, so concurrent streams never share either.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..common.cuda_build import SM90_KERNEL_HEADERS, CudaLibrary, load_checked_library
from .shapes import D_CKV, D_KPE, NUM_HEADS, PAGE_SIZE, TOPK, check_io

HERE = Path(__file__).resolve().parent
#: compiled sources (relative to this folder): the C ABI and the kernels with their launcher
SOURCES = ("csrc/attention_capi.cpp", "csrc/attention_sm90.cu")
#: headers they include (part of the build's digest): the constants, then the kernels' parts by role
HEADERS = ("csrc/attention_sm90.h", "csrc/config.cuh", "csrc/instructions.cuh", "csrc/producer.cuh",
           "csrc/consumer.cuh", "csrc/combine.cuh", *SM90_KERNEL_HEADERS)
#: the C ABI's exports are named dsa_attention_<name>
PREFIX = "dsa_attention_"
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
#: the C ABI's functions (restype, argtypes); see csrc/attention_capi.cpp
SIGNATURES = {
    "launch": (_INT, (
        _INT, _P,  # device, stream
        _P, _I64, _I64, _P, _I64, _I64,  # q_nope and its token and head strides, q_pe and its
        _P, _I64, _I64, _P, _I64, _I64,  # ckv_cache and its page and slot strides, kpe_cache and its
        _P, _I64, _P, _I64, _I64, _P, _I64,  # sparse_indices, output, lse with their strides
        _P, _I64, _P, _I64, _P, _I64, _P, _I64,  # part_out, part_lse, sync, phase_clocks with their element counts
        _I64, ctypes.c_double, _I64, _I64, _I64, ctypes.POINTER(_INT),  # tokens, sm_scale, splits, combine, gather_lag, used
    )),
    "resident_programs": (_INT, (_INT, ctypes.POINTER(_INT))),
    "resident_clusters": (_INT, (_INT, _INT, ctypes.POINTER(_INT))),
}  # fmt: skip
#: constants of csrc/attention_sm90.h (checked against the built library on load, as are its
#: HEADS, D_CKV, D_KPE, TOPK and PAGE_SIZE against shapes.py)
MIN_SPLITS, MAX_SPLITS = 8, 64
MAX_CLUSTER_SPLITS = 16  # the cluster combine: one thread-block cluster per token
TILE_SLOTS = 64  # slots a program gathers and scores together (attention_sm90.h)
MAX_TOKENS = 65535  # the grid's y dimension
#: barrier words per token (the ticket word is word 0; attention_sm90.cu, split_kernel), and
#: how far each fused call advances a token's ticket word, whatever its split count
SYNC_STRIDE, TICKETS_PER_CALL = 32, 64
#: int64 phase stamps per program when profiling (attention_sm90.h, PhaseSlot)
PHASE_SLOTS = 9
#: how a token's splits are combined (attention_sm90.h, Combine): "barrier" in the same launch
#: behind a global-memory barrier when the grid is co-resident (else a second launch),
#: "two_launch" always a second launch, "cluster" in the same launch through distributed shared
#: memory, the token's programs forming one thread-block cluster
COMBINES = {"barrier": 0, "two_launch": 1, "cluster": 2}
#: launches, as the C ABI reports them (its `used` argument)
FUSED, TWO_LAUNCH, CLUSTER = 0, 1, 2
#: gather stages (tiles in flight at most) of a program
STAGES = 2
#: AttentionArgs::gather_lag (SM cycles): a tile is requested once the tile before it has landed
#: or this long after that one was requested; 0 requests two at once, GATHER_LAG_ON_LANDING
#: only once the one before has landed
GATHER_LAG_ON_LANDING = 2**31 - 1

#: what the built library's exported constants must be (the header's, as this file and shapes.py know them)
EXPECTED_CONSTANTS = {
    "HEADS": NUM_HEADS, "D_CKV": D_CKV, "D_KPE": D_KPE, "TOPK": TOPK, "PAGE_SIZE": PAGE_SIZE, "MIN_SPLITS": MIN_SPLITS,
    "MAX_SPLITS": MAX_SPLITS, "MAX_CLUSTER_SPLITS": MAX_CLUSTER_SPLITS, "SYNC_STRIDE": SYNC_STRIDE,
    "TICKETS_PER_CALL": TICKETS_PER_CALL, "PHASE_SLOTS": PHASE_SLOTS, "TILE_SLOTS": TILE_SLOTS, "STAGES": STAGES,
    "GATHER_LAG_ON_LANDING": GATHER_LAG_ON_LANDING,
}  # fmt: skip
#: the library's stem (its cache folder is <stem>_<digest>) and its name in errors
STEM, WHAT = "dsa_sparse_attention_sm90", "the CUDA sparse attention"


def load_attention_extension(verbose: bool | None = None) -> CudaLibrary:
    """The compiled library (built on first use); raises cuda_build.CudaBuildError with the reason."""
    return load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS, PREFIX, SIGNATURES, EXPECTED_CONSTANTS,
                                "attention/cuda.py and shapes.py disagree with csrc/attention_sm90.h", verbose)  # fmt: skip


def resident_programs() -> int:
    """Programs of the split kernel the current device keeps resident at once."""
    programs = ctypes.c_int(0)
    load_attention_extension().call("resident_programs", torch.cuda.current_device(), ctypes.byref(programs))
    return programs.value


def resident_clusters(splits: int) -> int:
    """Clusters of ``splits`` programs (the cluster combine) the current device keeps resident at
    once; 0 when it cannot schedule one at all."""
    if not (MIN_SPLITS <= splits <= MAX_CLUSTER_SPLITS and splits & (splits - 1) == 0):
        raise ValueError(f"splits must be a power of two in [{MIN_SPLITS}, {MAX_CLUSTER_SPLITS}] for a cluster, got {splits}")
    clusters = ctypes.c_int(0)
    load_attention_extension().call("resident_clusters", torch.cuda.current_device(), splits, ctypes.byref(clusters))
    return clusters.value


def _aligned(t: torch.Tensor, name: str, problems: list[str]) -> None:
    """cp.async copies 16-byte chunks: the base and every row stride must be 16-byte multiples."""
    if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
        problems.append(f"{name} must be 16-byte aligned with strides that are multiples of 8 elements, got strides {tuple(t.stride())}")


def run(
    q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor, sparse_indices: torch.Tensor,
    sm_scale: float, output: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor, sync: torch.Tensor,
    splits: int, combine: str = "barrier", gather_lag: int = 0, phase_clocks: torch.Tensor | None = None,
) -> int:
    """Launch the attention (shapes: shapes.py); returns FUSED, TWO_LAUNCH or CLUSTER.

    ``combine``: a key of COMBINES; ``gather_lag``: SM cycles in [0, GATHER_LAG_ON_LANDING].
    ``part_out`` [>= T*splits*16*512] bf16 and ``part_lse`` [>= T*splits*16] fp32 are scratch;
    ``sync`` [>= T*SYNC_STRIDE] int32 are the barrier words (zeroed once, reused by every call on
    a stream; each fused call advances a token's ticket word by TICKETS_PER_CALL, modulo 2^32,
    so the words must start at a multiple of it: zeros). The cluster
    combine uses none of the three (they may then be empty).
    ``phase_clocks`` (profiling only) [>= T*splits*PHASE_SLOTS] int64 receives each program's
    phase stamps (attention_sm90.h, PhaseSlot).
    """
    tensors = {
        "q_nope": q_nope, "q_pe": q_pe, "ckv_cache": ckv_cache, "kpe_cache": kpe_cache, "sparse_indices": sparse_indices,
        "output": output, "lse": lse, "part_out": part_out, "part_lse": part_lse, "sync": sync,
    }  # fmt: skip
    problems = [
        f"{name} must be a CUDA tensor on {q_nope.device}"
        for name, t in tensors.items()
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.device != q_nope.device
    ]
    if problems:
        raise ValueError("; ".join(problems))
    T = check_io(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, output, lse)
    scratch = {"part_out": torch.bfloat16, "part_lse": torch.float32, "sync": torch.int32}
    problems = [f"{name} must be {dtype}, got {tensors[name].dtype}" for name, dtype in scratch.items() if tensors[name].dtype != dtype]
    for name in ("q_nope", "q_pe", "ckv_cache", "kpe_cache"):
        _aligned(tensors[name], name, problems)
    if combine not in COMBINES:
        problems.append(f"combine must be one of {list(COMBINES)}, got {combine!r}")
    most = MAX_CLUSTER_SPLITS if combine == "cluster" else MAX_SPLITS
    if not (MIN_SPLITS <= splits <= most and splits & (splits - 1) == 0):
        problems.append(f"splits must be a power of two in [{MIN_SPLITS}, {most}] for the {combine} combine, got {splits}")
    if not (isinstance(gather_lag, int) and 0 <= gather_lag <= GATHER_LAG_ON_LANDING):
        problems.append(f"gather_lag must be an int number of cycles in [0, {GATHER_LAG_ON_LANDING}], got {gather_lag!r}")
    if T > MAX_TOKENS:
        problems.append(f"at most {MAX_TOKENS} tokens per call, got {T}")
    if combine != "cluster" and (
        part_out.numel() < T * splits * NUM_HEADS * D_CKV or part_lse.numel() < T * splits * NUM_HEADS or sync.numel() < T * SYNC_STRIDE
    ):
        problems.append("part_out, part_lse or sync is too small for this call")
    if not (part_out.is_contiguous() and part_lse.is_contiguous() and sync.is_contiguous()):
        problems.append("part_out, part_lse and sync must be contiguous")
    if phase_clocks is not None and (
        not phase_clocks.is_cuda or phase_clocks.device != q_nope.device or phase_clocks.dtype != torch.int64
        or not phase_clocks.is_contiguous() or phase_clocks.numel() < T * splits * PHASE_SLOTS
    ):  # fmt: skip
        problems.append(f"phase_clocks must be a contiguous int64 CUDA tensor of >= T * splits * {PHASE_SLOTS} elements")
    if problems:
        raise ValueError("; ".join(problems))
    library = load_attention_extension()
    device = q_nope.device
    used = ctypes.c_int(FUSED)
    library.call(
        "launch", device_index(device), torch.cuda.current_stream(device).cuda_stream,  # the stream now: captured when capturing
        q_nope.data_ptr(), q_nope.stride(0), q_nope.stride(1), q_pe.data_ptr(), q_pe.stride(0), q_pe.stride(1),
        ckv_cache.data_ptr(), ckv_cache.stride(0), ckv_cache.stride(1), kpe_cache.data_ptr(), kpe_cache.stride(0), kpe_cache.stride(1),
        sparse_indices.data_ptr(), sparse_indices.stride(0), output.data_ptr(), output.stride(0), output.stride(1),
        lse.data_ptr(), lse.stride(0),
        part_out.data_ptr(), part_out.numel(), part_lse.data_ptr(), part_lse.numel(), sync.data_ptr(), sync.numel(),
        phase_clocks.data_ptr() if phase_clocks is not None else None, phase_clocks.numel() if phase_clocks is not None else 0,
        T, float(sm_scale), splits, COMBINES[combine], gather_lag, ctypes.byref(used),
    )  # fmt: skip
    return used.value


# --------------------------------------------------------------------------- a call's buffers


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


class _SyncWords:
    """The CUDA kernel's barrier words on one (device, stream), kept for the process's lifetime."""

    def __init__(self) -> None:
        self.words: torch.Tensor | None = None

    def get(self, device: torch.device, tokens: int) -> torch.Tensor:
        if self.words is None or self.words.numel() < tokens * SYNC_STRIDE:
            # Zeroed once here; afterwards the ticket barrier keeps its own invariant (see
            # attention_sm90.cu's split_kernel). Growing replaces the buffer: a call
            # still in flight on this stream keeps the old one alive through the caching
            # allocator's stream ordering.
            self.words = torch.zeros(max(tokens, 64) * SYNC_STRIDE, dtype=torch.int32, device=device)
        return self.words


_SYNC: dict[tuple, _SyncWords] = {}


def sync_words_for(device: torch.device) -> _SyncWords:
    """The CUDA kernel's barrier words on ``device``'s current stream."""
    index = device_index(device)
    key = (f"cuda:{index}", torch.cuda.current_stream(index).cuda_stream)
    if key not in _SYNC:
        _SYNC[key] = _SyncWords()
    return _SYNC[key]


def launch(
    q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse, splits: int, combine: str, gather_lag: int = 0,
    phase_clocks: torch.Tensor | None = None,
) -> int:
    """The CUDA kernel for T >= 1 tokens with its scratch and barrier words (``run`` with the
    buffers a call needs); returns FUSED, TWO_LAUNCH or CLUSTER. ``phase_clocks``: see ``run``."""
    T = q_nope.shape[0]
    device = q_nope.device
    # Scratch per call (a host-side lookup in the caching allocator); the cluster combine keeps
    # its partials in shared memory and needs none.
    scratch = 0 if combine == "cluster" else T * splits
    part_out = torch.empty(scratch * NUM_HEADS * D_CKV, dtype=torch.bfloat16, device=device)
    part_lse = torch.empty(scratch * NUM_HEADS, dtype=torch.float32, device=device)
    sync = sync_words_for(device).get(device, T) if combine != "cluster" else part_lse.new_empty(0, dtype=torch.int32)
    return run(
        q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse, part_out, part_lse, sync,
        splits, combine=combine, gather_lag=gather_lag, phase_clocks=phase_clocks,
    )
