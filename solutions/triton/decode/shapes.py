"""Where a decode kernel finds a token's bytes: record geometry taken from the ``common/kv_records.py`` descriptors.

Nothing here spells a record width. ``RecordGeometry.of(fmt, block_size)`` turns a
:class:`~..common.kv_records.KvRecordFormat` descriptor (dsa-bench's, vendored) into the kernel's
constexprs and cross-checks them against the descriptor's own ``offsets`` (first and last slot
of a page), so a descriptor change that the kernel's address arithmetic would not follow fails
at the first call instead of reading the wrong bytes.

A dequantized K row has ``fmt.d_qk`` dims: ``quant_dims`` FP8 e4m3 dims (scale tile
``scale_tile``, fp32 or UE8M0 scales) followed by ``rope_dims`` bf16 dims stored as written. The
value row V is its first ``D_V`` = 512 dims; the kernel splits the K row into

    main  [D_V]            = V: the FP8 dims, then the first D_V - quant_dims RoPE dims (V4: 448 + 64)
    extra [d_qk - D_V]     = RoPE dims in K only (V3.2: 64; V4, V4.1: none)

Addresses, for a physical token id ``block * block_size + slot``, ``page = cache + block * page_stride``:

    data row  = page + slot * data_slot_bytes                (values, then RoPE for per-page layouts)
    scales    = page + scale_base + slot * scale_slot_bytes
    RoPE      = data row + rope_offset
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.kv_records import KvRecordFormat

#: Width of the value row (and of the output) of every decode format.
D_V = 512
#: Smallest tile Triton's tl.dot and the kernel's power-of-two tensors take along one dim.
MIN_DOT_DIM = 16
#: Bytes per L2 line (the kernel's prefetch step).
L2_LINE = 128


@dataclass(frozen=True)
class RecordGeometry:
    """The constexprs a decode kernel reads a ``kv_format`` page with (``block_size`` tokens per page)."""

    kv_format: str
    d_qk: int
    block_size: int
    quant_dims: int  #: FP8 dims at the start of the K row
    scale_tile: int  #: dims per scale
    num_scales: int  #: scales per token (quant_dims / scale_tile)
    scales_fp32: bool  #: fp32 scales (else one UE8M0 exponent byte each)
    v_rope_dims: int  #: RoPE dims inside V (D_V - quant_dims)
    k_extra_dims: int  #: RoPE dims in K only (d_qk - D_V)
    data_slot_bytes: int
    scale_base: int
    scale_slot_bytes: int
    rope_offset: int  #: RoPE bytes after the slot's data row start
    data_span_bytes: int  #: bytes from the data row start that hold the token's data (per token: its whole record)
    scales_in_span: bool  #: the scales lie inside that span (per-token records)
    packed_page_bytes: int  #: the smallest page stride the cache may have

    @classmethod
    def of(cls, fmt: KvRecordFormat, block_size: int) -> RecordGeometry:
        if fmt.value_dtype != "e4m3" or fmt.scale_dtype not in ("fp32", "ue8m0"):
            raise ValueError(f"{fmt.kv_format}: the decode kernel reads e4m3 values with fp32 or UE8M0 scales, "
                             f"not {fmt.value_dtype} with {fmt.scale_dtype}")
        if fmt.layout == "per_token":
            data_slot, scale_base, scale_slot = fmt.bytes_per_token, fmt.value_bytes, fmt.bytes_per_token
            rope_offset, span, scales_in_span = fmt.value_bytes + fmt.scale_bytes, fmt.bytes_per_token, True
        else:
            data_slot, scale_base, scale_slot = fmt.data_row_bytes, block_size * fmt.data_row_bytes, fmt.scale_bytes
            rope_offset, span, scales_in_span = fmt.value_bytes, fmt.data_row_bytes, False
        geometry = cls(
            kv_format=fmt.kv_format, d_qk=fmt.d_qk, block_size=block_size, quant_dims=fmt.quant_dims,
            scale_tile=fmt.scale_tile, num_scales=fmt.num_scales, scales_fp32=fmt.scale_dtype == "fp32",
            v_rope_dims=D_V - fmt.quant_dims, k_extra_dims=fmt.d_qk - D_V, data_slot_bytes=data_slot,
            scale_base=scale_base, scale_slot_bytes=scale_slot, rope_offset=rope_offset, data_span_bytes=span,
            scales_in_span=scales_in_span, packed_page_bytes=fmt.packed_page_bytes(block_size),
        )  # fmt: skip
        geometry.check(fmt)
        return geometry

    def check(self, fmt: KvRecordFormat) -> None:
        """The kernel's arithmetic against the descriptor's own offsets and widths (AssertionError names the field)."""
        assert self.quant_dims == fmt.value_bytes, f"{fmt.kv_format}: one byte per FP8 value"
        assert self.quant_dims + fmt.rope_dims == self.d_qk, f"{fmt.kv_format}: K row = FP8 dims + RoPE dims"
        assert 0 <= self.v_rope_dims <= fmt.rope_dims, f"{fmt.kv_format}: V = the first {D_V} dims of the K row"
        assert self.v_rope_dims + max(self.k_extra_dims, 0) == fmt.rope_dims, f"{fmt.kv_format}: RoPE dims split between V and K"
        assert self.k_extra_dims >= 0, f"{fmt.kv_format}: d_qk {self.d_qk} < value width {D_V}"
        assert self.k_extra_dims in (0, fmt.rope_dims) and (self.k_extra_dims == 0 or self.k_extra_dims >= MIN_DOT_DIM), \
            f"{fmt.kv_format}: K-only RoPE dims must be all of them, and a tl.dot width"
        assert D_V % self.scale_tile == 0 and self.quant_dims % self.scale_tile == 0, f"{fmt.kv_format}: scale tiles tile the FP8 dims"
        assert self.num_scales * self.scale_tile == self.quant_dims
        assert fmt.scale_bytes >= self.num_scales * fmt.scale_element_bytes
        for slot in {0, self.block_size - 1}:
            at = fmt.offsets(slot, self.block_size)
            assert at["data"] == slot * self.data_slot_bytes, f"{fmt.kv_format}: data offset of slot {slot}"
            assert at["scales"] == self.scale_base + slot * self.scale_slot_bytes, f"{fmt.kv_format}: scale offset of slot {slot}"
            if fmt.rope_dims:
                assert at["rope"] == at["data"] + self.rope_offset, f"{fmt.kv_format}: RoPE offset of slot {slot}"
                assert self.rope_offset + fmt.rope_bytes <= self.data_span_bytes, f"{fmt.kv_format}: RoPE inside the data span"
            if self.scales_in_span:
                assert at["data"] <= at["scales"] < at["data"] + self.data_span_bytes, f"{fmt.kv_format}: scales inside the span"

    @property
    def num_scale_tiles(self) -> int:
        """Scale tiles across the D_V main dims (V4: 8, the last covering RoPE dims that take no scale)."""
        return D_V // self.scale_tile

    @property
    def prefetch_points(self) -> int:
        """Addresses per token that touch every 128-byte line of its data span, from any start
        (a power of two: a Triton tensor width)."""
        points = 1
        while points < -(-self.data_span_bytes // L2_LINE) + 1:
            points *= 2
        return points

    def constexprs(self) -> dict[str, object]:
        return {
            "BLOCK_SIZE": self.block_size, "QUANT_DIMS": self.quant_dims, "SCALE_TILE": self.scale_tile,
            "NUM_SCALES": self.num_scales, "SCALES_FP32": self.scales_fp32, "V_ROPE_DIMS": self.v_rope_dims,
            "K_EXTRA_DIMS": self.k_extra_dims, "DATA_SLOT_BYTES": self.data_slot_bytes, "SCALE_BASE": self.scale_base,
            "SCALE_SLOT_BYTES": self.scale_slot_bytes, "ROPE_OFFSET": self.rope_offset, "DATA_SPAN_BYTES": self.data_span_bytes,
            "SCALES_IN_SPAN": self.scales_in_span, "PREFETCH_POINTS": self.prefetch_points,
        }  # fmt: skip
