"""Fast KV quantize-and-insert for ``dsa_kv_insert_{v32,v4,v41}_fp8``: one Triton launch per call.

Entry points (destination-passing style; the cache is written in place)::

    kv_insert_v32(kv_c, k_pe, slot_mapping, block_size, kv_cache)
    kv_insert_v4(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)
    kv_insert_v41(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)

    kv_c, kv        [T, 512]           bf16   (kv: the last 64 dims are RoPE dims, not rotated)
    k_pe            [T, 64]            bf16   already rotated
    positions       [T]                int64
    cos_sin_cache   [max_pos, 64]      f32    cos in [0, 32), sin in [32, 64)
    slot_mapping    [T]                int64  block * block_size + offset, -1: skip the token
    block_size      int
    kv_cache        [num_blocks, page] uint8  page >= block_size x the record's bytes, page % 16 == 0

The record layouts are the descriptors of ``common/kv_records.py`` (dsa-bench's, vendored); the
kernel (``triton_kernels.py``) is one source specialised per format (``shapes.kernel_layout``), its
tile chosen by ``policy.py``. The entries check metadata only (no
device work besides the one launch, no host synchronisation), so a call can be graph-captured.
"""

from __future__ import annotations

import torch

from ..common.interpreter import INTERPRETED, device_problem
from ..common.kv_records import V4, V32, V41, KvRecordFormat
from . import policy, triton_kernels
from .shapes import LATENT_DIMS, ROPE_DIMS

#: the cache is also read as int16 / int32 words: its page stride and base keep 16-byte alignment
CACHE_ALIGNMENT = 16


def solution_notes() -> str:
    rounding = ("integer round-to-nearest-even code (the Triton interpreter's own casts do not round to nearest even)"
                if INTERPRETED else "the GPU's e4m3 / bf16 conversions")
    tile, small = policy.GPU_TILE, policy.SMALL_CALL_TILE
    return (f"KV insert: one Triton launch, {tile.tokens} tokens on {tile.num_warps} warp(s) per program on a GPU "
            f"({small.tokens} on {small.num_warps} up to {policy.SMALL_CALL_TOKENS} tokens), grid cdiv(T, tokens), "
            f"rows read beside their slots; e4m3 / bf16 rounding by {rounding}")


def _tensor_problem(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int | None, ...]) -> str | None:
    want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    if (t.dtype != dtype or t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape, strict=True))
            or not t.is_contiguous()):
        return f"{name} must be a contiguous {dtype} {want} tensor, got {t.dtype} {list(t.shape)}" + (
            "" if t.is_contiguous() else " (not contiguous)")
    return None


def _check(fmt: KvRecordFormat, tensors: dict[str, tuple[torch.Tensor, torch.dtype, tuple[int | None, ...]]],
           block_size: int, kv_cache: torch.Tensor) -> None:
    """Dtypes, shapes, contiguity, devices and the cache's record geometry, from metadata only."""
    problems = [p for name, (t, dtype, shape) in tensors.items() if (p := _tensor_problem(name, t, dtype, shape))]
    if block_size < 1:
        problems.append(f"block_size must be >= 1, got {block_size}")
    elif kv_cache.element_size() != 1 or kv_cache.dim() != 2 or not kv_cache.is_contiguous():
        problems.append(f"kv_cache must be a contiguous 1-byte [num_blocks, page_bytes] tensor, got {kv_cache.dtype} "
                        f"{list(kv_cache.shape)}")
    else:
        page, packed = kv_cache.shape[1], fmt.packed_page_bytes(block_size)
        if page < packed or page % CACHE_ALIGNMENT or kv_cache.data_ptr() % CACHE_ALIGNMENT:
            problems.append(f"kv_cache page stride {page} B must hold {block_size} {fmt.kv_format} records of "
                            f"{fmt.bytes_per_token} B ({packed} B) on a {CACHE_ALIGNMENT}-byte aligned base and stride")
    devices = {t.device for t, _, _ in tensors.values()} | {kv_cache.device}
    if len(devices) != 1:
        problems.append(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    elif problem := device_problem(next(iter(devices))):
        problems.append(problem)
    if problems:
        raise ValueError(f"{fmt.kv_format} insert: " + "; ".join(problems))


def kv_insert_v32(kv_c, k_pe, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    """V3.2: 512 e4m3 dims with fp32 scales per 128, k_pe stored as bf16, per-token records."""
    bs = int(block_size)
    t = kv_c.shape[0]
    _check(V32, {"kv_c": (kv_c, torch.bfloat16, (t, LATENT_DIMS)), "k_pe": (k_pe, torch.bfloat16, (t, ROPE_DIMS)),
                 "slot_mapping": (slot_mapping, torch.int64, (t,))}, bs, kv_cache)
    triton_kernels.launch(V32, kv_c, k_pe, None, None, slot_mapping, bs, kv_cache.view(torch.uint8))


def _rotating(fmt: KvRecordFormat, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    bs = int(block_size)
    t = kv.shape[0]
    _check(fmt, {"kv": (kv, torch.bfloat16, (t, LATENT_DIMS)), "positions": (positions, torch.int64, (t,)),
                 "cos_sin_cache": (cos_sin_cache, torch.float32, (None, ROPE_DIMS)),
                 "slot_mapping": (slot_mapping, torch.int64, (t,))}, bs, kv_cache)
    triton_kernels.launch(fmt, kv, kv, positions, cos_sin_cache, slot_mapping, bs, kv_cache.view(torch.uint8))


def kv_insert_v4(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    """V4: RoPE rotated and stored as bf16, 448 e4m3 dims with UE8M0 scales per 64, pad scale byte 0."""
    _rotating(V4, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)


def kv_insert_v41(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    """V4.1: RoPE rotated, then all 512 dims e4m3 with UE8M0 scales per 32."""
    _rotating(V41, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)
