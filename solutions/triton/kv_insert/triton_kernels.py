"""One Triton kernel family that quantizes KV rows and inserts their FP8 records into a paged cache.

The record layout is not spelled here: ``shapes.kernel_layout`` reads it from a record descriptor
and hands it to the kernel as compile-time constants, so V3.2, V4 and V4.1 are three
specialisations of one source.

A program takes ``TOKENS`` consecutive tokens (``policy.default_tile``; the grid is ``cdiv(T, TOKENS)``, never
capped, so per-token cost does not change with T). Per token it reads the 512-dim latent row as
``[LT, TILE]`` scale tiles, takes each tile's amax, its power-of-two exponent and the e4m3 bytes,
and stores data bytes and scales. V3.2 and V4 keep the 64 RoPE dims as bf16: they are read a
second time as 32 int32 words (a bf16 pair each), rotated in fp32 when the format rotates (V4), and
stored. V4.1 rotates them the same way and quantizes them as their own two tiles, each e4m3 pair
converted by one PTX instruction (Triton's own cast gave wrong bytes on that shape). Exactness:

* exponent: ``ceil(log2(max(amax, 1e-4) / 448))`` from the float bits of ``c = max(amax, 1e-4)``
  (c = m * 2^E, 1 <= m < 2, 448 = 1.75 * 2^8: the exponent is E - 8, plus 1 when m > 1.75), exact
  for every c. The reference's IEEE fp32 division followed by frexp gives the same integer (the
  fp32 value just above 448 * 2^k divides to more than 2^k plus half an ulp), so both are exact;
* values: ``x * 2^-e``, an exact scaling like the reference's ``x / 2^e``; ``|x * 2^-e| <= 448`` by
  the exponent's choice, so the reference's clamp never acts and is left out; e4m3 and bf16
  round to nearest even: the hardware conversions on a GPU, or (``SOFT_ROUND``, the interpreter's
  path, whose own conversions do not round to nearest even) integer code that does the same;
* RoPE: ``e*c - o*s`` and ``o*c + e*s`` as separate fp32 products and a sum, launched with
  ``enable_fp_fusion=False`` so no FMA changes a bit against the reference's separate torch ops.

Addresses are int64 (262144 tokens x a record, num_blocks x page stride pass 2^31). Rows are read
beside their slots (``speculative``), not after them: that saves a dependent memory round trip
per program, at the price of reading the rows of skipped (slot -1) tokens too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.interpreter import INTERPRETED
from ..common.kv_records import KvRecordFormat
from .policy import LaunchTile, default_tile
from .shapes import kernel_layout

# --------------------------------------------------------------------------- device code


@triton.jit
def _bf16_to_f32(bits):
    """fp32 values of bf16 bit patterns held in the low 16 bits of ``bits`` (exact)."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _exponents(amax, MIN_AMAX: tl.constexpr, MAX_EXPONENT: tl.constexpr, MAX_MANTISSA: tl.constexpr,
               SCALE_FP32: tl.constexpr, SCALE_LO: tl.constexpr, SCALE_HI: tl.constexpr):
    """Exact ``ceil(log2(max(amax, MIN_AMAX) / 448))`` (int32) from the float bits; clamped to the
    UE8M0 range for byte scales, as the reference does."""
    bits = tl.maximum(amax, MIN_AMAX).to(tl.int32, bitcast=True)
    e = (bits >> 23) - (127 + MAX_EXPONENT) + ((bits & 0x7FFFFF) > MAX_MANTISSA).to(tl.int32)
    if not SCALE_FP32:
        e = tl.minimum(tl.maximum(e, SCALE_LO), SCALE_HI)
    return e


