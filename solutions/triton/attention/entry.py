"""Sparse MLA attention (``dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64``): CUDA on a GPU, Triton elsewhere.

Entry point (destination-passing style)::

    kernel(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse)

    q_nope          [T, 16, 512]  bf16   query, no-RoPE part (multiplies the 512-wide ckv row)
    q_pe            [T, 16, 64]   bf16   query, RoPE part (multiplies the 64-wide kpe row)
    ckv_cache       [P, 64, 512]  bf16   compressed KV, also the value
    kpe_cache       [P, 64, 64]   bf16   RoPE key
    sparse_indices  [T, 2048]     int32  physical ids page*64 + slot, -1 = padding (anywhere in the row)
    sm_scale        python float
    output          [T, 16, 512]  bf16   written: softmax(logits) @ ckv rows, 0 for a token without slots
    lse             [T, 16]       f32    written: log2(sum(exp(logits))), -inf for a token without slots

On a GPU the entry runs the hand-written kernel of ``csrc/attention_sm90.cu`` (built just in time
by ``cuda.py``): strided split-K over the slots in tiles of 64 with bulk-copy (TMA) gathers
and mma.sync, bf16 partials, and the combine in the same launch, in one of two ways (``policy.cuda_plan``):
path ``cuda`` behind a per-token ticket barrier in global memory whenever the grid is
co-resident (else a second launch), or path ``cuda_cluster`` with each token's programs forming
one thread-block cluster that combines through distributed shared memory. On an H200: T <= 2
takes 32 splits with the barrier, T <= 7 (clusters of 16 resident at once) the cluster, T = 8
16 splits with the barrier. Its design is described at the top of that file.

Under the Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors), where the CUDA kernel cannot
run, the Triton kernels of ``triton_kernels.py`` do (``policy.interpreter_plan``). The shapes and
constants of the contract are in ``shapes.py``.
"""

from __future__ import annotations

import torch

from ..common.interpreter import INTERPRETED, interpreted
from . import cuda, triton_kernels
from .policy import CUDA_COMBINES, CUDA_PATHS, DSPLIT_MAX_TOKENS_INTERPRETER, Plan, default_plan
from .shapes import check_io


def sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse, plan: Plan | None = None) -> Plan:
    """Write ``output`` and ``lse`` (see the module docstring for shapes). Returns the plan used."""
    T = check_io(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, output, lse)
    device = q_nope.device
    plan = plan or default_plan(T, device)
    plan.validate()
    if T == 0:
        return plan
    args = (q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, float(sm_scale), output, lse)
    if plan.path not in CUDA_PATHS:
        triton_kernels.launch(plan, *args)
    elif interpreted(device):
        raise ValueError(f"{plan}: the CUDA kernel needs CUDA tensors and compiled kernels, not the Triton interpreter")
    else:
        cuda.launch(*args, plan.splits, CUDA_COMBINES[plan.path], plan.gather_lag)
    return plan


def kernel(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse) -> None:
    """dsa-bench entry point (destination-passing style)."""
    sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse)


def solution_notes() -> str:
    if INTERPRETED:
        return (
            f"sparse attention under the Triton interpreter: T <= {DSPLIT_MAX_TOKENS_INTERPRETER} value-split kernel, "
            "larger T strided split-K with a separate combine launch; the CUDA kernel (GPU only) is not used on this machine"
        )
    return (
        "sparse attention: hand-written CUDA kernel (attention_sm90.cu; bulk-copy (TMA) gathers, mma.sync bf16), strided "
        "split-K in 64-slot tiles, the combine in the same launch: T <= 2 with 32 splits behind a per-token ticket barrier, "
        "T <= 7 with 16 splits as one thread-block cluster per token (distributed shared memory), T = 8 with 16 splits "
        "behind the barrier, the second tile's gather lagging the first's; a second launch when the grid cannot be co-resident"
    )


#: Built at import on a GPU, so that the harness reports a missing nvcc or a build failure as
#: this solution's compile error.
if not INTERPRETED and torch.cuda.is_available():
    cuda.load_attention_extension()
