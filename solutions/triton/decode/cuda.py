"""The hand-written SM90 decode (``csrc/``, launched from ``launch_sm90.cu``): its build and a checked launch.

The kernel and a small C ABI (``csrc/decode_capi.cpp``: device pointers, strides, the record
geometry in bytes, the stream and the device) are one shared library, built by
``common/cuda_build.py`` and called through ctypes, like the sparse attention's
(``attention/cuda.py``). ``unsupported_reason`` says when a call cannot take it (then the entry
runs the Triton kernel, and the config it returns says so); ``run`` checks the rest in Python
before the C call and passes torch's current stream, so the launch is captured like any other
when that stream is capturing a CUDA graph.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common.cuda_build import SM90_KERNEL_HEADERS, CudaLibrary, load_checked_library
from ..common.kv_records import V4, V32, KvRecordFormat
from . import triton_kernels
from .shapes import D_V, RecordGeometry

HERE = Path(__file__).resolve().parent
#: compiled sources (relative to this folder): the C ABI and the launcher, which includes the kernels
SOURCES = ("csrc/decode_capi.cpp", "csrc/launch_sm90.cu", "csrc/launch_m16.cu")
#: the kernels split by role, as FlashMLA's csrc/: the host interface, the device config and
#: layout, the instruction wrappers, producer, softmax, consumer, kernel and combine
KERNEL_HEADERS = (
    "csrc/decode_sm90.h", "csrc/config.cuh", "csrc/instructions.cuh", "csrc/producer.cuh", "csrc/softmax.cuh",
    "csrc/consumer_m64.cuh", "csrc/kernel_m64.cuh", "csrc/combine.cuh", "csrc/consumer_m16.cuh", "csrc/consumer_st.cuh",
    "csrc/kernel_m16.cuh",
)  # fmt: skip
HEADERS = (*KERNEL_HEADERS, *SM90_KERNEL_HEADERS)
#: the C ABI's exports are named dsa_decode_<name>
PREFIX = "dsa_decode_"
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {
    "launch": (_INT, (
        _INT, _P, _INT,  # device, stream, format
        _P, _I64, _I64, _I64,  # q and its batch, token and head strides
        _P, _I64, _I64, _I64, _I64, _I64, _I64,  # cache, page stride, block size, data slot, scale base, scale slot, rope offset
        _P, _I64, _I64, _P, _P,  # indices and its strides, topk_length, attn_sink
        _P, _I64, _I64, _I64, _P, _I64, _I64, _I64,  # out, lse with their strides
        _P, _P, _P, _P,  # part_out, part_scale, part_lse, tickets
        _I64, _I64, _I64, _I64, _I64, _I64, ctypes.c_double,  # batch, s_q, h_q, topk, splits, whole_tokens, sm_scale * log2(e)
    )),
}  # fmt: skip
#: the formats the kernel reads (decode_sm90.h, Format)
FORMATS = {V32.kv_format: 0, V4.kv_format: 1}
#: constants of csrc/decode_sm90.h
HEADS_PER_PROGRAM = 64  # the M of every wgmma
TILE_TOKENS = 64  # records gathered and attended together
STAGES = 2
MAX_SPLITS = 32
PARTIAL_SCALES = 256  # fp16 scales per split partial: one per consumer thread
#: h_q the 16/32-head kernel takes (16: mma.sync m16n8k16; 32: transposed wgmma m64n32); its unit is all
#: h_q heads of a query token, with SMALL_PARTIAL_SCALES_PER_16 scales per 16 heads of a partial
SMALL_HEADS = (16, 32)
SMALL_PARTIAL_SCALES_PER_16 = 256  # eight consumer warps
#: the in-launch combine's ticket words: the Triton kernel's (triton_kernels.py), one layout for both
TICKET_STRIDE, TICKETS_PER_CALL = triton_kernels.TICKET_STRIDE, triton_kernels.TICKETS_PER_CALL
CAPABILITY = (9, 0)  # wgmma and setmaxnreg are sm_90a features
EXPECTED_CONSTANTS = {
    "HEADS_PER_PROGRAM": HEADS_PER_PROGRAM, "TILE_TOKENS": TILE_TOKENS, "D_V": D_V, "STAGES": STAGES, "MAX_SPLITS": MAX_SPLITS,
    "PARTIAL_SCALES": PARTIAL_SCALES, "SMALL_PARTIAL_SCALES_PER_16": SMALL_PARTIAL_SCALES_PER_16,
    "TICKET_STRIDE": TICKET_STRIDE, "TICKETS_PER_CALL": TICKETS_PER_CALL,
    "V32_D_QK": V32.d_qk, "V32_QUANT_DIMS": V32.quant_dims, "V32_SCALE_TILE": V32.scale_tile,
    "V4_D_QK": V4.d_qk, "V4_QUANT_DIMS": V4.quant_dims, "V4_SCALE_TILE": V4.scale_tile,
}  # fmt: skip
STEM, WHAT = "dsa_mla_decode_sm90", "the CUDA MLA decode"
LOG2_E = 1.4426950408889634

def unit_heads(h_q: int) -> int:
    """Heads of one unit (a program's heads, and one partial's): h_q itself at 16 and 32, else 64."""
    return h_q if h_q in SMALL_HEADS else HEADS_PER_PROGRAM


def split_parts(tokens: int, h_q: int, splits: int, whole_tokens: int) -> int:
    """The partials a call writes: one per split of every head-block unit of its split tokens."""
    return 0 if splits == 1 else (tokens - whole_tokens) * (h_q // unit_heads(h_q)) * splits


def partial_scales(h_q: int) -> int:
    """fp32 scales per split partial (one per consumer thread and m16 tile at 16 and 32 heads)."""
    return h_q // 16 * SMALL_PARTIAL_SCALES_PER_16 if h_q in SMALL_HEADS else PARTIAL_SCALES


@dataclass(frozen=True)
class SplitPartials:
    """The CUDA kernel's split scratch for ``parts`` = units x splits partials (units = b * s_q *
    h_q / 64): ``out`` [parts, 64, D_V] fp16 (O / l over ``scale``, in the kernel's fragment order),
    ``scale`` [parts, PARTIAL_SCALES] fp32 (one per consumer thread), ``lse`` [parts, 64] fp32
    (m + log2 l). decode_sm90.h (DecodeArgs) says why fp16 with a scale."""

    out: torch.Tensor
    scale: torch.Tensor
    lse: torch.Tensor

    @classmethod
    def allocate(cls, parts: int, device: torch.device, h_q: int = HEADS_PER_PROGRAM) -> SplitPartials:
        """Scratch for ``parts`` partials of a call with ``h_q`` heads (a unit: ``unit_heads(h_q)``)."""
        heads = unit_heads(h_q)
        return cls(
            torch.empty(parts * heads * D_V, dtype=torch.float16, device=device),
            torch.empty(parts * partial_scales(h_q), dtype=torch.float32, device=device),
            torch.empty(parts * heads, dtype=torch.float32, device=device),
        )

    def check(self, parts: int, device: torch.device, h_q: int = HEADS_PER_PROGRAM) -> None:
        """ValueError naming the tensor when one is too small, not contiguous, of another dtype or device."""
        heads = unit_heads(h_q)
        need = {
            "out": (self.out, torch.float16, parts * heads * D_V),
            "scale": (self.scale, torch.float32, parts * partial_scales(h_q)),
            "lse": (self.lse, torch.float32, parts * heads),
        }
        for name, (tensor, dtype, size) in need.items():
            if tensor.dtype != dtype or not tensor.is_contiguous() or tensor.numel() < size:
                raise ValueError(f"partials.{name}: expected a contiguous {dtype} tensor of at least {size} elements")
            if tensor.device != device:
                raise ValueError(f"partials.{name} is on {tensor.device}, q on {device}")

    def pointers(self) -> tuple[int, int, int]:
        return self.out.data_ptr(), self.scale.data_ptr(), self.lse.data_ptr()


def load_decode_extension(verbose: bool | None = None) -> CudaLibrary:
    """The compiled library (built on first use); raises cuda_build.CudaBuildError with the reason."""
    return load_checked_library(STEM, WHAT, HERE, SOURCES, HEADERS, PREFIX, SIGNATURES, EXPECTED_CONSTANTS,
                                "decode/cuda.py and kv_records disagree with csrc/decode_sm90.h", verbose)  # fmt: skip


def _rows_aligned(t: torch.Tensor) -> bool:
    """16-byte vectors along the last dim: an aligned base and every outer stride a multiple of 16 bytes."""
    return t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])


def unsupported_reason(fmt: KvRecordFormat, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> str | None:
    """Why this call cannot run on the CUDA kernel (None: it can). Shapes and dtypes are the
    entry's check_io; this adds the device, the format and the alignment the kernel's 16-byte
    loads and the combine's 16-byte stores need."""
    if fmt.kv_format not in FORMATS:
        return f"{fmt.kv_format} records (the CUDA kernel reads {', '.join(FORMATS)})"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device) != CAPABILITY:
        return f"not an SM{CAPABILITY[0]}{CAPABILITY[1]} GPU"
    if q.shape[2] not in SMALL_HEADS and q.shape[2] % HEADS_PER_PROGRAM:
        return f"h_q = {q.shape[2]} is neither 16, 32 nor a multiple of {HEADS_PER_PROGRAM}"
    if not _rows_aligned(q):
        return "q's rows are not 16-byte aligned"
    if kv_cache.data_ptr() % 16 or kv_cache.stride(0) % 16:
        return "the cache's base or page stride is not 16-byte aligned"
    if not _rows_aligned(out):
        return "out's rows are not 16-byte aligned"
    return None