@triton.jit
def _pow2(e):
    """2^e as fp32 from its bits (normal range only: |e| <= 126)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _e4m3_bits(q, SOFT_ROUND: tl.constexpr):
    """e4m3 bytes (uint8) of fp32 ``q`` with |q| <= 448, rounded to nearest even like torch's cast."""
    if SOFT_ROUND:
        bits = q.to(tl.int32, bitcast=True)
        sign = (bits >> 24) & 0x80
        a = bits & 0x7FFFFFFF
        # normal results (|q| >= 2^-6): drop 20 mantissa bits with ties to even, rebias 127 -> 7
        normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
        # subnormal results: |q| * 2^9 rounded to an integer 0..8 by the fp32 add of 2^23
        sub = (a.to(tl.float32, bitcast=True) * 512.0 + 8388608.0).to(tl.int32, bitcast=True) - 0x4B000000
        return (tl.where(a >= 0x3C800000, normal, sub) | sign).to(tl.uint8)
    else:
        return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)


@triton.jit
def _e4m3_pair_words(lo, hi, SOFT_ROUND: tl.constexpr):
    """int16 words of two e4m3 bytes, ``lo`` (fp32, |lo| <= 448) in the low byte and ``hi`` in the high one."""
    if SOFT_ROUND:
        return ((_e4m3_bits(hi, True).to(tl.int32) << 8) | _e4m3_bits(lo, True).to(tl.int32)).to(tl.int16)
    else:
        # One PTX conversion per pair (d's high byte from the first source): Triton's own cast
        # wrote wrong bytes for the V4.1 RoPE block's [tokens, 2, 16] pairs on the H200.
        return tl.inline_asm_elementwise(
            "cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;", "=h,f,f", [lo, hi], dtype=tl.int16, is_pure=True, pack=1
        )


@triton.jit
def _bf16_bits(x, SOFT_ROUND: tl.constexpr):
    """bf16 bit patterns (int32, 0..65535) of fp32 ``x``, rounded to nearest even like torch."""
    if SOFT_ROUND:
        bits = x.to(tl.int32, bitcast=True)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    else:
        return x.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _rotated_pairs(words, pos_ptr, cos_sin_ptr, tok, live, rows, k, HALF: tl.constexpr):
    """The RoPE rotation of bf16 pairs ``words`` (int32, even element in the low half) at pair
    index ``k`` of each token's row: fp32 ``(even * c - odd * s, odd * c + even * s)`` against
    the token's cos/sin row (HALF cosines, then HALF sines), as separate products and one sum."""
    pos = tl.load(pos_ptr + tok, mask=live, other=0)
    cs = cos_sin_ptr + pos[:, None, None] * (2 * HALF)
    c = tl.load(cs + k, mask=rows[:, None, None], other=0.0)
    s = tl.load(cs + HALF + k, mask=rows[:, None, None], other=0.0)
    even = _bf16_to_f32(words)
    odd = (words & -65536).to(tl.float32, bitcast=True)
    return even * c - odd * s, odd * c + even * s


@triton.jit
def _store_scales(cache_u8, cache_i32, at, e, index, mask, SCALE_FP32: tl.constexpr):
    """Scales ``2^e`` at scale element ``at + index``: fp32 bits, or UE8M0 bytes (e + 127)."""
    if SCALE_FP32:
        tl.store(cache_i32 + at + index, (e + 127) << 23, mask=mask)
    else:
        tl.store(cache_u8 + at + index, (e + 127).to(tl.uint8), mask=mask)


