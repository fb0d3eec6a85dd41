"""FlashMLA-style sparse decode over paged FP8 KV records (``dsa_mla_decode_{v32,v4,v41}_fp8``), Triton on GPU and CPU.

Entry points (destination-passing style)::

    kernel_v32(q, kv_cache, indices, sm_scale, attn_sink, out, lse)                 # dsa_mla_decode_v32_fp8
    kernel_v4(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)     # dsa_mla_decode_v4_fp8
    kernel_v41(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)    # dsa_mla_decode_v41_fp8

    q            [b, s_q, h_q, d_qk]                       bf16   d_qk = fmt.d_qk (V3.2: 512 NoPE + 64 RoPE; V4, V4.1: 512)
    kv_cache     [num_blocks, block_size, 1, fmt.bytes_per_token]  uint8 (any 1-byte dtype, read as bytes);
                 stride(1) == bytes_per_token, stride(3) == 1, stride(0) (the page stride) >= the packed page;
                 the layout inside a page is the descriptor's (kv_records: V32 per token, V4 / V41 per page)
    indices      [b, s_q, topk]                            int32  physical ids block * block_size + slot; -1 = invalid
    sm_scale     python float
    attn_sink    [h_q] f32 or None                         -inf = no sink for that head
    topk_length  [b] int32 or None (V4, V4.1)              positions >= topk_length[b] are ignored
    out          [b, s_q, h_q, 512]                        bf16   written: softmax(q k^T sm_scale) V x sink factor
    lse          [b, s_q, h_q]                             f32    written: natural-log logsumexp of q k^T sm_scale

V is the first 512 dims of the dequantized K row (V3.2: the 512 FP8 dims; V4: 448 FP8 + 64 RoPE
dims). A row with no valid index gets out exactly 0 and lse +inf (FlashMLA's convention). The
sink multiplies out by 1 / (1 + exp(sink - lse)) and leaves lse alone.

Record geometry comes only from the ``kv_records`` descriptors (``shapes.RecordGeometry``).
The kernels and their split / combine design are in ``triton_kernels.py``, the tiling table and policy
in ``policy.py``, and docs/kernels/mla_decode.md explains both.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from ..common.interpreter import INTERPRETED, interpreted
from ..common.kv_records import V4, V32, V41, KvRecordFormat
from . import cuda, triton_kernels
from .policy import DecodeConfig, auto_splits, cuda_config, interpreter_config, resolve_combine, resolve_cuda_combine, select_config
from .shapes import D_V, RecordGeometry

BYTE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
PARTIAL_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@functools.cache
def record_geometry(kv_format: str, block_size: int) -> RecordGeometry:
    return RecordGeometry.of({f.kv_format: f for f in (V32, V4, V41)}[kv_format], block_size)


def check_io(fmt: KvRecordFormat, q, kv_cache, indices, attn_sink, topk_length, out, lse) -> tuple[int, int, int, int]:
    """Shapes, dtypes, strides and one device, from metadata only; raises ValueError naming the
    tensor. Returns (b, s_q, h_q, topk)."""
    if q.dim() != 4:
        raise ValueError(f"q: expected [b, s_q, h_q, {fmt.d_qk}], got {list(q.shape)}")
    b, s_q, h_q, d_qk = q.shape
    if d_qk != fmt.d_qk or q.dtype != torch.bfloat16:
        raise ValueError(f"q: expected bf16 [b, s_q, h_q, {fmt.d_qk}] for {fmt.kv_format}, got {q.dtype} {list(q.shape)}")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != fmt.bytes_per_token or kv_cache.dtype not in BYTE_DTYPES:
        raise ValueError(
            f"kv_cache: expected uint8 [num_blocks, block_size, 1, {fmt.bytes_per_token}] ({fmt.kv_format}), "
            f"got {kv_cache.dtype} {list(kv_cache.shape)}"
        )
    block_size = kv_cache.shape[1]
    if block_size > 1 and kv_cache.stride(1) != fmt.bytes_per_token or kv_cache.stride(3) != 1:
        raise ValueError(f"kv_cache: stride(1) must be {fmt.bytes_per_token} and stride(3) 1, got strides {list(kv_cache.stride())}")
    if kv_cache.shape[0] > 1 and kv_cache.stride(0) < fmt.packed_page_bytes(block_size):
        raise ValueError(
            f"kv_cache: page stride {kv_cache.stride(0)} B < the packed page {fmt.packed_page_bytes(block_size)} B "
            f"({fmt.kv_format}, block size {block_size})"
        )
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (b, s_q) or indices.dtype != torch.int32:
        raise ValueError(f"indices: expected int32 [{b}, {s_q}, topk], got {indices.dtype} {list(indices.shape)}")
    topk = indices.shape[2]
    expected = {
        "out": (out, (b, s_q, h_q, D_V), torch.bfloat16),
        "lse": (lse, (b, s_q, h_q), torch.float32),
    }
    if attn_sink is not None:
        expected["attn_sink"] = (attn_sink, (h_q,), torch.float32)
    if topk_length is not None:
        expected["topk_length"] = (topk_length, (b,), torch.int32)
    for name, (tensor, shape, dtype) in expected.items():
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype} {list(shape)}, got {tensor.dtype} {list(tensor.shape)}")
    unit_stride = {"q": q, "indices": indices, "out": out, "attn_sink": attn_sink, "topk_length": topk_length}
    for name, tensor in unit_stride.items():
        if tensor is not None and tensor.numel() and tensor.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride {tensor.stride(-1)})")
    for name, tensor in {"kv_cache": kv_cache, "indices": indices, "out": out, "lse": lse, "attn_sink": attn_sink,
                         "topk_length": topk_length}.items():  # fmt: skip
        if tensor is not None and tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device}, q on {q.device}")
    return b, s_q, h_q, topk


@functools.cache
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _device_sms(device: torch.device) -> int:
    return sm_count(device.index if device.index is not None else torch.cuda.current_device())


class _TicketWords:
    """The ticket words of one (device, stream), kept for the process's lifetime: zeroed once when
    allocated; afterwards every call leaves each word on a multiple of TICKETS_PER_CALL (triton_kernels.py).
    Growing replaces the buffer (a call in flight keeps the old one alive through the caching
    allocator's stream ordering)."""

    def __init__(self) -> None:
        self.words: torch.Tensor | None = None

    def get(self, device: torch.device, units: int) -> torch.Tensor:
        if self.words is None or self.words.numel() < units * triton_kernels.TICKET_STRIDE:
            self.words = torch.zeros(max(units, 256) * triton_kernels.TICKET_STRIDE, dtype=torch.int32, device=device)
        return self.words


_TICKETS: dict[tuple, _TicketWords] = {}


def ticket_words(device: torch.device, units: int) -> torch.Tensor:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key: tuple = (index, torch.cuda.current_stream(index).cuda_stream)
    else:
        key = (str(device), 0)
    return _TICKETS.setdefault(key, _TicketWords()).get(device, units)


def plan_config(fmt: KvRecordFormat, b: int, s_q: int, h_q: int, topk: int, device: torch.device,
                config: DecodeConfig | None = None, use_cuda: bool = False) -> DecodeConfig:  # fmt: skip
    """The concrete config a call runs with: ``config`` (splits 0: auto), else the CUDA kernel's
    when the call can take it (``use_cuda``), else the table's / the interpreter's, with the
    combine resolved for the grid; validated."""
    interp = interpreted(device)
    sms = 1 if interp else _device_sms(device)
    if config is None:
        if interp:
            config = interpreter_config(h_q, topk)
        elif use_cuda:
            config = cuda_config(b * s_q, h_q, topk, sms)
        else:
            return select_config(fmt.kv_format, h_q, b * s_q, topk, sms)
    if config.kernel == "cuda":
        if interp:
            raise ValueError(f"{config}: the CUDA kernel does not run under the Triton interpreter")
        if config.splits == 0:
            chosen = cuda_config(b * s_q, h_q, topk, sms)
            config = replace(config, splits=chosen.splits, whole_tokens=chosen.whole_tokens)
        config = resolve_cuda_combine(config, b * s_q, h_q, sms)
        config.validate(h_q, topk)
        return config
    units = b * s_q * (h_q // config.block_h) if h_q % config.block_h == 0 else 0
    if config.splits == 0:
        config = replace(config, splits=auto_splits(units, topk, config.block_n, sms))
    config = resolve_combine(config, units * config.splits, sms, interp)
    config.validate(h_q, topk)
    return config


def mla_decode(fmt: KvRecordFormat, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse,
               config: DecodeConfig | None = None) -> DecodeConfig:  # fmt: skip
    """Write ``out`` and ``lse`` (see the module docstring). Returns the config used."""
    b, s_q, h_q, topk = check_io(fmt, q, kv_cache, indices, attn_sink, topk_length, out, lse)
    device = q.device
    tokens = b * s_q
    if topk == 0:  # every row empty
        out.zero_()
        lse.fill_(float("inf"))
    if tokens == 0 or h_q == 0 or topk == 0:
        return config or DecodeConfig()
    interp = interpreted(device)
    use_cuda = not interp and cuda.unsupported_reason(fmt, q, kv_cache, out) is None
    config = plan_config(fmt, b, s_q, h_q, topk, device, config, use_cuda)
    geometry = record_geometry(fmt.kv_format, kv_cache.shape[1])
    head_blocks = h_q // config.block_h
    units = tokens * head_blocks
    splits = config.splits
    cache = kv_cache if kv_cache.dtype == torch.uint8 else kv_cache.view(torch.uint8)
    if config.kernel == "cuda":
        parts = cuda.split_parts(tokens, h_q, splits, config.whole_tokens) if config.whole_tokens <= tokens else 0
        partials = cuda.SplitPartials.allocate(parts, device, h_q) if parts else None
        tickets = ticket_words(device, parts // splits) if parts and config.combine == "barrier" else None
        cuda.run(fmt, geometry, q, cache, indices, sm_scale, attn_sink, topk_length, out, lse, splits, partials,
                 config.whole_tokens, tickets)  # fmt: skip
        return config
    mode = {"none": triton_kernels.MODE_DIRECT, "two_launch": triton_kernels.MODE_PARTIAL, "barrier": triton_kernels.MODE_BARRIER,
            "last": triton_kernels.MODE_LAST}[config.combine]  # fmt: skip
    part_out = part_lse = tickets = None
    if mode != triton_kernels.MODE_DIRECT:
        # Partials per call (a host-side lookup in the caching allocator).
        part_out = torch.empty(units * splits * config.block_h * D_V, dtype=PARTIAL_TORCH_DTYPES[config.partial_dtype], device=device)
        part_lse = torch.empty(units * splits * config.block_h, dtype=torch.float32, device=device)
    if mode in (triton_kernels.MODE_BARRIER, triton_kernels.MODE_LAST):
        tickets = ticket_words(device, units)
    scan = 1
    while scan < -(-topk // splits):
        scan *= 2
    triton_kernels._decode_kernel[(head_blocks, splits, tokens)](
        q, cache, indices, topk_length, attn_sink, out, lse, part_out, part_lse, tickets,
        float(sm_scale) * triton_kernels.LOG2_E, kv_cache.stride(0),
        q.stride(0), q.stride(1), q.stride(2), indices.stride(0), indices.stride(1),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        S_Q=s_q, TOPK=topk, D_V=D_V, BLOCK_H=config.block_h, BLOCK_N=config.block_n, NUM_SPLITS=splits, SPLIT_SCAN=scan,
        MODE=mode, L2_PREFETCH=config.l2_prefetch, HAS_TOPK_LENGTH=topk_length is not None, HAS_SINK=attn_sink is not None,
        **geometry.constexprs(),
        TICKET_STRIDE=triton_kernels.TICKET_STRIDE, TICKETS_PER_CALL=triton_kernels.TICKETS_PER_CALL, INTERPRETED=interp,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if mode == triton_kernels.MODE_PARTIAL:
        slice_cols = combine_slice(splits, config.block_h)
        triton_kernels._combine_kernel[(D_V // slice_cols, head_blocks, tokens)](
            part_out, part_lse, attn_sink, out, lse,
            out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
            S_Q=s_q, BLOCK_H=config.block_h, D_V=D_V, NUM_SPLITS=splits, SLICE=slice_cols, HAS_SINK=attn_sink is not None,
            INTERPRETED=interp, num_warps=triton_kernels.COMBINE_NUM_WARPS,
        )  # fmt: skip
    return config


def combine_slice(splits: int, block_h: int) -> int:
    """Value columns per program of the combine kernel: about COMBINE_ELEMENTS partial elements
    (splits x heads x columns), between 16 (a vector of 64 bytes) and all D_V."""
    cols = D_V
    while cols > 16 and splits * block_h * cols > triton_kernels.COMBINE_ELEMENTS:
        cols //= 2
    return cols


def kernel_v32(q, kv_cache, indices, sm_scale, attn_sink, out, lse) -> None:
    """dsa_mla_decode_v32_fp8 (destination-passing style)."""
    mla_decode(V32, q, kv_cache, indices, sm_scale, attn_sink, None, out, lse)


def kernel_v4(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse) -> None:
    """dsa_mla_decode_v4_fp8 (destination-passing style)."""
    mla_decode(V4, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)


def kernel_v41(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse) -> None:
    """dsa_mla_decode_v41_fp8 (destination-passing style)."""
    mla_decode(V41, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)


#: What runs for 16 and 32 heads (a TP8 / TP4 GPU's share of 128), on every device.
SMALL_HEADS_NOTE = (
    "h_q 16 and 32 (TP8 / TP4): on SM90 for V3.2 and V4 a native 16/32-head CUDA kernel (two warpgroups of the same "
    "producer, eight consumer warps: mma.sync m16n8k16 at 16 heads, transposed wgmma m64n32k16 at 32, S^T = K Q^T "
    "and O^T = V^T P^T; the same schedule of whole and split tokens); elsewhere the Triton kernel with one head block "
    "of h_q (tl.dot M = 16 or 32)"
)


def solution_notes() -> str:
    if INTERPRETED:
        return ("MLA decode under the Triton interpreter: one program per (query token, block of min(64, h_q) heads), "
                f"no splits. {SMALL_HEADS_NOTE}")
    return (
        "MLA decode: on SM90 for V3.2 and V4 the hand-written CUDA kernel (wgmma; a producer warpgroup gathers and "
        "dequantizes 64-record tiles into two shared-memory stages, two consumer warpgroups attend them; whole index rows "
        "first, then the tokens that would leave SMs idle split over their topk positions, the partials merged by a CUDA "
        "combine kernel launched as a programmatic dependent); otherwise (V4.1, other GPUs, unaligned caches) Triton: FP8 "
        "records dequantized in registers, 64 heads x 64 records per step, the split's combine behind a per-unit ticket "
        "barrier or in a second launch. "
        f"{SMALL_HEADS_NOTE}"
    )
