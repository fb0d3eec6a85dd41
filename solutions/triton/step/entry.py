"""One DSA decode step (``dsa_decode_step_v32``, ``dsa_decode_step_v4``) composed of this solution's own kernels.

Entry points (destination-passing style; both caches are updated in place)::

    step_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
             block_table, sm_scale, attn_sink, out, lse, topk_indices)
    step_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights,
            seq_lens, block_table, sm_scale, attn_sink, out, lse, topk_indices)

The stages, each this solution's kernel called through its entry function, all on the device:

1. the MLA records: ``kv_insert``'s Triton kernel on the cache's ``[num_blocks, page_bytes]`` backing;
2. the indexer keys: ``triton_kernels.py``'s Triton key insert (the kv_insert family has no indexer-key format);
3. the indexer and its top-k: ``indexer``'s entry on ``b * s_q`` rows (row ``(b, s)`` sees
   ``L_b - (s_q - 1 - s)`` tokens; the row lengths and the repeated block table are computed on the device
   into scratch buffers kept per input set, so the indexer's CUDA graphs see stable addresses);
4. the sparse decode: ``decode``'s entry, fed ``topk_indices`` itself: with block size 64 for both caches the
   indexer's physical ids ``page * 64 + slot`` are the decode's ``block * block_size + offset``, so there is
   no conversion and no host round trip. V4's ``topk_length`` is not passed: -1 entries are not counted.

The four stages are launched back to back and, on a GPU, replayed as one CUDA graph per argument set
(``LaunchGraphs``, as the indexer's scored path is): launched from Python, a call's kernels wait on the
host's launches between them (on an H100, 28 µs of kernels in a 359 µs call at b = 1), where a serving
engine replays its decode step as a graph. The stages' own graphs run inside that capture as plain
launches. Fusing across the handoffs (the top-k writing straight into the decode's schedule, the key
insert inside the indexer's pass) is future work (docs/decode_step.md).
"""

from __future__ import annotations

import torch

from ..common.interpreter import INTERPRETED
from ..common.kv_records import INDEXER_KEY_PAGE
from ..common.launch_graphs import LaunchGraphs
from ..decode import entry as decode_entry
from ..indexer import entry as indexer_entry
from ..kv_insert import entry as kv_insert_entry
from .triton_kernels import insert_keys

BLOCK_SIZE = INDEXER_KEY_PAGE.block_size
INDEX_HEADS = 64


def solution_notes() -> str:
    failed = [g.disabled_reason for g in (_graphs_v32, _graphs_v4) if getattr(g, "disabled_reason", None)]
    launches = ("four stages, not fused, " + (f"launched eagerly: CUDA graph capture failed ({failed[0]})" if failed
                else "replayed as one CUDA graph per argument set" if _graphs_v32 is not _launch_v32 else "launched back to back"))
    return ("decode step: kv_insert (Triton), key insert (Triton), indexer [" + indexer_entry.solution_notes() + "], decode ["
            + decode_entry.solution_notes() + "]; " + launches)