@triton.jit
def kv_insert_kernel(
    latent_ptr, rope_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
    cache_u8, cache_i16, cache_i32,
    num_tokens, page_u8, page_i16, page_i32,
    TOKENS: tl.constexpr, SPECULATIVE: tl.constexpr, SOFT_ROUND: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, LATENT: tl.constexpr, TILE: tl.constexpr, LT: tl.constexpr, MAIN_TILES: tl.constexpr,
    NUM_SCALES: tl.constexpr, SCALE_FP32: tl.constexpr, SCALE_BYTES: tl.constexpr, PAD_BYTE: tl.constexpr,
    ROTATE: tl.constexpr, ROPE_QUANTIZED: tl.constexpr, ROPE_TILES: tl.constexpr, ROPE_PAIRS: tl.constexpr,
    ROPE_ROW_WORDS: tl.constexpr, ROPE_COL_WORDS: tl.constexpr,
    DATA_BASE: tl.constexpr, DATA_STEP: tl.constexpr, SCALE_BASE: tl.constexpr, SCALE_STEP: tl.constexpr,
    ROPE_BASE: tl.constexpr, ROPE_STEP: tl.constexpr,
    MIN_AMAX: tl.constexpr, MAX_EXPONENT: tl.constexpr, MAX_MANTISSA: tl.constexpr,
    SCALE_LO: tl.constexpr, SCALE_HI: tl.constexpr,
):
    """Records of tokens ``[pid * TOKENS, (pid + 1) * TOKENS)``. Pointers: ``latent_ptr`` int16
    [T, LATENT] (bf16 bits), ``rope_ptr`` int32 words [T, ROPE_ROW_WORDS] whose RoPE pairs start at
    word ROPE_COL_WORDS, ``pos_ptr`` int64 [T] and ``cos_sin_ptr`` fp32 [max_pos, 64] (read only when
    ROTATE), ``slot_ptr`` int64 [T]; the cache as uint8 / int16 / int32 views with page strides
    ``page_*`` in their own elements."""
    pid = tl.program_id(0)
    tok = pid * TOKENS + tl.arange(0, TOKENS)
    live = tok < num_tokens
    tok = tok.to(tl.int64)
    slot = tl.load(slot_ptr + tok, mask=live, other=-1)
    valid = slot >= 0
    if SPECULATIVE:
        rows = live
    else:
        rows = valid
    page = slot // BLOCK_SIZE
    offset = slot - page * BLOCK_SIZE

    # ---- the latent row as [TOKENS, LT, TILE] scale tiles
    j = tl.arange(0, LT)[None, :, None]
    d = j * TILE + tl.arange(0, TILE)[None, None, :]
    x = _bf16_to_f32(tl.load(latent_ptr + tok[:, None, None] * LATENT + d, mask=rows[:, None, None], other=0))
    e = _exponents(tl.max(tl.abs(x), axis=2), MIN_AMAX, MAX_EXPONENT, MAX_MANTISSA, SCALE_FP32, SCALE_LO, SCALE_HI)
    q = _e4m3_bits(x * _pow2(-e)[:, :, None], SOFT_ROUND)
    data_at = page * page_u8 + DATA_BASE + offset * DATA_STEP
    store = valid[:, None, None]
    if MAIN_TILES < LT:
        store = store & (d < MAIN_TILES * TILE)
    tl.store(cache_u8 + data_at[:, None, None] + d, q, mask=store)

    jj = tl.arange(0, LT)[None, :]
    if SCALE_FP32:
        scale_at = page * page_i32 + SCALE_BASE + offset * SCALE_STEP
    else:
        scale_at = page * page_u8 + SCALE_BASE + offset * SCALE_STEP
    if PAD_BYTE >= 0 and not SCALE_FP32:
        # the pad bytes after the scales, in the same store
        pad = (jj >= NUM_SCALES) & (jj < SCALE_BYTES)
        byte = tl.where(pad, PAD_BYTE, e + 127).to(tl.uint8)
        tl.store(cache_u8 + scale_at[:, None] + jj, byte, mask=valid[:, None] & ((jj < MAIN_TILES) | pad))
    else:
        _store_scales(cache_u8, cache_i32, scale_at[:, None], e, jj, valid[:, None] & (jj < MAIN_TILES), SCALE_FP32)

    if not ROPE_QUANTIZED:
        # ---- RoPE kept as bf16: 32 int32 words (bf16 pairs) as [TOKENS, ROPE_TILES, ROPE_PAIRS]
        k = tl.arange(0, ROPE_TILES)[None, :, None] * ROPE_PAIRS + tl.arange(0, ROPE_PAIRS)[None, None, :]
        words = tl.load(rope_ptr + tok[:, None, None] * ROPE_ROW_WORDS + ROPE_COL_WORDS + k, mask=rows[:, None, None], other=0)
        rope_at = page * page_i32 + ROPE_BASE + offset * ROPE_STEP
        rope_store = valid[:, None, None]
        if not ROTATE:
            tl.store(cache_i32 + rope_at[:, None, None] + k, words, mask=rope_store)  # already rotated: copy the bits
        else:
            r_even, r_odd = _rotated_pairs(words, pos_ptr, cos_sin_ptr, tok, live, rows, k, ROPE_TILES * ROPE_PAIRS)
            word = (_bf16_bits(r_odd, SOFT_ROUND) << 16) | _bf16_bits(r_even, SOFT_ROUND)
            tl.store(cache_i32 + rope_at[:, None, None] + k, word, mask=rope_store)
    else:
        # ---- V4.1, RoPE as its own [TOKENS, ROPE_TILES, ROPE_PAIRS] block of bf16 pairs: rotate, quantize
        # per tile, store the e4m3 pairs as int16 words and the tiles' scales after the main ones
        k = tl.arange(0, ROPE_TILES)[None, :, None] * ROPE_PAIRS + tl.arange(0, ROPE_PAIRS)[None, None, :]
        words = tl.load(rope_ptr + tok[:, None, None] * ROPE_ROW_WORDS + ROPE_COL_WORDS + k, mask=rows[:, None, None], other=0)
        r_even, r_odd = _rotated_pairs(words, pos_ptr, cos_sin_ptr, tok, live, rows, k, ROPE_TILES * ROPE_PAIRS)
        amax = tl.max(tl.maximum(tl.abs(r_even), tl.abs(r_odd)), axis=2)
        er = _exponents(amax, MIN_AMAX, MAX_EXPONENT, MAX_MANTISSA, SCALE_FP32, SCALE_LO, SCALE_HI)
        inv = _pow2(-er)[:, :, None]
        pairs = _e4m3_pair_words(r_even * inv, r_odd * inv, SOFT_ROUND)
        rope_at = page * page_i16 + ROPE_BASE + offset * ROPE_STEP
        tl.store(cache_i16 + rope_at[:, None, None] + k, pairs, mask=valid[:, None, None])
        rt = tl.arange(0, ROPE_TILES)[None, :]
        _store_scales(cache_u8, cache_i32, scale_at[:, None], er, MAIN_TILES + rt, valid[:, None], SCALE_FP32)


