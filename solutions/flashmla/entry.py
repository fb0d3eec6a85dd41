"""FlashMLA's sparse FP8 decode (``sgl-flash-mla`` 1.0.0) as a dsa-bench peer; it returns its outputs.

Each entry calls ``flash_mla.flash_mla_with_kvcache(q, kv_cache, None, None, 512, meta, softmax_scale=sm_scale,
is_fp8_kvcache=True, indices=indices, attn_sink=attn_sink, [topk_length=...,] use_legacy=True, kv_format=...)``
(BRIEF §2.4) on the definition's own inputs, which meet FlashMLA's asserts (topk a multiple of 64, page
strides multiples of the TMA stride, a 16-byte aligned base, no index outside the cache) except the head
count: ``h_q`` 64 and 128 run as they are; 16 and 32 (a TP8 or TP4 GPU's share of 128 heads) are padded
to 64 the way serving engines do (:mod:`heads`: zero queries and -inf sinks for the padded heads, the
first ``h_q`` heads of out and lse returned as views), so the padding copy and the 4x (2x) work are
inside the timed call, as they are in serving. On a GPU a padded call's copies and FlashMLA call are replayed
as one CUDA graph per argument set (:class:`PaddedGraphs`), as a serving engine's decode graph holds them.
V3.2 gets no ``topk_length`` (the definition has none: short rows are -1 padding).

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
from collections import OrderedDict
from dataclasses import dataclass
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


def _flash(kv_format: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
           attn_sink: torch.Tensor, topk_length: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One FlashMLA call on 64 or 128 heads: ``out [b, s_q, heads, 512]`` and ``lse [b, s_q, heads]`` (a view)."""
    b, s_q, heads = q.shape[:3]
    meta = SCHEDULES.get(kv_format, q, kv_cache, indices, topk_length)
    lengths = {} if topk_length is None else {"topk_length": topk_length}
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, kv_cache, None, None, D_V, meta, softmax_scale=float(sm_scale), is_fp8_kvcache=True, indices=indices,
        attn_sink=attn_sink, use_legacy=True, kv_format=kv_format, **lengths,
    )
    # this wheel returns lse as [b, heads, s_q]: the definition's [b, s_q, heads] is a transposed view (no copy)
    if tuple(lse.shape) == (b, heads, s_q) and s_q != heads:
        lse = lse.transpose(1, 2)
    return out, lse


def _tensor_key(t: torch.Tensor | None) -> tuple:
    if t is None:
        return (None,)
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t.data_ptr())


@dataclass
class _PaddedCall:
    """The 64-head buffers of one argument set, and once captured, its graph and FlashMLA's static outputs."""

    q: torch.Tensor
    sink: torch.Tensor
    topk_owner: weakref.ref | None = None  # the topk_length tensor whose values the captured schedule was made for
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None


class PaddedGraphs:
    """Padded calls (16 or 32 heads) on a GPU, replayed as one CUDA graph per argument set.

    Serving engines run the decode step inside CUDA graphs, so the head padding costs them two copy
    kernels and 4x (2x) the attention, not host time. Launched eagerly from Python, FlashMLA's own host
    prologue (argument checks, output allocation) would run between the padding copies and its kernels
    and land inside the measured span (about 100 µs at b = 1 on an H100, five times the kernels). So the
    copies into persistent 64-head buffers and the FlashMLA call are captured together, as an engine's
    graph holds them. Keyed by every tensor's address, shape, stride and dtype, by ``topk_length``'s
    version counter (its schedule is only valid while its values are) and by ``sm_scale``; a replay
    re-reads the inputs' memory, so every call computes afresh. The first call of a key runs eagerly
    (FlashMLA fills its schedule then, which a capture cannot); if a capture fails, every later call runs
    eagerly and ``disabled_reason`` (shown in the notes) says why. An argument set is found again only with
    the very ``topk_length`` tensor it was made for (a weak reference): a new tensor that inherits a dead
    one's address, shape and version counter (the allocator reuses memory between input sets) would
    otherwise replay a graph that holds the old values' schedule (the likely cause of zeros seen on an H100
    in a V4 16-head case's first timed call of its second trial).
    """

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self.calls: OrderedDict[tuple, _PaddedCall] = OrderedDict()
        self.pool: Any = None
        self.disabled_reason: str | None = None

    def __call__(self, kv_format: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                 attn_sink: torch.Tensor, topk_length: torch.Tensor | None, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        h_q = q.shape[2]
        key = (kv_format, float(sm_scale), heads, *(_tensor_key(t) for t in (q, kv_cache, indices, attn_sink, topk_length)),
               None if topk_length is None else topk_length._version)
        call = self.cached(key, topk_length)
        if call is None or self.disabled_reason is not None:
            padded_q, padded_sink = pad_heads(q, attn_sink, heads)
            if self.disabled_reason is None:
                owner = None if topk_length is None else weakref.ref(topk_length)
                self.calls[key] = _PaddedCall(padded_q, padded_sink, owner)
                while len(self.calls) > self.capacity:
                    self.calls.popitem(last=False)
            return slice_heads(*_flash(kv_format, padded_q, kv_cache, indices, sm_scale, padded_sink, topk_length), h_q)
        self.calls.move_to_end(key)
        if call.graph is None:
            try:
                self.pool = self.pool or torch.cuda.graph_pool_handle()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    call.q[:, :, :h_q].copy_(q)
                    call.sink[:h_q].copy_(attn_sink)
                    call.out, call.lse = _flash(kv_format, call.q, kv_cache, indices, sm_scale, call.sink, topk_length)
            except Exception as exc:  # reported in the notes, then eager for good
                self.disabled_reason = f"{type(exc).__name__}: {exc}"
                self.calls.clear()
                return self(kv_format, q, kv_cache, indices, sm_scale, attn_sink, topk_length, heads)
            call.graph = graph
        call.graph.replay()
        assert call.out is not None and call.lse is not None
        return slice_heads(call.out, call.lse, h_q)

    def cached(self, key: tuple, topk_length: torch.Tensor | None) -> _PaddedCall | None:
        """The padded call of ``key``, unless it was made for another ``topk_length`` tensor (then it is dropped)."""
        call = self.calls.get(key)
        if call is not None and topk_length is not None and (call.topk_owner is None or call.topk_owner() is not topk_length):
            del self.calls[key]
            return None
        return call


PADDED = PaddedGraphs()


def _decode(kv_format: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
            attn_sink: torch.Tensor, topk_length: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    h_q = q.shape[2]
    heads = flashmla_heads(h_q)
    if heads == h_q:
        return _flash(kv_format, q, kv_cache, indices, sm_scale, attn_sink, topk_length)
    # 16 or 32 heads: padded to 64, as serving engines call FlashMLA (inside a graph on a GPU)
    if q.is_cuda and not torch.cuda.is_current_stream_capturing():
        return PADDED(kv_format, q, kv_cache, indices, sm_scale, attn_sink, topk_length, heads)
    padded_q, padded_sink = pad_heads(q, attn_sink, heads)
    return slice_heads(*_flash(kv_format, padded_q, kv_cache, indices, sm_scale, padded_sink, topk_length), h_q)


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
            "first h_q heads of out and lse returned as views; on a GPU the padding copies and FlashMLA's call are "
            "replayed as one CUDA graph per argument set, as an engine's decode graph holds them"
            + (f" (graphs off: {PADDED.disabled_reason})" if PADDED.disabled_reason else ""))
