"""The sparse attention's contract (``dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64``): its constants and the tensors' check.

Both kernels are built for exactly these numbers: the Triton kernels take them as constexprs and
``tl.static_assert`` their relations, the CUDA kernel's header (``csrc/attention_sm90.h``) repeats
them and ``cuda.py`` checks the built module against them on load. The entry's tensors, for T
tokens and P cache pages::

    q_nope          [T, NUM_HEADS, D_CKV]   bf16
    q_pe            [T, NUM_HEADS, D_KPE]   bf16
    ckv_cache       [P, PAGE_SIZE, D_CKV]   bf16
    kpe_cache       [P, PAGE_SIZE, D_KPE]   bf16
    sparse_indices  [T, TOPK]               int32  physical ids page * PAGE_SIZE + slot, -1 = padding
    output          [T, NUM_HEADS, D_CKV]   bf16   (written)
    lse             [T, NUM_HEADS]          f32    (written, base 2)
"""

from __future__ import annotations

import torch

NUM_HEADS = 16
D_CKV = 512  # compressed KV width; also the value width
D_KPE = 64  # RoPE key width
TOPK = 2048  # slots per token
PAGE_SIZE = 64  # tokens per cache page
#: log2(e): both kernels run the softmax in the log2 domain on sm_scale * LOG2_E
LOG2_E = 1.4426950408889634


def check_io(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, output, lse) -> int:
    """The contract's shapes, dtypes, contiguous last dimensions and one device, checked from
    metadata only (both kernels' entry, CPU or GPU); raises ValueError naming the tensor. Returns T."""
    T = q_nope.shape[0]
    expected = {
        "q_nope": (q_nope, (T, NUM_HEADS, D_CKV), torch.bfloat16),
        "q_pe": (q_pe, (T, NUM_HEADS, D_KPE), torch.bfloat16),
        "ckv_cache": (ckv_cache, (ckv_cache.shape[0], PAGE_SIZE, D_CKV), torch.bfloat16),
        "kpe_cache": (kpe_cache, (ckv_cache.shape[0], PAGE_SIZE, D_KPE), torch.bfloat16),
        "sparse_indices": (sparse_indices, (T, TOPK), torch.int32),
        "output": (output, (T, NUM_HEADS, D_CKV), torch.bfloat16),
        "lse": (lse, (T, NUM_HEADS), torch.float32),
    }
    for name, (tensor, shape, dtype) in expected.items():
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype} {list(shape)}, got {tensor.dtype} {list(tensor.shape)}")
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride {tensor.stride(-1)})")
        if tensor.device != q_nope.device:
            raise ValueError(f"{name} is on {tensor.device}, q_nope on {q_nope.device}")
    return T
