"""Byte layouts of paged FP8 KV records (BRIEF §2.3), as descriptor objects instead of scattered numbers.

One :class:`KvRecordFormat` per FlashMLA ``kv_format`` (``V32``, ``V32_NO_ROPE``, ``V4``, ``V41``,
``V41_FP4``) plus the lightning indexer's DeepGEMM key page. A descriptor owns its widths, offsets,
scale rule, page-stride rule and the zero-copy views that split a raw ``[num_blocks, page_stride]``
cache into values, scales and RoPE; it offers the reference writer (:meth:`KvRecordFormat.quantize`)
and reader (:meth:`KvRecordFormat.dequantize`) with the scale convention a named parameter.
:func:`check_block_geometry` checks page kinds that share one physical block against every kernel's
TMA stride (the source's 212160-byte start-up failure). No other module may spell these widths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from dsa_bench.errors import DsaBenchError

FP8_E4M3_MAX = 448.0
#: Smallest amax (source convention) or scale (FlashMLA and raw conventions); keeps all-zero tiles finite.
MIN_FP8_SCALE = 1e-4
#: An e4m3 byte that decodes to NaN; used to poison cache bytes no case may read.
FP8_NAN_BYTE = 0x7F
UE8M0_BIAS = 127
INT32_MAX = 2**31 - 1
#: FlashMLA asserts a 16-byte aligned cache base; every page offset inside a block keeps it.
BASE_ALIGNMENT = 16

#: ``"source"``: the source documents' writers (amax clamped at 1e-4, exponent ceil(log2(amax/448)));
#: ``"flashmla"``: FlashMLA's tests/quant.py (amax/448 clamped at 1e-4, rounded up to a power of two);
#: ``"raw"``: amax/448 clamped at 1e-4, not rounded (fp32 scales only: the indexer's key writer).
ScaleConvention = Literal["source", "flashmla", "raw"]
SCALE_CONVENTIONS: tuple[str, ...] = ("source", "flashmla", "raw")


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(x))`` of positive float32 values (frexp, no log rounding)."""
    mantissa, exponent = torch.frexp(x)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def over_e4m3_max(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` in fp32, rounded once (IEEE division) on every device. Dividing a CUDA tensor by a Python
    number, torch multiplies by its reciprocal, and 1/448 is inexact: one ulp off for some amax (seen on an
    H100: a written scale's last byte 0x92 for 0x93), and past a power of two for an exact 448 * 2^k. In fp64 the
    reciprocal's error (2^-53) cannot move the quotient across an fp32 rounding boundary: a/448 of an fp32 a is
    never within 2^-34 (relative) of one, so its single rounding to fp32 is the correctly rounded quotient."""
    return (amax.double() / FP8_E4M3_MAX).float()


def scale_exponents(amax: torch.Tensor, convention: ScaleConvention) -> torch.Tensor:
    """Power-of-two scale exponents (int32) of tiles with absolute maxima ``amax``."""
    amax = amax.float()
    if convention == "source":
        return _ceil_log2(over_e4m3_max(amax.clamp_min(MIN_FP8_SCALE)))
    if convention == "flashmla":
        return _ceil_log2(over_e4m3_max(amax).clamp_min(MIN_FP8_SCALE))
    raise DsaBenchError(f"scale convention {convention!r} has no power-of-two exponent; choose source or flashmla")


@dataclass(frozen=True)
class RecordParts:
    """One token per row: ``values`` [n, value_bytes], ``scales`` [n, scale_bytes] (pad bytes included)
    and ``rope`` [n, rope_bytes], all uint8: exactly the bytes a writer stores."""

    values: torch.Tensor
    scales: torch.Tensor
    rope: torch.Tensor


@dataclass(frozen=True)
class KvRecordFormat:
    """One paged KV record layout.

    ``per_token``: each token's record is ``values | scales | rope`` and a page is ``block_size``
    records. ``per_page`` (structure of arrays): a page holds ``block_size`` data rows
    (``values | rope``) and then ``block_size`` scale rows (``scales | pad``).
    """

    kv_format: str
    d_qk: int
    layout: Literal["per_token", "per_page"]
    quant_dims: int  #: dims quantized per token (the first ones of the input row)
    value_bytes: int  #: quantized value bytes per token
    value_dtype: Literal["e4m3", "e2m1"]
    scale_dtype: Literal["fp32", "ue8m0", "e4m3"]
    scale_tile: int  #: dims per scale
    scale_bytes: int  #: scale bytes per token, pad bytes included
    rope_dims: int  #: trailing dims stored as bf16, not quantized
    tma_stride: int  #: bytes between rows the reading kernel's TMA steps over
    page_alignment: int  #: default page-stride alignment
    pad_byte: int | None  #: the writer's value for scale pad bytes (None: there are none)
    pad_rule: str  #: who writes the pad scale bytes and the page padding
    block_size: int | None = None  #: fixed tokens per page (the indexer page), else None

    def __post_init__(self) -> None:
        assert self.scale_bytes >= self.num_scales * self.scale_element_bytes
        assert self.page_alignment % BASE_ALIGNMENT == 0

    @property
    def rope_bytes(self) -> int:
        return 2 * self.rope_dims

    @property
    def data_row_bytes(self) -> int:
        return self.value_bytes + self.rope_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.value_bytes + self.scale_bytes + self.rope_bytes

    @property
    def num_scales(self) -> int:
        return self.quant_dims // self.scale_tile

    @property
    def scale_element_bytes(self) -> int:
        return 4 if self.scale_dtype == "fp32" else 1

    @property
    def input_dims(self) -> int:
        return self.quant_dims + self.rope_dims

    # --- offsets and page strides ---------------------------------------------------------------
    def _bs(self, block_size: int | None) -> int:
        bs = block_size if block_size is not None else self.block_size
        if bs is None or bs < 1:
            raise DsaBenchError(f"{self.kv_format}: a block size >= 1 is needed, got {block_size}")
        if self.block_size is not None and bs != self.block_size:
            raise DsaBenchError(f"{self.kv_format}: the page holds exactly {self.block_size} tokens, got block size {bs}")
        return bs

    def offsets(self, slot: int, block_size: int | None = None) -> dict[str, int]:
        """Byte offsets inside a page of slot ``slot``'s values, scales and RoPE (-1: none stored)."""
        bs = self._bs(block_size)
        if not 0 <= slot < bs:
            raise DsaBenchError(f"{self.kv_format}: slot {slot} outside a page of {bs} tokens")
        if self.layout == "per_token":
            base = slot * self.bytes_per_token
            data, scales, rope = base, base + self.value_bytes, base + self.value_bytes + self.scale_bytes
        else:
            data = slot * self.data_row_bytes
            scales, rope = bs * self.data_row_bytes + slot * self.scale_bytes, data + self.value_bytes
        return {"data": data, "scales": scales, "rope": rope if self.rope_dims else -1}

    def packed_page_bytes(self, block_size: int | None = None) -> int:
        return self._bs(block_size) * self.bytes_per_token

    def page_stride(self, block_size: int | None = None, alignment: int | None = None) -> int:
        """The packed page rounded up to ``alignment`` (default :attr:`page_alignment`)."""
        align = self.page_alignment if alignment is None else alignment
        return math.ceil(self.packed_page_bytes(block_size) / align) * align

    # --- zero-copy views ------------------------------------------------------------------------
    def raw_pages(self, cache: torch.Tensor) -> torch.Tensor:
        """``[num_blocks, page_bytes]`` uint8 view of a cache of any 1-byte dtype: a contiguous tensor of any
        shape (``page_bytes`` = its page stride), or a page-strided view such as FlashMLA's ``[num_blocks,
        block_size, 1, bytes_per_token]`` slice of a larger backing, whose pages are contiguous and
        ``stride(0)`` bytes apart (``page_bytes`` = the bytes the view covers per page)."""
        if cache.element_size() != 1:
            raise DsaBenchError(f"{self.kv_format}: the cache must be a 1-byte tensor, got {cache.dtype}")
        if cache.is_contiguous():
            return cache.view(torch.uint8).reshape(cache.shape[0], -1)
        per_page = cache[0].numel() if cache.dim() >= 2 and cache.shape[0] else 0
        if per_page and cache[0].is_contiguous() and cache.stride(0) >= per_page:
            return cache.view(torch.uint8).as_strided((cache.shape[0], per_page), (cache.stride(0), 1))
        raise DsaBenchError(f"{self.kv_format}: the cache must be contiguous, or contiguous pages stride(0) bytes apart; "
                            f"got shape {list(cache.shape)} with strides {list(cache.stride())}")

    def _rows(self, cache: torch.Tensor, block_size: int | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        bs = self._bs(block_size)
        raw = self.raw_pages(cache)
        if raw.shape[1] < self.packed_page_bytes(bs):
            raise DsaBenchError(f"{self.kv_format}: page stride {raw.shape[1]} B < packed page {self.packed_page_bytes(bs)} B "
                                f"(block size {bs})")
        n = raw.shape[0]
        if self.layout == "per_token":
            rows = raw[:, : bs * self.bytes_per_token].view(n, bs, self.bytes_per_token)
            return rows, rows[:, :, self.value_bytes :], bs
        data = raw[:, : bs * self.data_row_bytes].view(n, bs, self.data_row_bytes)
        end = bs * (self.data_row_bytes + self.scale_bytes)
        return data, raw[:, bs * self.data_row_bytes : end].view(n, bs, self.scale_bytes), bs

    def values(self, cache: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
        """``[num_blocks, block_size, value_bytes]`` view: float8_e4m3fn, or uint8 (two e2m1 per byte)."""
        data, _, _ = self._rows(cache, block_size)
        values = data[:, :, : self.value_bytes]
        return values.view(torch.float8_e4m3fn) if self.value_dtype == "e4m3" else values

    def scales(self, cache: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
        """Scales view, ``[num_blocks, block_size, num_scales]`` (``[num_blocks, block_size]`` with one scale
        per token): float32, float8_e4m3fn, or uint8 UE8M0 bytes; pad bytes left out."""
        _, scale_rows, _ = self._rows(cache, block_size)
        scales = scale_rows[:, :, : self.num_scales * self.scale_element_bytes]
        typed = {"fp32": torch.float32, "e4m3": torch.float8_e4m3fn, "ue8m0": torch.uint8}[self.scale_dtype]
        scales = scales.view(typed)
        return scales[:, :, 0] if self.num_scales == 1 else scales

    def rope(self, cache: torch.Tensor, block_size: int | None = None) -> torch.Tensor | None:
        """``[num_blocks, block_size, rope_dims]`` bfloat16 view, or None where RoPE is quantized or absent."""
        if not self.rope_dims:
            return None
        data, _, _ = self._rows(cache, block_size)
        start = self.value_bytes + self.scale_bytes if self.layout == "per_token" else self.value_bytes
        return data[:, :, start : start + self.rope_bytes].view(torch.bfloat16)

    def cache_shape(self, num_blocks: int, block_size: int | None = None) -> tuple[int, int, int, int]:
        return (num_blocks, self._bs(block_size), 1, self.bytes_per_token)

    def empty_cache(self, num_blocks: int, device: torch.device, block_size: int | None = None) -> torch.Tensor:
        """A packed cache whose every byte is FP8 NaN (fp32 scales float32 NaN), shaped per :meth:`cache_shape`."""
        bs = self._bs(block_size)
        cache = torch.full((num_blocks, self.packed_page_bytes(bs)), FP8_NAN_BYTE, dtype=torch.uint8, device=device)
        if self.scale_dtype == "fp32":
            self.scales(cache, bs).fill_(float("nan"))
        return cache.view(torch.int8).view(self.cache_shape(num_blocks, bs))

    # --- reference writer and reader ------------------------------------------------------------
    def quantize(self, x: torch.Tensor, convention: ScaleConvention) -> RecordParts:
        """Quantize ``x`` [n, input_dims] (RoPE dims last, already rotated) into record bytes."""
        if self.value_dtype != "e4m3":
            raise DsaBenchError(f"{self.kv_format}: no reference quantizer (its e2m1/e4m3 scale rule is not specified "
                                "in BRIEF §2.3)")
        if x.dim() != 2 or x.shape[1] != self.input_dims:
            raise DsaBenchError(f"{self.kv_format}: quantize expects [n, {self.input_dims}], got {list(x.shape)}")
        n = x.shape[0]
        tiles = x[:, : self.quant_dims].float().reshape(n, self.num_scales, self.scale_tile)
        amax = tiles.abs().amax(dim=-1)
        if convention == "raw":
            if self.scale_dtype != "fp32":
                raise DsaBenchError(f"{self.kv_format}: the raw convention needs fp32 scales, not {self.scale_dtype}")
            scale = over_e4m3_max(amax).clamp_min(MIN_FP8_SCALE)
            exponent = None
        elif convention in ("source", "flashmla"):
            exponent = scale_exponents(amax, convention)
            if self.scale_dtype == "ue8m0":
                exponent = exponent.clamp(-UE8M0_BIAS, 255 - UE8M0_BIAS)
            scale = torch.ldexp(torch.ones_like(amax), exponent)
        else:
            raise DsaBenchError(f"scale convention {convention!r}: choose one of {', '.join(SCALE_CONVENTIONS)}")
        q = (tiles / scale[:, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        values = q.reshape(n, self.quant_dims).view(torch.uint8)
        scales = torch.full((n, self.scale_bytes), self.pad_byte or 0, dtype=torch.uint8, device=x.device)
        if self.scale_dtype == "fp32":
            scales[:, : 4 * self.num_scales] = scale.contiguous().view(torch.uint8)
        else:
            assert exponent is not None
            scales[:, : self.num_scales] = (exponent + UE8M0_BIAS).to(torch.uint8)
        rope = x[:, self.quant_dims :].to(torch.bfloat16).contiguous().view(torch.uint8)
        return RecordParts(values, scales, rope)

    def dequantize(self, parts: RecordParts) -> torch.Tensor:
        """The float32 [n, input_dims] rows the record bytes stand for."""
        n = parts.values.shape[0]
        if self.scale_dtype == "fp32":
            scale = parts.scales[:, : 4 * self.num_scales].contiguous().view(torch.float32)
        elif self.scale_dtype == "ue8m0":
            byte = parts.scales[:, : self.num_scales].to(torch.int32)
            scale = torch.where(byte == 255, float("nan"), torch.ldexp(torch.ones_like(byte, dtype=torch.float32), byte - UE8M0_BIAS))
        else:
            raise DsaBenchError(f"{self.kv_format}: no reference dequantizer for {self.value_dtype} values")
        q = parts.values.contiguous().view(torch.float8_e4m3fn).float().reshape(n, self.num_scales, self.scale_tile)
        nope = (q * scale[:, :, None]).reshape(n, self.quant_dims)
        rope = parts.rope.contiguous().view(torch.bfloat16).float().reshape(n, self.rope_dims)
        return torch.cat([nope, rope], dim=1)

    def write(self, cache: torch.Tensor, block_size: int | None, slots: torch.Tensor, parts: RecordParts) -> None:
        """Store ``parts`` at physical slots ``block * block_size + offset`` (-1 skipped) in place."""
        data, scale_rows, bs = self._rows(cache, block_size)
        keep = slots >= 0
        block, offset = slots[keep] // bs, slots[keep] % bs
        if self.layout == "per_token":
            data[block, offset] = torch.cat([parts.values, parts.scales, parts.rope], dim=1)[keep]
        else:
            data[block, offset] = torch.cat([parts.values, parts.rope], dim=1)[keep]
            scale_rows[block, offset] = parts.scales[keep]

    def read(self, cache: torch.Tensor, block_size: int | None, slots: torch.Tensor) -> RecordParts:
        """The record bytes of physical slots ``slots`` (all >= 0)."""
        data, scale_rows, bs = self._rows(cache, block_size)
        block, offset = slots // bs, slots % bs
        rows = data[block, offset]
        if self.layout == "per_token":
            v, s = self.value_bytes, self.value_bytes + self.scale_bytes
            return RecordParts(rows[:, :v], rows[:, v:s], rows[:, s:])
        return RecordParts(rows[:, : self.value_bytes], scale_rows[block, offset], rows[:, self.value_bytes :])


#: why a reference built on :meth:`KvRecordFormat.write` cannot be captured in a CUDA graph (``Definition.reference_uncapturable``)
WRITE_SYNCS = "its KV writer drops -1 slots by a boolean mask, which reads their count back to the host"

_NO_PAD = "no scale pad bytes; a page stride past the packed page is padding no writer touches"
V32 = KvRecordFormat("V32", 576, "per_token", 512, 512, "e4m3", "fp32", 128, 16, 64, tma_stride=656, page_alignment=656,
                     pad_byte=None, pad_rule=_NO_PAD)
V32_NO_ROPE = KvRecordFormat("V32_NO_ROPE", 512, "per_token", 512, 512, "e4m3", "fp32", 128, 16, 0, tma_stride=528,
                             page_alignment=528, pad_byte=None, pad_rule=_NO_PAD)
V4 = KvRecordFormat("V4", 512, "per_page", 448, 448, "e4m3", "ue8m0", 64, 8, 64, tma_stride=576, page_alignment=576,
                    pad_byte=0, pad_rule="scale byte 7 is written 0 (vLLM; FlashMLA never writes it); page padding untouched")
V41 = KvRecordFormat("V41", 512, "per_page", 512, 512, "e4m3", "ue8m0", 32, 16, 0, tma_stride=512, page_alignment=512,
                     pad_byte=None, pad_rule=_NO_PAD)
#: Valid only as the extra cache beside a V4.1 main cache (SM100). Its TMA stride and alignment are
#: taken as its 256-byte data row (BRIEF §2.3 does not state them).
V41_FP4 = KvRecordFormat("V41_FP4", 512, "per_page", 512, 256, "e2m1", "e4m3", 16, 32, 0, tma_stride=256,
                         page_alignment=256, pad_byte=None, pad_rule=_NO_PAD)
#: DeepGEMM's paged indexer keys: 64 rows of 128 e4m3 values, then 64 fp32 scales (the
#: ``[num_pages, 64, 1, 132]`` shape is only a view). No record TMA: it needs the 16-byte base only.
INDEXER_KEY_PAGE = KvRecordFormat("INDEXER", 128, "per_page", 128, 128, "e4m3", "fp32", 128, 4, 0,
                                  tma_stride=BASE_ALIGNMENT, page_alignment=BASE_ALIGNMENT, pad_byte=None,
                                  pad_rule=_NO_PAD, block_size=64)

FORMATS: dict[str, KvRecordFormat] = {f.kv_format: f for f in (V32, V32_NO_ROPE, V4, V41, V41_FP4, INDEXER_KEY_PAGE)}


def get_format(name: str) -> KvRecordFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise DsaBenchError(f"unknown KV record format {name!r}; known: {', '.join(FORMATS)}") from None


# --- block geometry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PageKind:
    """One page of a physical block: its format, tokens per page and the alignment its allocator used."""

    fmt: KvRecordFormat
    block_size: int
    alignment: int | None = None

    @property
    def stride(self) -> int:
        return self.fmt.page_stride(self.block_size, self.alignment)


@dataclass(frozen=True)
class BlockGeometry:
    pages: tuple[PageKind, ...]
    page_offsets: tuple[int, ...]
    block_stride: int


def check_block_geometry(pages: Sequence[PageKind], num_blocks: int = 1) -> BlockGeometry:
    """Check the pages sharing one physical block (block stride = sum of page strides) the way the
    decode kernels do at start-up: every page stride and offset on the 16-byte base and a multiple of
    its own kernel's TMA stride (later pages start on the 16-byte base only), the
    block stride a multiple of every kernel's TMA stride, and
    ``num_blocks * block_stride / tma_stride <= INT32_MAX``. Raises DsaBenchError naming the kind.

    The source's failure (seed 000, vLLM DSv4.1): the V4.1 main page (528 B/token, 512 alignment) and
    the indexer page (132 B/token, still aligned with the old 576 rule) share a block; each is aligned
    on its own, yet the block stride was 212160 B, not a multiple of 512. The seed gives only that sum.
    No single pair of same-block-size pages gives it; five such pairs at block size 64 (one per layer
    of a group) give it exactly: 5 * (33792 + 8640) = 212160 (see :func:`seed_000_block`).
    """
    if not pages:
        raise DsaBenchError("a block needs at least one page kind")
    offsets, offset = [], 0
    for i, page in enumerate(pages):
        name, stride = f"page {i} ({page.fmt.kv_format}, block size {page.block_size})", page.stride
        if stride % BASE_ALIGNMENT:
            raise DsaBenchError(f"{name}: page stride {stride} B is not a multiple of the {BASE_ALIGNMENT}-byte base")
        if stride % page.fmt.tma_stride:
            raise DsaBenchError(f"{name}: page stride {stride} B is not a multiple of its TMA stride {page.fmt.tma_stride} B")
        if offset % BASE_ALIGNMENT:
            raise DsaBenchError(f"{name}: starts at byte {offset} of the block, off the {BASE_ALIGNMENT}-byte base")
        offsets.append(offset)
        offset += stride
    block_stride = offset
    for page in pages:
        tma = page.fmt.tma_stride
        if block_stride % tma:
            strides = " + ".join(str(p.stride) for p in pages)
            raise DsaBenchError(f"{page.fmt.kv_format}: block stride {block_stride} B ({strides}) is not a multiple of its "
                                f"TMA stride {tma} B (remainder {block_stride % tma})")
        if num_blocks * (block_stride // tma) > INT32_MAX:
            raise DsaBenchError(f"{page.fmt.kv_format}: {num_blocks} blocks x {block_stride // tma} rows of {tma} B = "
                                f"{num_blocks * (block_stride // tma)} exceeds the int32 coordinate bound {INT32_MAX}")
    return BlockGeometry(tuple(pages), tuple(offsets), block_stride)


def seed_000_block(indexer_alignment: int | None = None) -> list[PageKind]:
    """Five (V4.1 main page, indexer page) pairs at block size 64; the indexer pages aligned with
    ``indexer_alignment`` (the old rule: V4's 576 -> 212160 B; the fix: V4.1's 512 -> 212480 B)."""
    align = V4.page_alignment if indexer_alignment is None else indexer_alignment
    return [PageKind(V41, 64), PageKind(INDEXER_KEY_PAGE, 64, align)] * 5


#: the ranges ``dsa-bench layout`` accepts: more layers than any model has, a page of at most
#: 2^20 tokens, an alignment of at most 1 MiB (a page alignment is a multiple of BASE_ALIGNMENT,
#: not a power of two: V4's is 576, V3.2's 656)
MAX_LAYERS = 4096
MAX_BLOCK_SIZE = 2**20
MAX_ALIGNMENT = 2**20


def layout_tables(names: Sequence[str], block_size: int, with_indexer: bool = False,
                  indexer_alignment: int | None = None, layers: int = 1,
                  ) -> tuple[list[list[object]], list[list[object]], DsaBenchError | None]:
    """What ``dsa-bench layout`` prints: one geometry row per format, and, when page kinds share a
    block (``with_indexer``: each main format's page followed by an indexer page aligned with
    ``indexer_alignment``, default the main format's own; ``layers`` such pairs), one row per block
    with its stride; plus the first broken block's error (None when all pass)."""
    formats = [get_format(n) for n in (names or [f for f in FORMATS if f != INDEXER_KEY_PAGE.kv_format])]
    if not 1 <= layers <= MAX_LAYERS:
        raise DsaBenchError(f"--layers {layers}: expected 1 to {MAX_LAYERS} (page pairs per block; a model has one per layer)")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise DsaBenchError(f"--block-size {block_size}: expected 1 to {MAX_BLOCK_SIZE} tokens per page")
    if indexer_alignment is not None and not (0 < indexer_alignment <= MAX_ALIGNMENT and indexer_alignment % BASE_ALIGNMENT == 0):
        raise DsaBenchError(f"--indexer-alignment {indexer_alignment}: expected a positive multiple of the {BASE_ALIGNMENT}-byte base "
                            f"alignment, at most {MAX_ALIGNMENT} (the formats' own are 16, 512, 528, 576 and 656)")  # fmt: skip
    rows: list[list[object]] = []
    for fmt in formats:
        bs = fmt.block_size or block_size
        packed, stride = fmt.packed_page_bytes(bs), fmt.page_stride(bs)
        at = fmt.offsets(0, bs)
        rows.append([fmt.kv_format, fmt.d_qk, fmt.bytes_per_token, fmt.layout, bs, packed, stride, stride - packed,
                     at["data"], at["scales"], "-" if at["rope"] < 0 else at["rope"],
                     f"{fmt.scale_dtype}/{fmt.scale_tile}", fmt.tma_stride])
    blocks: list[list[object]] = []
    error: DsaBenchError | None = None
    if with_indexer:
        for fmt in formats:
            if fmt is INDEXER_KEY_PAGE:
                continue
            align = fmt.page_alignment if indexer_alignment is None else indexer_alignment
            pages = [PageKind(fmt, block_size), PageKind(INDEXER_KEY_PAGE, INDEXER_KEY_PAGE.block_size or block_size, align)] * layers
            total = sum(p.stride for p in pages)
            try:
                check_block_geometry(pages)
                verdict = "ok"
            except DsaBenchError as exc:
                verdict, error = "BROKEN", error or exc
            blocks.append([f"{layers} x ({fmt.kv_format} + INDEXER@{align})", " + ".join(str(p.stride) for p in pages[:2]),
                           total, fmt.tma_stride, total % fmt.tma_stride, verdict])
    return rows, blocks, error


LAYOUT_HEADERS = ["format", "d_qk", "B/token", "layout", "block size", "page B", "page stride", "padding",
                  "data @", "scales @", "rope @", "scales", "TMA stride"]
BLOCK_HEADERS = ["block", "page strides", "block stride", "TMA stride", "remainder", "check"]
