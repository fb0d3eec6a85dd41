"""Byte layouts of paged KV records, as descriptor objects instead of scattered magic numbers.

Only the lightning indexer's key page (DeepGEMM paged layout) is defined so far. A layout owns
its sizes and the zero-copy views that split a raw page into its parts, and checks its own
alignment invariants when constructed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_E4M3_MAX = 448.0
#: Smallest per-token scale; keeps all-zero keys from producing a zero (or denormal) scale.
MIN_FP8_SCALE = 1e-4
#: An e4m3 byte that decodes to NaN; used to poison cache bytes no case may read.
FP8_NAN_BYTE = 0x7F


@dataclass(frozen=True)
class IndexerKeyPageLayout:
    """DeepGEMM paged layout of FP8 indexer keys.

    One page holds ``page_size`` tokens: first all tokens' ``head_dim`` FP8 values, token-major,
    then ``page_size`` float32 scales, one per token. Values and scales are *not* interleaved per
    token; the ``[num_pages, page_size, 1, head_dim + 4]`` tensor shape is only a view.
    """

    page_size: int = 64
    head_dim: int = 128
    scale_bytes: int = 4

    def __post_init__(self) -> None:
        assert self.values_bytes % 16 == 0, "value block must stay 16-byte aligned for vector loads"
        assert self.page_bytes % self.scale_bytes == 0

    @property
    def values_bytes(self) -> int:
        return self.page_size * self.head_dim

    @property
    def page_bytes(self) -> int:
        return self.page_size * (self.head_dim + self.scale_bytes)

    @property
    def bytes_per_token(self) -> int:
        return self.head_dim + self.scale_bytes

    def cache_shape(self, num_pages: int) -> tuple[int, int, int, int]:
        return (num_pages, self.page_size, 1, self.bytes_per_token)

    def raw_pages(self, cache: torch.Tensor) -> torch.Tensor:
        """``[num_pages, page_bytes]`` uint8 view of a cache tensor of any byte dtype."""
        if cache.element_size() != 1 or not cache.is_contiguous():
            raise ValueError("the indexer key cache must be a contiguous 1-byte tensor")
        return cache.view(torch.uint8).reshape(cache.shape[0], self.page_bytes)

    def values(self, cache: torch.Tensor) -> torch.Tensor:
        """Zero-copy ``[num_pages, page_size, head_dim]`` float8_e4m3fn view of the values."""
        raw = self.raw_pages(cache)
        n = raw.shape[0]
        return raw[:, : self.values_bytes].view(torch.float8_e4m3fn).view(n, self.page_size, self.head_dim)

    def scales(self, cache: torch.Tensor) -> torch.Tensor:
        """Zero-copy ``[num_pages, page_size]`` float32 view of the per-token scales."""
        return self.raw_pages(cache)[:, self.values_bytes :].view(torch.float32)

    def empty_cache(self, num_pages: int, device: torch.device) -> torch.Tensor:
        """A cache whose every value byte is FP8 NaN and every scale is float32 NaN."""
        cache = torch.full((num_pages, self.page_bytes), FP8_NAN_BYTE, dtype=torch.uint8, device=device)
        self.scales(cache).fill_(float("nan"))
        return cache.view(torch.int8).view(self.cache_shape(num_pages))


INDEXER_KEY_PAGE = IndexerKeyPageLayout()


def quantize_fp8_per_token(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 quantisation with scale ``amax/448`` (clamped >= 1e-4).

    ``keys`` is ``[n, d]`` float; returns (``[n, d]`` float8_e4m3fn values, ``[n]`` float32 scales).
    """
    amax = keys.abs().amax(dim=-1).float()
    scales = (amax / FP8_E4M3_MAX).clamp_min(MIN_FP8_SCALE)
    values = (keys.float() / scales[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scales