def run(fmt: KvRecordFormat, geometry: RecordGeometry, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor,
        sm_scale: float, attn_sink: torch.Tensor | None, topk_length: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor,
        splits: int, partials: SplitPartials | None = None, whole_tokens: int = 0,
        tickets: torch.Tensor | None = None) -> None:  # fmt: skip
    """Launch the decode (shapes: decode/entry.py, checked there by check_io): it writes ``out``
    and ``lse``. Query tokens from ``whole_tokens`` on are split ``splits`` ways (policy.cuda_schedule);
    their partials go to the scratch ``partials`` (``split_parts`` of them: ``SplitPartials.allocate``),
    which the split programs merge themselves behind a ticket barrier when ``tickets`` is given
    (``entry.ticket_words``: int32, TICKET_STRIDE words per split unit; the grid must fit one program
    per SM and ``splits`` divide TICKETS_PER_CALL), else the library's combine kernel, launched next."""
    reason = unsupported_reason(fmt, q, kv_cache, out)
    if reason is not None:
        raise ValueError(f"the CUDA MLA decode cannot take this call: {reason}")
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[2]
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be in [1, {MAX_SPLITS}], got {splits}")
    if indices.numel() and indices.stride(2) != 1:
        raise ValueError(f"indices: the topk dimension must be contiguous (stride {indices.stride(2)})")
    if out.stride(3) != 1:
        raise ValueError(f"out: the last dimension must be contiguous (stride {out.stride(3)})")
    if not 0 <= whole_tokens <= b * s_q:
        raise ValueError(f"whole_tokens must be in [0, {b * s_q}] (b * s_q), got {whole_tokens}")
    parts = split_parts(b * s_q, h_q, splits, whole_tokens)
    if parts:
        if partials is None:
            raise ValueError(f"{splits} splits need the partials' scratch (SplitPartials.allocate)")
        partials.check(parts, q.device, h_q)
    if any(t.device != q.device for t in (kv_cache, indices, out, lse)):
        raise ValueError("every tensor must be on q's device")
    if tickets is not None and parts:
        units = parts // splits
        if TICKETS_PER_CALL % splits:
            raise ValueError(f"the in-launch combine needs splits dividing {TICKETS_PER_CALL}, got {splits}")
        if tickets.dtype != torch.int32 or tickets.device != q.device or tickets.numel() < units * TICKET_STRIDE:
            raise ValueError(f"tickets: expected int32 on q's device with at least {units * TICKET_STRIDE} words")

    def ptr(t: torch.Tensor | None) -> int | None:
        return t.data_ptr() if t is not None else None

    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream
    load_decode_extension().call(
        "launch", device, stream, FORMATS[fmt.kv_format],
        q.data_ptr(), q.stride(0), q.stride(1), q.stride(2),
        kv_cache.data_ptr(), kv_cache.stride(0), geometry.block_size, geometry.data_slot_bytes, geometry.scale_base,
        geometry.scale_slot_bytes, geometry.rope_offset,
        indices.data_ptr(), indices.stride(0), indices.stride(1), ptr(topk_length), ptr(attn_sink),
        out.data_ptr(), out.stride(0), out.stride(1), out.stride(2), lse.data_ptr(), lse.stride(0), lse.stride(1), lse.stride(2),
        *(partials.pointers() if partials is not None else (None, None, None)), ptr(tickets if parts else None),
        b, s_q, h_q, topk, splits,
        whole_tokens, float(sm_scale) * LOG2_E,
    )  # fmt: skip
