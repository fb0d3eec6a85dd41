"""The KV insert's contract constants and the record layout its kernel is specialised for.

:func:`kernel_layout` reads a record layout from a :class:`~..common.kv_records.KvRecordFormat`
(tile, scale dtype, pad byte, where data, scales and RoPE live for a block size) and hands it to
the kernel as compile-time constants, so V3.2, V4 and V4.1 are three specialisations of one source.
"""

from __future__ import annotations

import functools
import math

from ..common.kv_records import FP8_E4M3_MAX, MIN_FP8_SCALE, UE8M0_BIAS, KvRecordFormat

#: the kv / kv_c row (dsa_kv_insert_*: [T, 512] bf16)
LATENT_DIMS = 512
#: RoPE dims: the last 64 of kv (V4, V4.1), or k_pe (V3.2)
ROPE_DIMS = 64
_FP32_MANTISSA_BITS = 23


def _mantissa_exponent(value: float) -> tuple[int, int]:
    """``value = (1 + mantissa / 2^23) * 2^exponent`` for a positive float32-exact ``value``."""
    m, e = math.frexp(value)  # value = m * 2^e, 0.5 <= m < 1
    mantissa = (2 * m - 1) * 2**_FP32_MANTISSA_BITS
    assert mantissa == int(mantissa), value
    return int(mantissa), e - 1




@functools.cache
def kernel_layout(fmt: KvRecordFormat, rotate: bool, block_size: int) -> dict[str, int | bool | float]:
    """The kernel's compile-time constants for ``fmt`` at ``block_size`` (``rotate``: the RoPE dims
    are the latent row's last 64 and are rotated; else they come separately, already rotated)."""
    if fmt.value_dtype != "e4m3" or fmt.scale_dtype not in ("fp32", "ue8m0") or fmt.layout not in ("per_token", "per_page"):
        raise ValueError(f"{fmt.kv_format}: this kernel writes e4m3 values with fp32 or UE8M0 scales only")
    tile = fmt.scale_tile
    latent_tiles = LATENT_DIMS // tile
    rope_quantized = fmt.rope_dims == 0  # no bf16 RoPE dims: they are quantized too (V4.1)
    if rotate != (fmt.input_dims == LATENT_DIMS):
        raise ValueError(f"{fmt.kv_format}: RoPE dims inside the {LATENT_DIMS}-dim row iff they are rotated here")
    main_dims = fmt.quant_dims - (ROPE_DIMS if rope_quantized else 0)
    if rope_quantized and not rotate:
        raise ValueError(f"{fmt.kv_format}: quantized RoPE dims are expected inside the latent row")
    if latent_tiles * tile != LATENT_DIMS or latent_tiles & (latent_tiles - 1) or main_dims % tile or (rope_quantized and ROPE_DIMS % tile):
        raise ValueError(f"{fmt.kv_format}: tile {tile} does not split {LATENT_DIMS} and {ROPE_DIMS} dims into powers of two")
    if not rope_quantized and fmt.rope_dims != ROPE_DIMS:
        raise ValueError(f"{fmt.kv_format}: expected {ROPE_DIMS} bf16 RoPE dims or none")
    scale_eb = fmt.scale_element_bytes
    pad = -1 if fmt.pad_byte is None else fmt.pad_byte
    if fmt.scale_bytes != fmt.num_scales * scale_eb and (pad < 0 or scale_eb != 1 or fmt.scale_bytes > latent_tiles):
        raise ValueError(f"{fmt.kv_format}: scale pad bytes are supported for 1-byte scales inside the tile count")
    at0 = fmt.offsets(0, block_size)
    if block_size > 1:
        at1 = fmt.offsets(1, block_size)
        step = {k: at1[k] - at0[k] for k in at0}
    else:
        step = {k: 0 for k in at0}
    rope_words = ROPE_DIMS // 2
    rope_tiles = ROPE_DIMS // tile if rope_quantized else 1
    # Element offsets in the int16 / int32 views of the cache must be whole elements.
    words = [(at0["scales"], step["scales"], scale_eb)]
    if not rope_quantized:
        words.append((at0["rope"], step["rope"], 4))
    else:
        words.append((at0["data"] + main_dims, step["data"], 2))
    for base, stride, size in words:
        if base % size or stride % size:
            raise ValueError(f"{fmt.kv_format}: offset {base} + slot x {stride} is not {size}-byte aligned")
    max_mantissa, max_exponent = _mantissa_exponent(FP8_E4M3_MAX)
    return {
        "BLOCK_SIZE": block_size,
        "LATENT": LATENT_DIMS,
        "TILE": tile,
        "LT": latent_tiles,
        "MAIN_TILES": main_dims // tile,
        "NUM_SCALES": fmt.num_scales,
        "SCALE_FP32": fmt.scale_dtype == "fp32",
        "SCALE_BYTES": fmt.scale_bytes,
        "PAD_BYTE": pad,
        "ROTATE": rotate,
        "ROPE_QUANTIZED": rope_quantized,
        "ROPE_TILES": rope_tiles,
        "ROPE_PAIRS": rope_words // rope_tiles,
        "ROPE_ROW_WORDS": LATENT_DIMS // 2 if rotate else rope_words,
        "ROPE_COL_WORDS": (LATENT_DIMS - ROPE_DIMS) // 2 if rotate else 0,
        "DATA_BASE": at0["data"],
        "DATA_STEP": step["data"],
        "SCALE_BASE": at0["scales"] // scale_eb,
        "SCALE_STEP": step["scales"] // scale_eb,
        # bf16 RoPE int32 words (V3.2, V4), e4m3 RoPE int16 pairs (V4.1)
        "ROPE_BASE": (at0["data"] + main_dims) // 2 if rope_quantized else at0["rope"] // 4,
        "ROPE_STEP": step["data"] // 2 if rope_quantized else step["rope"] // 4,
        "MIN_AMAX": MIN_FP8_SCALE,
        "MAX_EXPONENT": max_exponent,
        "MAX_MANTISSA": max_mantissa,
        "SCALE_LO": -UE8M0_BIAS,
        "SCALE_HI": 255 - UE8M0_BIAS,
    }