# --------------------------------------------------------------------------- host side


def launch(fmt: KvRecordFormat, latent: torch.Tensor, rope: torch.Tensor, positions: torch.Tensor | None,
           cos_sin_cache: torch.Tensor | None, slot_mapping: torch.Tensor, block_size: int, kv_cache: torch.Tensor,
           tile: LaunchTile | None = None, soft_round: bool | None = None, speculative: bool = True) -> None:
    """One launch writing every token's record. ``latent`` bf16 [T, 512]; ``rope`` bf16 [T, 64]
    (k_pe) or the latent itself when ``positions`` is given (rotate its last 64 dims); the cache a
    contiguous uint8 [num_blocks, page_bytes] with page_bytes % 16 == 0. Inputs checked by the caller.
    ``soft_round``: integer rounding code (default only under the interpreter). ``speculative``:
    rows read beside their slots (False: after them, only those of written tokens; tests and sweeps)."""
    num_tokens = latent.shape[0]
    if num_tokens == 0:
        return
    rotate = positions is not None
    layout = kernel_layout(fmt, rotate, block_size)
    tile = tile or default_tile(num_tokens)
    soft_round = INTERPRETED if soft_round is None else soft_round
    page = kv_cache.shape[1]
    latent_bits = latent.view(torch.int16)
    rope_words = (latent if rotate else rope).view(torch.int32)
    pos = positions if rotate else slot_mapping
    cos_sin = cos_sin_cache if rotate else slot_mapping
    grid = (triton.cdiv(num_tokens, tile.tokens),)
    kv_insert_kernel[grid](
        latent_bits, rope_words, pos, cos_sin, slot_mapping,
        kv_cache, kv_cache.view(torch.int16), kv_cache.view(torch.int32),
        num_tokens, page, page // 2, page // 4,
        TOKENS=tile.tokens, SPECULATIVE=speculative, SOFT_ROUND=soft_round, **layout,
        num_warps=tile.num_warps, enable_fp_fusion=False,
    )  # fmt: skip
