"""The paged FP8 KV record layouts the kernels read and write: the part of dsa-bench's descriptors they need.

A copy of what ``dsa_bench.definitions.kv_records`` says about the V3.2, V4 and V4.1 MLA records
and the indexer's DeepGEMM key page (widths, layout, scale type and tile, offsets inside a page),
kept here so that the solution, packed into flashinfer-bench Solution JSON, imports nothing from
dsa-bench. tests/solutions/test_triton_layout.py checks every field, property and offset against
dsa-bench's descriptors, so the two cannot drift apart. The reference writer and reader, the cache
views and the block-geometry check stay in dsa-bench: no kernel needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FP8_E4M3_MAX = 448.0
#: Smallest amax (source convention) or scale (raw convention); keeps all-zero tiles finite.
MIN_FP8_SCALE = 1e-4
UE8M0_BIAS = 127


@dataclass(frozen=True)
class KvRecordFormat:
    """One paged KV record layout (the fields of dsa-bench's descriptor that the kernels read).

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
    pad_byte: int | None  #: the writer's value for scale pad bytes (None: there are none)
    block_size: int | None = None  #: fixed tokens per page (the indexer page), else None

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

    def _bs(self, block_size: int | None) -> int:
        bs = block_size if block_size is not None else self.block_size
        if bs is None or bs < 1:
            raise ValueError(f"{self.kv_format}: a block size >= 1 is needed, got {block_size}")
        if self.block_size is not None and bs != self.block_size:
            raise ValueError(f"{self.kv_format}: the page holds exactly {self.block_size} tokens, got block size {bs}")
        return bs

    def offsets(self, slot: int, block_size: int | None = None) -> dict[str, int]:
        """Byte offsets inside a page of slot ``slot``'s values, scales and RoPE (-1: none stored)."""
        bs = self._bs(block_size)
        if not 0 <= slot < bs:
            raise ValueError(f"{self.kv_format}: slot {slot} outside a page of {bs} tokens")
        if self.layout == "per_token":
            base = slot * self.bytes_per_token
            data, scales, rope = base, base + self.value_bytes, base + self.value_bytes + self.scale_bytes
        else:
            data = slot * self.data_row_bytes
            scales, rope = bs * self.data_row_bytes + slot * self.scale_bytes, data + self.value_bytes
        return {"data": data, "scales": scales, "rope": rope if self.rope_dims else -1}

    def packed_page_bytes(self, block_size: int | None = None) -> int:
        return self._bs(block_size) * self.bytes_per_token


V32 = KvRecordFormat("V32", 576, "per_token", 512, 512, "e4m3", "fp32", 128, 16, 64, pad_byte=None)
V4 = KvRecordFormat("V4", 512, "per_page", 448, 448, "e4m3", "ue8m0", 64, 8, 64, pad_byte=0)
V41 = KvRecordFormat("V41", 512, "per_page", 512, 512, "e4m3", "ue8m0", 32, 16, 0, pad_byte=None)
#: DeepGEMM's paged indexer keys: 64 rows of 128 e4m3 values, then 64 fp32 scales.
INDEXER_KEY_PAGE = KvRecordFormat("INDEXER", 128, "per_page", 128, 128, "e4m3", "fp32", 128, 4, 0, pad_byte=None, block_size=64)

#: The formats the kernels take, by name.
FORMATS: dict[str, KvRecordFormat] = {f.kv_format: f for f in (V32, V4, V41, INDEXER_KEY_PAGE)}
