"""The indexer-key insert of a decode step: one Triton launch writes each new token's key record.

A key is 128 bf16 values; its record in the DeepGEMM key page (``kv_records.INDEXER_KEY_PAGE``, 64
tokens per page of 8448 B: 64 x 128 e4m3 values token-major, then 64 fp32 scales) holds the values
divided by ``scale = max(amax / 448, 1e-4)`` (the ``raw`` convention: not rounded to a power of two)
and cast to e4m3, and the scale. Both divisions are IEEE round-to-nearest (``div_rn``; Triton's
``/`` compiles to an approximate division on a GPU) and the e4m3 bytes come from integer rounding
(``kv_insert``'s ``_e4m3_bits``), so the bytes equal the reference writer's on CPU and GPU alike.
-1 slots are skipped. One program per token; metadata checks only, no host synchronisation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.kv_records import FP8_E4M3_MAX, INDEXER_KEY_PAGE, MIN_FP8_SCALE
from ..kv_insert.triton_kernels import _e4m3_bits

KEY_DIMS = INDEXER_KEY_PAGE.quant_dims
PAGE_TOKENS = INDEXER_KEY_PAGE.block_size
PAGE_BYTES = INDEXER_KEY_PAGE.packed_page_bytes()
VALUE_BYTES = PAGE_TOKENS * INDEXER_KEY_PAGE.value_bytes  # the scales follow the 64 value rows


@triton.jit
def _key_insert_kernel(keys_ptr, slots_ptr, cache_ptr, scales_ptr, KEY_DIMS: tl.constexpr, PAGE_TOKENS: tl.constexpr,
                       PAGE_BYTES: tl.constexpr, VALUE_BYTES: tl.constexpr, E4M3_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        page = slot // PAGE_TOKENS
        offset = slot % PAGE_TOKENS
        dims = tl.arange(0, KEY_DIMS)
        x = tl.load(keys_ptr + t * KEY_DIMS + dims).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
        scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), MIN_SCALE)
        q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -E4M3_MAX), E4M3_MAX)
        base = page.to(tl.int64) * PAGE_BYTES
        tl.store(cache_ptr + base + offset * KEY_DIMS + dims, _e4m3_bits(q, True))
        tl.store(scales_ptr + (base + VALUE_BYTES) // 4 + offset, scale)


def insert_keys(keys: torch.Tensor, slots: torch.Tensor, index_cache: torch.Tensor) -> None:
    """Write ``keys`` [T, 128] bf16 at ``slots`` [T] int64 (-1: skip) of ``index_cache`` [num_pages, 64, 1, 132]."""
    if keys.dim() != 2 or keys.shape[1] != KEY_DIMS or keys.dtype != torch.bfloat16:
        raise ValueError(f"index keys: expected bf16 [T, {KEY_DIMS}], got {keys.dtype} {list(keys.shape)}")
    if slots.shape != (keys.shape[0],) or slots.dtype != torch.int64:
        raise ValueError(f"slots: expected int64 [{keys.shape[0]}], got {slots.dtype} {list(slots.shape)}")
    if index_cache.element_size() != 1 or not index_cache.is_contiguous() or index_cache[0].numel() != PAGE_BYTES:
        raise ValueError(f"index_cache: expected contiguous 1-byte pages of {PAGE_BYTES} B, got {index_cache.dtype} "
                         f"{list(index_cache.shape)}")
    if keys.shape[0] == 0:
        return
    cache = index_cache.view(torch.uint8).reshape(-1)
    _key_insert_kernel[(keys.shape[0],)](keys.contiguous(), slots.contiguous(), cache, cache.view(torch.float32),
                                         KEY_DIMS, PAGE_TOKENS, PAGE_BYTES, VALUE_BYTES, FP8_E4M3_MAX, MIN_FP8_SCALE)