class _RowScratch:
    """Per input set (keyed by the addresses and shapes of seq_lens and block_table): the indexer rows' lengths and
    block table, recomputed on the device every call (values may change; addresses stay)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, seq_lens: torch.Tensor, block_table: torch.Tensor, s_q: int) -> tuple[torch.Tensor, torch.Tensor]:
        if s_q == 1:
            return seq_lens, block_table
        key = (seq_lens.data_ptr(), block_table.data_ptr(), tuple(block_table.shape), s_q, seq_lens.device)
        if key not in self.buffers:
            if len(self.buffers) > 64:
                self.buffers.clear()
            b, pages = block_table.shape
            self.buffers[key] = (torch.empty(b * s_q, dtype=torch.int32, device=seq_lens.device),
                                 torch.empty(b * s_q, pages, dtype=torch.int32, device=seq_lens.device))
        lens, table = self.buffers[key]
        shift = torch.arange(s_q, device=seq_lens.device) - (s_q - 1)
        lens.view(-1, s_q).copy_((seq_lens[:, None] + shift[None, :]).clamp_min(0))
        table.view(-1, s_q, block_table.shape[1]).copy_(block_table[:, None, :])
        return lens, table


_scratch = _RowScratch()


def _step(insert_mla, decode, q, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
          sm_scale, attn_sink, out, lse, topk_indices) -> None:  # fmt: skip
    b, s_q = slot_mapping.shape
    if kv_cache.stride(1) * kv_cache.shape[1] > kv_cache.stride(0):
        raise ValueError(f"kv_cache: page stride {kv_cache.stride(0)} B is below its {kv_cache.shape[1]} records")
    backing = kv_cache.view(torch.uint8).as_strided((kv_cache.shape[0], kv_cache.stride(0)), (kv_cache.stride(0), 1))
    slots = slot_mapping.reshape(b * s_q)
    insert_mla(slots, backing)
    insert_keys(index_k.reshape(b * s_q, -1), slots, index_cache)
    lens, table = _scratch.rows(seq_lens, block_table, s_q)
    topk = topk_indices.shape[-1]
    select = indexer_entry.kernel if topk == indexer_entry.TOPK else indexer_entry.other_topk_kernel  # V4's 512 and 1024
    select(q_index_fp8.reshape(b * s_q, INDEX_HEADS, -1), index_cache, weights.reshape(b * s_q, INDEX_HEADS), lens, table,
           topk_indices.view(b * s_q, topk))
    decode(q, kv_cache, topk_indices, sm_scale, attn_sink, out, lse)


def _launch_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
                sm_scale, attn_sink, out, lse, topk_indices) -> None:  # fmt: skip
    t = slot_mapping.numel()

    def insert_mla(slots: torch.Tensor, backing: torch.Tensor) -> None:
        kv_insert_entry.kv_insert_v32(kv_c.reshape(t, -1), k_pe.reshape(t, -1), slots, BLOCK_SIZE, backing)

    _step(insert_mla, decode_entry.kernel_v32, q, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
          block_table, sm_scale, attn_sink, out, lse, topk_indices)


def _launch_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
               block_table, sm_scale, attn_sink, out, lse, topk_indices) -> None:  # fmt: skip
    t = slot_mapping.numel()

    def insert_mla(slots: torch.Tensor, backing: torch.Tensor) -> None:
        kv_insert_entry.kv_insert_v4(kv.reshape(t, -1), positions.reshape(t), cos_sin_cache, slots, BLOCK_SIZE, backing)

    def decode(q, kv_cache, ids, sm_scale, attn_sink, out, lse) -> None:
        decode_entry.kernel_v4(q, kv_cache, ids, sm_scale, attn_sink, None, out, lse)

    _step(insert_mla, decode, q, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
          sm_scale, attn_sink, out, lse, topk_indices)


def _graphed(launch):
    """``launch`` replayed as one CUDA graph per argument set on a GPU (every argument is a tensor, None or
    a float: the key of its graph); called directly under the interpreter and on a CPU."""
    return LaunchGraphs(launch) if torch.cuda.is_available() and not INTERPRETED else launch


_graphs_v32 = _graphed(_launch_v32)
_graphs_v4 = _graphed(_launch_v4)


def step_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table, sm_scale,
             attn_sink, out, lse, topk_indices) -> None:  # fmt: skip
    """dsa_decode_step_v32 (destination-passing style)."""
    _graphs_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table, sm_scale,
                attn_sink, out, lse, topk_indices)


def step_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
            block_table, sm_scale, attn_sink, out, lse, topk_indices) -> None:  # fmt: skip
    """dsa_decode_step_v4 (destination-passing style)."""
    _graphs_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
               block_table, sm_scale, attn_sink, out, lse, topk_indices)
