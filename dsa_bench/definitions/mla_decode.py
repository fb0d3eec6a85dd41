"""FlashMLA-style sparse decode over paged FP8 KV records (BRIEF §2.4): ``dsa_mla_decode_{v32,v4,v41}_fp8``.

One code path, parametrized by the record format (:mod:`dsa_bench.definitions.kv_records`' ``V32``, ``V4``
and ``V41`` descriptors; nothing here knows a record width). Per query row ``(b, s)`` and head ``h``, over
the row's *counted* entries (``indices[b, s, j] >= 0`` and, for V4/V4.1, ``j < topk_length[b]``)::

    K_j    = the dequantized record at physical id indices[b, s, j] = block * block_size + offset  (fp32)
    logit  = (q[b, s, h] · K_j) · sm_scale                  over all d_qk dims (V3.2 512 + 64, V4/V4.1 512)
    lse    = ln Σ_j exp(logit_j)                            natural log
    out    = Σ_j softmax_j · V_j · 1 / (1 + exp(attn_sink[h] - lse)),   V_j = K_j[:512]

``V`` is the first 512 dims of the dequantized row, FlashMLA's convention (its reference multiplies the
probabilities by ``gathered_kv[..., :d_v]`` with ``d_v = 512``): for V3.2 the 512 NoPE dims (the 64 RoPE
dims only enter the logits); for V4 the 448 NoPE dims and the 64 (rotated) RoPE dims; for V4.1 all 512
quantized dims. The sink scales ``out`` by ``exp(lse) / (exp(lse) + exp(sink))`` and leaves ``lse`` alone;
``attn_sink`` is always an input, ``-inf`` for a head means no sink (a "sink off" case gives all ``-inf``).
A row with no counted entry has ``out`` exactly 0 and ``lse`` exactly ``+inf`` (FlashMLA's convention).

Inputs, in order: ``q [b, s_q, h_q, d_qk] bf16``; ``kv_cache [num_blocks, block_size, 1, bytes_per_token]
uint8`` with ``stride(1) == bytes_per_token`` and a page stride ``stride(0) = page_bytes`` that may exceed
``block_size * bytes_per_token`` (the tensor is then a view of a ``[num_blocks, page_bytes]`` backing; the
V4 and V4.1 pages are structure-of-arrays pages whose shape "lies", as in FlashMLA); ``indices [b, s_q, topk]
int32`` (-1 invalid, anywhere in the row; never any other value outside ``[0, num_blocks * block_size)``);
``sm_scale``; ``attn_sink [h_q] f32``; for V4/V4.1 only ``topk_length [b] int32`` (entries ``j >=
topk_length[b]`` are ignored, whatever they hold). Outputs ``out [b, s_q, h_q, 512] bf16`` and ``lse
[b, s_q, h_q] f32``. Legal shapes: ``h_q`` 16, 32, 64 or 128 (FlashMLA's 64 and 128, and the heads per
GPU of a 128-head model under tensor parallelism over 8 or 4 GPUs, which serving engines pad to 64 for
FlashMLA), ``s_q`` 1 to 4 (the next token and up to three MTP drafts), and FlashMLA's SM90 asserts:
``topk`` a multiple of 64, the page stride a multiple of the format's TMA stride, ``num_blocks *
page_bytes / tma_stride <= INT32_MAX``.

Generated inputs (:func:`_Decode.generate`): ``q`` is N(0, 1) in bf16; each row draws ``min(topk, s_k)``
distinct positions of its sequence's ``s_k`` context tokens (fewer for ``short_rows``, none for
``empty_rows``); the ``s_q`` rows of one sequence share tokens where their positions meet. A token's
physical slot is drawn at random from the whole cache (the contract lets indices map sequences to any
pages), so the cache holds only the slots some index points to, at the occupancy the trace's
``num_blocks`` gives, instead of ``b * s_k`` tokens: the production case b=128, s_k=32768 needs 688 MB of
V3.2 pages at 50 % occupancy, not 2.75 GB. The first and last slot of pages 0, 1, the middle one and
the last one are always used (indices at page boundaries). Records are random N(0, 1) rows quantized by
the descriptors' writer with FlashMLA's power-of-two scales (``"flashmla"``; FlashMLA's SM90 kernel casts
V3.2's fp32 scales to bf16, exact only for powers of two); they are written only at slots a counted
entry points to. Every other byte is NaN-producing: e4m3 0x7F in the values, bf16 NaN in the RoPE
dims, fp32 NaN or UE8M0 0xFF in the scales, so a kernel that reads a wrong slot, a wrong page, or an
entry past ``topk_length`` produces NaN and fails. ``attn_sink`` is ``ln(min(topk, s_k)) + 2·N(0, 1)``
per head, about the rows' lse so the sink visibly matters, with a quarter of the heads ``-inf``; with
``off`` every head ``-inf``; with ``value`` every head that number (any float32-finite value: the
extreme-sink cases use 1e4, -1e4, 88.8, 1e30 and 3e38, past where a log2-domain sink overflows).

Checks (:func:`check`; docs/checks.md): a row is empty when its indices count no entry, and then holds out exactly 0
and lse exactly +inf. Elsewhere ``out`` is compared element-wise with ``atol``/``rtol`` (an element fails only when
``|diff| > atol`` and ``|diff| > rtol·|ref|``) and row by row: each (batch, query, head) row's largest |diff| against
one bf16 ulp of the row's largest value plus 6 sigma of the error bf16-rounded probabilities leave
(:func:`dsa_bench.definitions.checks.row_tolerances`; the reference computes each row's noise scale in :func:`expect`),
so an ``out`` 2 % small on long rows fails where atol = 1e-2 passed it. ``lse`` is compared with the absolute
``lse_atol`` alone; the decode's own default is :data:`LSE_ATOL` = 1e-4 (natural log), 12 times the derived error of
correct kernels at the contest's scale and 4.9 times below the shift of one of 2048 equal slots left out.
:data:`MAX_SM_SCALE` bounds ``sm_scale`` at validation. docs/mla_decode.md has the measurements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from dsa_bench.definitions.base import (
    Definition,
    InputRng,
    TensorSpec,
    Tolerance,
    Value,
    integer_param,
    is_finite_number,
    unknown_params,
)
from dsa_bench.definitions.checks import compare_close, compare_rows, row_tolerances, worst
from dsa_bench.definitions.kv_records import (
    FP8_NAN_BYTE,
    INT32_MAX,
    V4,
    V32,
    V41,
    KvRecordFormat,
    ScaleConvention,
)
from dsa_bench.definitions.status import CheckResult, Status

D_V = 512
#: Query heads per GPU: FlashMLA's 64 and 128, and the 16 and 32 of a 128-head model under tensor
#: parallelism over 8 and 4 GPUs (the ``flashmla`` peer pads those to 64, as serving engines do).
HEAD_COUNTS = (16, 32, 64, 128)
#: Query tokens per sequence: 1, or the next token plus up to 3 multi-token-prediction drafts.
MAX_S_Q = 4
TOPK_MULTIPLE = 64
SCALE_CONVENTION: ScaleConvention = "flashmla"
#: A UE8M0 scale byte that decodes to NaN (2^128 in kernels that build the float from the byte).
UE8M0_NAN_BYTE = 255
#: Generated sinks: ln(valid slots) + SINK_SPREAD·N(0, 1); this fraction of the heads gets -inf (no sink).
SINK_SPREAD = 2.0
SINK_OFF_FRACTION = 0.25
#: The reference gathers and dequantizes this many bytes of K rows at a time (rows of the batch in chunks).
REFERENCE_CHUNK_BYTES = 256 * 2**20
#: Records quantized and written per step while building a cache.
WRITE_CHUNK_TOKENS = 65536
PADDINGS = ("tail", "scattered")
#: The largest softmax scale a case may give. A head of d dims is scaled by d^-0.5 (0.042 for V3.2's 512 + 64,
#: 0.044 for V4's 512); 1.0 already makes unit-variance logits 24 times wider. Far above, float32 logits
#: overflow (from about 1e37 the lse is +inf) and no tolerance tells rounding from a defect.
MAX_SM_SCALE = 1.0
#: The decode's lse tolerance (natural log), derived in docs/checks.md: correct kernels stay within about
#: 1e-6 of |lse| (<= 8.3e-6 at the contest scale's largest |lse|, 8.3), while leaving out one of 2048
#: equal slots moves the lse by ln(2048/2047) = 4.9e-4.
LSE_ATOL = 1.0e-4


# --------------------------------------------------------------------------- reference


def counted(indices: torch.Tensor, topk_length: torch.Tensor | None) -> torch.Tensor:
    """Which entries of ``indices`` [b, s_q, topk] take part: >= 0 and, with ``topk_length``, left of it."""
    mask = indices >= 0
    if topk_length is not None:
        columns = torch.arange(indices.shape[-1], device=indices.device)
        mask &= columns[None, None, :] < topk_length.to(indices.device).long()[:, None, None]
    return mask


def page_problems(fmt: KvRecordFormat, page: int, blocks: int, block_size: int) -> list[str]:
    """What is wrong with a cache of ``blocks`` pages of ``page`` bytes holding ``block_size`` records each, by
    FlashMLA's SM90 asserts: at least the packed page, a multiple of the TMA stride, and an int32 row count."""
    problems = []
    packed = fmt.packed_page_bytes(block_size)
    if page < packed:
        problems.append(f"axes.page_bytes = {page} is below the packed {fmt.kv_format} page of block size {block_size} ({packed} B)")
    if page % fmt.tma_stride:
        problems.append(f"axes.page_bytes = {page} must be a multiple of the {fmt.kv_format} TMA stride {fmt.tma_stride} B")
    elif blocks * (page // fmt.tma_stride) > INT32_MAX:
        problems.append(f"axes.num_blocks = {blocks} pages of {page // fmt.tma_stride} TMA rows exceed the int32 bound {INT32_MAX}")
    return problems


class _ExactFloat32Matmul:
    """float32 matmuls without TF32 while the reference runs (a caller may have enabled it)."""

    def __enter__(self) -> None:
        self.previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.previous)


