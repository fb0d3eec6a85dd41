"""FlashMLA's sparse FP8 decode (``sgl-flash-mla`` 1.0.0) as a dsa-bench peer; it returns its outputs.

Each entry calls ``flash_mla.flash_mla_with_kvcache(q, kv_cache, None, None, 512, meta, softmax_scale=sm_scale,
is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink, [topk_length=...,] use_legacy=True, kv_format=...)``
(BRIEF §2.4) on the definition's own inputs, which meet FlashMLA's asserts (topk a multiple of 64, page
strides multiples of the TMA stride, a 16-byte aligned base, no index outside the cache) except the head
count: ``h_q`` 64 and 128 run as they are; 16 and 32 (a TP8 or TP4 GPU's share of 128 heads) are padded
to 64 the way serving engines do (:mod:`heads`: zero queries and -inf sinks for the padded heads, the
first ``h_q`` heads of out and lse returned as views), so the padding copy and the 4x (2x) work are
inside the timed call, as they are in serving. V3.2 gets no ``topk_length`` (the definition has none:
short rows are -1 padding).

Schedule metadata: ``flash_mla.get_mla_metadata()`` returns an empty schedule that FlashMLA fills during
the first call that uses it; it may be reused only while the shapes and the ``topk_length`` values stay
the same. :class:`Schedules` keeps one per (format, shapes, strides, ``topk_length`` tensor): the
``topk_length`` tensor is recognised by identity and version counter (a weak reference, so a new tensor at
a recycled address never inherits an old schedule, and an in-place change invalidates it), never by
reading its values (that would synchronize inside the timed call). The harness builds each input set once
per trial and warms up before timing, so with ``warmup >= input_sets`` every timed call reuses a schedule
and the metadata computation stays outside the timed span (like serving, where one schedule serves every
layer of a decoding step). The shipped workloads all have warmup >= input_sets.

FlashMLA returns fresh tensors, so the entries return them (``destination_passing_style: false``) as a
serving engine uses them: ``out``, and its lse ([b, h_q, s_q] in this wheel) as a transposed view in the
definition's [b, s_q, h_q]; no copy is added to the timed call.
"""

from __future__ import annotations

import weakref
from importlib import metadata
from typing import Any

import flash_mla
import torch

from .heads import flashmla_heads, pad_heads, slice_heads

D_V = 512


class Schedules:
    """FlashMLA schedule metadata, one per call signature (see the module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[weakref.ref | None, int, Any]] = {}

    def get(self, kv_format: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
            topk_length: torch.Tensor | None) -> Any:
        key = (kv_format, q.device, tuple(q.shape), tuple(kv_cache.shape), tuple(kv_cache.stride()), tuple(indices.shape),
               None if topk_length is None else id(topk_length))
        found = self._entries.get(key)
        if found is not None:
            owner, version, meta = found
            if topk_length is None or (owner is not None and owner() is topk_length and topk_length._version == version):
                return meta
        self._entries = {k: v for k, v in self._entries.items() if v[0] is None or v[0]() is not None}
        meta, _ = flash_mla.get_mla_metadata()
        owner = None if topk_length is None else weakref.ref(topk_length)
        self._entries[key] = (owner, 0 if topk_length is None else topk_length._version, meta)
        return meta

    def __len__(self) -> int:
        return len(self._entries)


SCHEDULES = Schedules()


def _decode(kv_format: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
            attn_sink: torch.Tensor, topk_length: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q = q.shape[:3]
    heads = flashmla_heads(h_q)
    if heads != h_q:  # 16 or 32 heads: padded to 64, as serving engines call FlashMLA
        q, attn_sink = pad_heads(q, attn_sink, heads)
    meta = SCHEDULES.get(kv_format, q, kv_cache, indices, topk_length)
    lengths = {} if topk_length is None else {"topk_length": topk_length}
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, kv_cache, None, None, D_V, meta, softmax_scale=float(sm_scale), is_fp8_kvcache=True, indices=indices,
        attn_sink=attn_sink, use_legacy=True, kv_format=kv_format, **lengths,
    )
    # this wheel returns lse as [b, heads, s_q]: the definition's [b, s_q, heads] is a transposed view (no copy)
    if tuple(lse.shape) == (b, heads, s_q) and s_q != heads:
        lse = lse.transpose(1, 2)
    return slice_heads(out, lse, h_q) if heads != h_q else (out, lse)


def decode_v32(q, kv_cache, indices, sm_scale, attn_sink) -> tuple[torch.Tensor, torch.Tensor]:
    return _decode("V32", q, kv_cache, indices, sm_scale, attn_sink, None)


def decode_v4(q, kv_cache, indices, sm_scale, attn_sink, topk_length) -> tuple[torch.Tensor, torch.Tensor]:
    return _decode("V4", q, kv_cache, indices, sm_scale, attn_sink, topk_length)


def solution_notes() -> str:
    try:
        version = metadata.version("sgl-flash-mla")
    except metadata.PackageNotFoundError:
        version = "unknown (no distribution metadata)"
    return (f"flash_mla {version} from {flash_mla.__file__}; legacy SM90 path (use_legacy=True); schedule metadata "
            "from the first call per input set (outside the timed span when warmup >= input_sets); out and lse returned "
            "as FlashMLA makes them (no copy in the timed call); h_q 16 and 32 padded to 64 heads as serving engines do "
            "(zero queries, -inf sinks for the padded heads; the copy and 4x / 2x the work are in the timed call), the "
            "first h_q heads of out and lse returned as views")