def attend(fmt: KvRecordFormat, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
           attn_sink: torch.Tensor, topk_length: torch.Tensor | None = None,
           dtype: torch.dtype = torch.float32, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` in ``dtype``, unrounded, on the inputs' device: rows of the batch in chunks of about
    :data:`REFERENCE_CHUNK_BYTES` of gathered K (no per-row loop); records read and dequantized through
    ``fmt``'s descriptor. ``dtype`` float64 gives the exact answer measurements compare against.

    ``noise``, a ``[b, s_q, h_q]`` float32 tensor, receives each row's ``max_d sqrt(Σ_j w_j² V_jd²)`` (w the
    softmax weights times the sink's factor): the scale of the error bf16-rounded probabilities leave in
    ``out`` (:func:`dsa_bench.definitions.checks.row_tolerances`); 0 on an empty row."""
    b, s_q, h_q, d_qk = q.shape
    topk, block_size = indices.shape[-1], kv_cache.shape[1]
    rows = b * s_q
    mask = counted(indices, topk_length).reshape(rows, topk)
    ids = indices.reshape(rows, topk).long().clamp_min(0)
    queries = q.reshape(rows, h_q, d_qk)
    out = torch.zeros(rows, h_q, D_V, dtype=dtype, device=q.device)
    lse = torch.full((rows, h_q), float("inf"), dtype=dtype, device=q.device)
    sink = attn_sink.to(device=q.device, dtype=dtype)
    step = max(1, REFERENCE_CHUNK_BYTES // (topk * d_qk * dtype.itemsize))
    with torch.no_grad(), _ExactFloat32Matmul():
        for start in range(0, rows, step):
            part = slice(start, min(rows, start + step))
            keep = mask[part]
            if not bool(keep.any()):
                continue
            n = keep.shape[0]
            k = fmt.dequantize(fmt.read(kv_cache, block_size, ids[part].reshape(-1))).to(dtype).reshape(n, topk, d_qk)
            k = torch.where(keep[:, :, None], k, 0.0)  # unused entries read some record; never let it in
            logits = torch.einsum("rhd,rtd->rht", queries[part].to(dtype), k) * float(sm_scale)
            logits = logits.masked_fill(~keep[:, None, :], float("-inf"))
            row_lse = torch.logsumexp(logits, dim=-1)  # -inf where a row counts nothing
            has = keep.any(dim=-1)[:, None]  # (NaN in a record stays NaN; only a row without entries is empty)
            probs = torch.exp(logits - torch.where(has, row_lse, 0.0)[..., None])
            probs = torch.where(keep[:, None, :], probs, 0.0)
            values = torch.einsum("rht,rtd->rhd", probs, k[:, :, :D_V])
            # 1 / (1 + exp(sink - lse)); a -inf sink is exactly 1 (sigmoid(inf - inf) would be NaN)
            scale = torch.where(torch.isneginf(sink), 1.0, torch.sigmoid(row_lse - sink))
            out[part] = torch.where(has[..., None], values * scale[..., None], 0.0)
            lse[part] = torch.where(has, row_lse, float("inf"))
            if noise is not None:
                spread = torch.einsum("rht,rtd->rhd", probs.square(), k[:, :, :D_V].square()).sqrt().amax(dim=-1)
                noise.view(rows, h_q)[part] = torch.where(has, spread * scale, 0.0).float()
    return out.reshape(b, s_q, h_q, D_V), lse.reshape(b, s_q, h_q)


def decode(fmt: KvRecordFormat, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
           attn_sink: torch.Tensor, topk_length: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The reference: :func:`attend` in float32, ``out`` rounded to bf16."""
    out, lse = attend(fmt, q, kv_cache, indices, sm_scale, attn_sink, topk_length)
    return {"out": out.to(torch.bfloat16), "lse": lse}


def expect(fmt: KvRecordFormat, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
           attn_sink: torch.Tensor, topk_length: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """What :func:`check` compares against: the reference's ``out`` and ``lse``, and ``out_noise``, each row's
    scale of the bf16-probability error (:func:`attend`'s ``noise``)."""
    noise = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
    out, lse = attend(fmt, q, kv_cache, indices, sm_scale, attn_sink, topk_length, noise=noise)
    return {"out": out.to(torch.bfloat16), "lse": lse, "out_noise": noise}


# --------------------------------------------------------------------------- inputs


def nan_backing(fmt: KvRecordFormat, num_blocks: int, block_size: int, page_bytes: int, device: torch.device) -> torch.Tensor:
    """A ``[num_blocks, page_bytes]`` uint8 backing in which every byte is NaN-producing: e4m3 0x7F in the
    values (and the padding), bf16 NaN in the RoPE dims, fp32 NaN or UE8M0 0xFF in the scales."""
    backing = torch.full((num_blocks, page_bytes), FP8_NAN_BYTE, dtype=torch.uint8, device=device)
    scales = fmt.scales(backing, block_size)
    scales.fill_(float("nan") if fmt.scale_dtype == "fp32" else UE8M0_NAN_BYTE)
    rope = fmt.rope(backing, block_size)
    if rope is not None:
        rope.fill_(float("nan"))
    return backing


def cache_view(fmt: KvRecordFormat, backing: torch.Tensor, block_size: int) -> torch.Tensor:
    """The ``[num_blocks, block_size, 1, bytes_per_token]`` input view of a ``[num_blocks, page_bytes]`` backing."""
    n = backing.shape[0]
    return backing[:, : fmt.packed_page_bytes(block_size)].view(n, block_size, 1, fmt.bytes_per_token)


def write_random_records(fmt: KvRecordFormat, backing: torch.Tensor, block_size: int, slots: torch.Tensor, rng: InputRng) -> None:
    """Random N(0, 1) rows quantized by the descriptor's writer and stored at ``slots``, in steps."""
    for chunk in torch.split(slots, WRITE_CHUNK_TOKENS):
        rows = rng.randn(chunk.numel(), fmt.input_dims)
        fmt.write(backing, block_size, chunk, fmt.quantize(rows, SCALE_CONVENTION))


def boundary_slots(num_blocks: int, block_size: int) -> list[int]:
    """The first and last slot of pages 0, 1, the middle page and the last page (each once)."""
    pages = sorted({0, min(1, num_blocks - 1), num_blocks // 2, num_blocks - 1})
    return sorted({p * block_size + o for p in pages for o in (0, block_size - 1)})


def place_tokens(count: int, num_blocks: int, block_size: int, rng: InputRng) -> torch.Tensor:
    """``count`` distinct physical slots (int64) in random order, the :func:`boundary_slots` among them
    whenever ``count`` allows."""
    device = rng.device
    capacity = num_blocks * block_size
    edges = torch.tensor(boundary_slots(num_blocks, block_size), dtype=torch.long, device=device)
    perm = torch.randperm(capacity, generator=rng.values, device=device)
    is_edge = torch.zeros(capacity, dtype=torch.bool, device=device)
    is_edge[edges] = True
    chosen = torch.cat([edges, perm[~is_edge[perm]]])[:count]
    return chosen[torch.randperm(count, generator=rng.values, device=device)]


def row_counts(b: int, s_q: int, topk: int, s_k: int, p: Mapping[str, Any], rng: InputRng) -> np.ndarray:
    """Valid entries per row: ``min(topk, s_k)``; ``empty_rows`` random rows none, ``short_rows`` others 1..full-1."""
    rows, full = b * s_q, min(topk, s_k)
    counts = np.full(rows, full, dtype=np.int64)
    order = rng.structure.permutation(rows)
    empty, short = int(p.get("empty_rows", 0)), int(p.get("short_rows", 0))
    counts[order[:empty]] = 0
    if full > 1 and short:
        counts[order[empty : empty + short]] = rng.structure.integers(1, full, short)
    return counts


def draw_indices(axes: Mapping[str, int], p: Mapping[str, Any], rng: InputRng) -> torch.Tensor:
    """Random indices [b, s_q, topk] int32 (see the module docstring); -1 after the valid prefix, or with
    ``padding: scattered`` at random places of the row."""
    b, s_q, topk, s_k = axes["b"], axes["s_q"], axes["topk"], axes["s_k"]
    device = rng.device
    rows, full = b * s_q, min(topk, s_k)
    counts = torch.from_numpy(row_counts(b, s_q, topk, s_k, p, rng)).to(device)
    positions = torch.rand(rows, s_k, generator=rng.values, device=device).argsort(dim=1, stable=True)[:, :full]
    columns = torch.arange(topk, device=device)
    if p.get("padding", "tail") == "scattered":
        keys = torch.rand(rows, topk, generator=rng.values, device=device)
        rank = keys.argsort(dim=1, stable=True).argsort(dim=1)
        valid = rank < counts[:, None]
    else:
        valid = columns[None, :] < counts[:, None]
    which = (valid.long().cumsum(dim=1) - 1).clamp(0, full - 1)
    pos = positions.gather(1, which)
    sequence = torch.arange(rows, device=device)[:, None] // s_q
    keys_of = torch.where(valid, sequence * s_k + pos, -1)
    tokens, inverse = torch.unique(keys_of[valid], return_inverse=True)
    slots = place_tokens(tokens.numel(), axes["num_blocks"], axes["block_size"], rng)
    ids = torch.full_like(keys_of, -1)
    ids[valid] = slots[inverse]
    return ids.to(torch.int32).reshape(b, s_q, topk)


def draw_topk_length(axes: Mapping[str, int], p: Mapping[str, Any], rng: InputRng) -> torch.Tensor:
    """topk for every sequence; ``short`` random ones get 0..topk-1 (the first of them exactly 0 when short >= 2)."""
    b, topk = axes["b"], axes["topk"]
    lengths = np.full(b, topk, dtype=np.int64)
    short = int(p.get("short", 0))
    chosen = rng.structure.permutation(b)[:short]
    values = rng.structure.integers(0, topk, short)
    if short >= 2:
        values[0] = 0
    lengths[chosen] = values
    return torch.from_numpy(lengths).to(torch.int32).to(rng.device)


def draw_sink(axes: Mapping[str, int], p: Mapping[str, Any], rng: InputRng) -> torch.Tensor:
    """All -inf with ``off``; every head ``value`` when given; else ln(min(topk, s_k)) + 2·N(0, 1), a
    quarter of the heads -inf."""
    h = axes["h_q"]
    if p.get("off", False):
        return torch.full((h,), float("-inf"), dtype=torch.float32, device=rng.device)
    if "value" in p:
        return torch.full((h,), float(p["value"]), dtype=torch.float32, device=rng.device)
    sink = math.log(min(axes["topk"], axes["s_k"])) + SINK_SPREAD * rng.randn(h)
    off = torch.rand(h, generator=rng.values, device=rng.device) < SINK_OFF_FRACTION
    return sink.masked_fill(off, float("-inf"))


#: The generator parameters each random input takes (the others take none).
GENERATOR_PARAMS = {"indices": ("empty_rows", "short_rows", "padding"), "topk_length": ("short",), "attn_sink": ("off", "value")}


@dataclass(frozen=True)
class _Decode:
    """One record format's definition: its inputs, generator, checks."""

    fmt: KvRecordFormat

    @property
    def has_topk_length(self) -> bool:
        return self.fmt is not V32

    def draw_queries(self, axes: Mapping[str, int], rng: InputRng) -> dict[str, torch.Tensor]:
        """The cheap per-call input (the queries); timing redraws it before every call."""
        return {"q": rng.randn(axes["b"], axes["s_q"], axes["h_q"], self.fmt.d_qk).to(torch.bfloat16)}

    def generate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict], rng: InputRng) -> dict[str, Value]:
        fmt, device = self.fmt, rng.device
        bs = axes["block_size"]
        queries = self.draw_queries(axes, rng)
        out: dict[str, Value] = {"q": given["q"].to(device) if "q" in given else queries["q"]}
        if "indices" in given:
            indices = given["indices"].to(device)
        else:
            indices = draw_indices(axes, params.get("indices", {}), rng)
        topk_length = None
        if self.has_topk_length:
            if "topk_length" in given:
                topk_length = given["topk_length"].to(device)
            else:
                topk_length = draw_topk_length(axes, params.get("topk_length", {}), rng)
        sink = given["attn_sink"].to(device) if "attn_sink" in given else draw_sink(axes, params.get("attn_sink", {}), rng)
        if "kv_cache" in given:
            kv_cache = given["kv_cache"].to(device)
        else:  # records only where a counted entry points; NaN everywhere else
            backing = nan_backing(fmt, axes["num_blocks"], bs, axes["page_bytes"], device)
            used = torch.unique(indices.long()[counted(indices, topk_length)])
            write_random_records(fmt, backing, bs, used, rng)
            kv_cache = cache_view(fmt, backing, bs)
        out.update(kv_cache=kv_cache, indices=indices, sm_scale=float(given.get("sm_scale", fmt.d_qk**-0.5)), attn_sink=sink)
        if topk_length is not None:
            out["topk_length"] = topk_length
        return out

    # ------------------------------------------------------------------ validation
    def validate(self, axes: Mapping[str, int], given: Mapping[str, Value], params: Mapping[str, dict]) -> list[str]:
        """Everything in a case that breaks the contract (FlashMLA's SM90 asserts included) or the generator."""
        fmt = self.fmt
        problems = unknown_params(params, GENERATOR_PARAMS)
        b, s_q, h_q, topk, s_k = axes["b"], axes["s_q"], axes["h_q"], axes["topk"], axes["s_k"]
        blocks, bs, page = axes["num_blocks"], axes["block_size"], axes["page_bytes"]
        if h_q not in HEAD_COUNTS:
            problems.append(f"axes.h_q = {h_q} must be one of {', '.join(map(str, HEAD_COUNTS))} (FlashMLA's 64 and 128, and "
                            "128 heads split over 8 or 4 GPUs)")
        if not 1 <= s_q <= MAX_S_Q:
            problems.append(f"axes.s_q = {s_q} must be in [1, {MAX_S_Q}] (the next token and up to {MAX_S_Q - 1} MTP drafts)")
        if topk % TOPK_MULTIPLE:
            problems.append(f"axes.topk = {topk} must be a multiple of {TOPK_MULTIPLE}")
        problems += page_problems(fmt, page, blocks, bs)
        problems += self._param_problems(axes, params)
        capacity = blocks * bs
        if "indices" in given:
            problems += _explicit_indices_problems(given["indices"], capacity)
        elif not problems:
            bound = b * min(s_k, s_q * min(topk, s_k))  # distinct tokens the rows may reference
            if bound > capacity:
                problems.append(f"the generated indices may reference {bound} distinct tokens (b x min(s_k, s_q x min(topk, s_k))) "
                                f"but the cache holds num_blocks x block_size = {capacity}; raise axes.num_blocks")
        if "kv_cache" in given:
            if "indices" in given and fmt.scale_dtype == "fp32" and not problems:
                problems += _scale_problems(fmt, given["kv_cache"], given["indices"], given.get("topk_length"), bs)
            if "indices" not in given:
                problems.append("inputs.kv_cache is given explicitly, so inputs.indices must be too (generated indices point at slots "
                                "the given cache may not hold)")
            if page != fmt.packed_page_bytes(bs):
                problems.append(f"inputs.kv_cache is given explicitly (packed pages), so axes.page_bytes must be "
                                f"{fmt.packed_page_bytes(bs)}")
        if "topk_length" in given:
            lengths = given["topk_length"].long()
            bad = (lengths < 0) | (lengths > topk)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0])
                problems.append(f"inputs.topk_length[{i}] = {int(lengths[i])} is outside [0, topk = {topk}]")
        if "attn_sink" in given:
            sink = given["attn_sink"].float()
            bad = torch.isnan(sink) | torch.isposinf(sink)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0])
                problems.append(f"inputs.attn_sink[{i}] = {float(sink[i])}: a sink is a finite number, or -inf for none")
        scale = given.get("sm_scale")
        if scale is not None and not 0 < float(scale) <= MAX_SM_SCALE:
            problems.append(f"inputs.sm_scale = {scale!r} must be in (0, {MAX_SM_SCALE:g}]: a head of d_qk = {fmt.d_qk} dims "
                            f"is scaled by d_qk^-0.5 = {fmt.d_qk**-0.5:.3g}; far larger scales overflow the float32 logits")
        return problems

    def _param_problems(self, axes: Mapping[str, int], params: Mapping[str, dict]) -> list[str]:
        problems: list[str] = []
        rows = axes["b"] * axes["s_q"]
        p = params.get("indices", {})
        empty = integer_param(p, "indices", "empty_rows", 0, problems)
        short = integer_param(p, "indices", "short_rows", 0, problems)
        if empty is not None and short is not None:
            if empty < 0 or short < 0 or empty + short > rows:
                problems.append(f"indices.params: empty_rows = {empty} and short_rows = {short} must be >= 0 and add up to at most "
                                f"b x s_q = {rows} rows")
        if p.get("padding", "tail") not in PADDINGS:
            problems.append(f"indices.params.padding = {p.get('padding')!r}, expected 'tail' or 'scattered'")
        shorter = integer_param(params.get("topk_length", {}), "topk_length", "short", 0, problems)
        if shorter is not None and not 0 <= shorter <= axes["b"]:
            problems.append(f"topk_length.params.short = {shorter} must be in [0, b = {axes['b']}]")
        sink = params.get("attn_sink", {})
        if not isinstance(sink.get("off", False), bool):
            problems.append("attn_sink.params.off must be true or false")
        if "value" in sink:
            value = sink["value"]
            if not is_finite_number(value) or abs(float(value)) > torch.finfo(torch.float32).max:
                problems.append(f"attn_sink.params.value = {value!r} must be a number finite in float32 (every head's sink; "
                                "for no sink use off: true)")
            elif sink.get("off", False):
                problems.append("attn_sink.params: value and off: true contradict each other; give one")
        return problems

    # ------------------------------------------------------------------ checking and traffic
    def min_traffic_bytes(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """Bytes any correct kernel must at least move for one call::

            reads   4 · (index entries left of topk_length)     every such entry, -1 or not (-1 may sit anywhere)
                  + 4 · b                                      topk_length (V4/V4.1)
                  + 2 · h_q · d_qk · (rows with a counted entry) the queries a row needs
                  + record · |distinct counted ids|            values, used scale bytes and RoPE of each record
                                                               read once, however many rows list it
                  + 4 · h_q                                    attn_sink
            writes  (2 · 512 + 4) · h_q · b · s_q              out (bf16) and lse (float32)

        ``record`` is the format's value, used scale and RoPE bytes (its pad scale byte is never needed).
        A lower bound at byte granularity: DRAM moves 32-byte sectors.
        """
        fmt = self.fmt
        indices, topk_length = inputs["indices"], inputs.get("topk_length")
        b, s_q, topk = indices.shape
        h_q = axes["h_q"]
        mask = counted(indices, topk_length)
        entries = b * s_q * topk if topk_length is None else s_q * int(topk_length.long().clamp(0, topk).sum())
        rows_used = int(mask.any(dim=-1).sum())
        record = fmt.value_bytes + fmt.num_scales * fmt.scale_element_bytes + fmt.rope_bytes
        distinct = int(torch.unique(indices[mask]).numel())
        reads = 4 * entries + (4 * b if topk_length is not None else 0) + 2 * h_q * fmt.d_qk * rows_used + record * distinct + 4 * h_q
        return reads + (2 * D_V + 4) * h_q * b * s_q

    def useful_flops(self, axes: Mapping[str, int], inputs: Mapping[str, Value]) -> int:
        """Tensor-core FLOPs: ``2 · h_q · (d_qk + 512)`` per counted entry (Q·Kᵀ over d_qk dims,
        then P·V over the 512 value dims, for each head).

        Counted entries are those >= 0 and, in V4/V4.1, left of ``topk_length`` (:func:`counted`),
        not ``b · s_q · topk``: a -1 entry or one past a row's length needs no math. FlashMLA quotes
        its TFLOPS over all ``topk`` entries; on inputs without padding the two agree. The softmax
        and the sink are not tensor-core math and are not counted.
        """
        valid = int(counted(inputs["indices"], inputs.get("topk_length")).sum())
        return 2 * axes["h_q"] * (self.fmt.d_qk + D_V) * valid


def _explicit_indices_problems(indices: torch.Tensor, capacity: int) -> list[str]:
    idx = indices.long()
    bad = (idx < -1) | (idx >= capacity)
    if bool(bad.any()):
        at = [int(i) for i in torch.nonzero(bad)[0]]
        return [f"inputs.indices{at} = {int(idx[tuple(at)])} is neither -1 nor a slot below num_blocks x block_size = {capacity}"]
    return []


def _scale_problems(fmt: KvRecordFormat, kv_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
                    block_size: int) -> list[str]:
    """V3.2's fp32 scales must be positive powers of two at every counted record: FlashMLA's SM90 kernel casts them
    to bf16 (exact only for powers of two), and every writer of this project and FlashMLA's own tests make them so."""
    slots = torch.unique(indices.long()[counted(indices, topk_length)])
    if slots.numel() == 0:
        return []
    scales = fmt.read(kv_cache, block_size, slots).scales.contiguous().view(torch.float32)
    mantissa, _ = torch.frexp(scales)
    bad = ~(torch.isfinite(scales) & (scales > 0) & (mantissa == 0.5))
    if not bool(bad.any()):
        return []
    row, tile = (int(i) for i in torch.nonzero(bad)[0])
    return [f"inputs.kv_cache: the record at slot {int(slots[row])} has scale {tile} = {float(scales[row, tile])!r}; V3.2 scales "
            "must be positive powers of two (FlashMLA casts them to bf16, exact only for powers of two)"]


def _check_empty_rows(empty: torch.Tensor, outputs: Mapping[str, torch.Tensor]) -> CheckResult:
    """A row with no counted entry has out exactly 0 and lse exactly +inf: no tolerance."""
    if not bool(empty.any()):
        return CheckResult(Status.PASSED)
    out, lse = outputs["out"].float(), outputs["lse"]
    bad_out = empty[..., None] & (out != 0)  # NaN too
    if bool(bad_out.any()):
        b, s, h, d = (int(i) for i in torch.nonzero(bad_out)[0])
        return CheckResult(Status.INCORRECT_NUMERICAL, f"out: batch {b} query {s} has no counted index, so its out must be exactly 0; "
                                                       f"head {h} column {d} holds {float(out[b, s, h, d]):.6g}")
    bad_lse = empty & ~torch.isposinf(lse)
    if bool(bad_lse.any()):
        b, s, h = (int(i) for i in torch.nonzero(bad_lse)[0])
        return CheckResult(Status.INCORRECT_NUMERICAL, f"lse: batch {b} query {s} has no counted index, so its lse must be exactly +inf; "
                                                       f"head {h} holds {float(lse[b, s, h]):.6g}")
    return CheckResult(Status.PASSED)


def check(inputs: Mapping[str, Value], outputs: Mapping[str, torch.Tensor], expected: Any, tol: Tolerance) -> CheckResult:
    """The definition's checker: :func:`check_rows` on the case's ``indices`` and ``topk_length``."""
    return check_rows(inputs["indices"], inputs.get("topk_length"), outputs, expected, tol)


def check_rows(indices: torch.Tensor, topk_length: torch.Tensor | None, outputs: Mapping[str, torch.Tensor], expected: Mapping[str, Any],
               tol: Tolerance) -> CheckResult:  # fmt: skip
    """Empty rows exactly (out 0, lse +inf); out element-wise (atol AND rtol·|ref| exceeded fails) and row by row
    (each (batch, query, head) row's largest |diff| against that row's own bound, checks.row_tolerances); lse
    with the absolute lse_atol only. NaN fails everywhere; +inf in lse only where the row is empty. A row is
    empty when ``indices`` count no entry in it (none >= 0 left of ``topk_length``), whatever the reference's
    lse. ``expected`` is what :func:`expect` returns (``out``, ``lse`` and ``out_noise``)."""
    entries = counted(indices, topk_length).to(expected["lse"].device)
    empty = (~entries.any(dim=-1))[..., None].expand_as(expected["lse"])
    lse_tol = replace(tol, atol=tol.lse_atol, rtol=0.0)  # absolute only: see Tolerance.lse_atol
    # empty rows are judged exactly above; hide their +inf from the tolerance test (a wrong value there already failed)
    got_lse = torch.where(empty & torch.isposinf(outputs["lse"]), 0.0, outputs["lse"])
    return worst([
        _check_empty_rows(empty, outputs),
        compare_close("out", outputs["out"], expected["out"], tol),
        compare_rows("out", outputs["out"], expected["out"], row_tolerances(expected["out"], expected["out_noise"]), skip=empty,
                     row_label=lambda at: f"batch {at[0]} query {at[1]} head {at[2]}"),
        compare_close("lse", got_lse, torch.where(empty, 0.0, expected["lse"]), lse_tol),
    ])


# --------------------------------------------------------------------------- definitions


def _definition(fmt: KvRecordFormat, name: str) -> Definition:
    family = _Decode(fmt)
    inputs = [
        TensorSpec("q", ("b", "s_q", "h_q", "d_qk"), torch.bfloat16, "queries; RoPE dims last"),
        TensorSpec("kv_cache", ("num_blocks", "block_size", "h_kv", "bytes_per_token"), torch.uint8,
                   f"paged {fmt.kv_format} FP8 records; stride(1) = bytes_per_token, stride(0) = page_bytes (may be padded)"),
        TensorSpec("indices", ("b", "s_q", "topk"), torch.int32, "physical ids block*block_size+offset; -1 invalid"),
        TensorSpec("sm_scale", (), torch.float32, "softmax scale"),
        TensorSpec("attn_sink", ("h_q",), torch.float32, "per-head sink logit; -inf: none"),
    ]
    if family.has_topk_length:
        inputs.append(TensorSpec("topk_length", ("b",), torch.int32, "entries j >= topk_length[b] are ignored"))
    specs = tuple(inputs)
    names = [s.name for s in specs]

    def reference(*args: Value) -> dict[str, torch.Tensor]:
        return decode(fmt, *args)

    value = {"V32": "the 512 NoPE dims", "V4": "all 512 dims (448 NoPE, then the 64 RoPE dims)",
             "V41": "all 512 quantized dims"}[fmt.kv_format]
    return Definition(
        name=name,
        description=f"FlashMLA-style sparse decode over paged {fmt.kv_format} FP8 records (d_qk {fmt.d_qk}, natural-log lse).",
        const_axes={"d_qk": fmt.d_qk, "h_kv": 1, "bytes_per_token": fmt.bytes_per_token, "d_v": D_V},
        var_axes=("b", "s_q", "h_q", "topk", "s_k", "num_blocks", "block_size", "page_bytes"),
        inputs=specs,
        outputs=(
            TensorSpec("out", ("b", "s_q", "h_q", "d_v"), torch.bfloat16),
            TensorSpec("lse", ("b", "s_q", "h_q"), torch.float32, "natural log of the softmax denominator; +inf on an empty row"),
        ),
        reference=reference,
        generate=family.generate,
        validate=family.validate,
        redraw=family.draw_queries,
        expect=lambda given: expect(fmt, *(given[n] for n in names)),
        check=check,
        key_axes=("b", "h_q", "s_q", "topk"),
        tolerance_fields=("atol", "rtol", "lse_atol"),
        notes=(
            "lse is the natural log; a row with no counted index has out exactly 0 and lse exactly +inf.",
            f"V is the first {D_V} dims of the dequantized record: {value}.",
            "attn_sink scales out by 1/(1+exp(sink-lse)) and leaves lse alone; -inf means no sink.",
            "out is compared element-wise with atol/rtol and row by row against each row's own magnitude; lse with the "
            f"absolute lse_atol alone (default {LSE_ATOL:g}, natural log).",
            "Generated caches hold records only where a counted index points; every other byte is NaN-producing.",
        ),
        min_traffic_bytes=family.min_traffic_bytes,
        tolerance=Tolerance(lse_atol=LSE_ATOL),
        useful_flops=family.useful_flops,
        # the FP8 records are dequantized to bf16 in shared memory and both products run as bf16
        # MMA (solutions/triton/decode/csrc/consumer_m64.cuh, FlashMLA's sparse decode likewise)
        math_precision="bf16",
    )


DEFINITIONS = (
    _definition(V32, "dsa_mla_decode_v32_fp8"),
    _definition(V4, "dsa_mla_decode_v4_fp8"),
    _definition(V41, "dsa_mla_decode_v41_fp8"),
)
FORMAT_OF = {d.name: fmt for d, fmt in zip(DEFINITIONS, (V32, V4, V41), strict=True)}
