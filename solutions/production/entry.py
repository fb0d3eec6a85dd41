"""Peer: one DSA decode step as a deployment composes it from production kernels (``dsa_decode_step_{v32,v4}``).

    step_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
             sm_scale, attn_sink) -> {"out", "lse", "topk_indices"}
    step_v4(q, kv, positions, cos_sin_cache, index_k, ...same...) -> the same

1. KV writes, in torch (this peer's own; a serving engine uses its CUDA writer kernels, vLLM's
   ``concat_and_cache_mla`` / ``indexer_k_quant_and_cache``, not installable here): the record bytes from the
   ``kv_records`` descriptors' quantizers (the definition's writer conventions), scattered into both caches
   without a host synchronisation: a -1 slot repeats the write of the first kept token (the same bytes to the
   same place), or rewrites slot 0's current bytes when no token is kept.
2. Indexer scores and top-k: the ``deepgemm_flashinfer`` peer's entry (DeepGEMM ``fp8_paged_mqa_logits``, then
   FlashInfer ``top_k_page_table_transform``, page size 64, graph-replayed), on ``b * s_q`` rows (row ``(b, s)``
   sees ``L_b - (s_q - 1 - s)`` tokens). The rows' lengths, repeated block table and the ids buffer are batch
   state, made once per (seq_lens, block_table) pair like DeepGEMM's schedule (an engine makes them once per step
   for all layers); the ids are written afresh every call.
3. Sparse decode: the ``flashmla`` peer's entry (FlashMLA's legacy SM90 path, heads padded to 64 where h_q < 64),
   fed the top-k's ids directly (block size 64 for both caches: the ids are the decode's).

The three stages are replayed as one CUDA graph per batch and argument set (``GraphReplay``), as a serving
engine replays its decode step; the peers' own graphs run inside that capture as plain launches.

The files ``flashmla_entry.py``, ``heads.py``, ``deepgemm_flashinfer_entry.py`` and ``batch_state.py`` are
symbolic links to the two peers' own files, so the three peers run the same code.
"""

from __future__ import annotations

import functools

import torch

from dsa_bench.definitions.kv_insert import V4, V32, expected_records
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE, KvRecordFormat

from . import deepgemm_flashinfer_entry as indexer_peer
from . import flashmla_entry as decode_peer
from .batch_state import BatchCache, GraphReplay
from .kv_writes import write_records

BLOCK_SIZE = INDEXER_KEY_PAGE.block_size
TOPK = 2048
INDEX_HEADS = 64


def solution_notes() -> str:
    return ("decode step from production kernels: KV writes in torch (descriptor quantizers, sync-free scatter); indexer "
            f"[{indexer_peer.solution_notes()}]; decode [{decode_peer.solution_notes()}]; the step: {_step_graphs.notes()}")


def _batch_of(s_q: int, topk: int, seq_lens: torch.Tensor, block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch's indexer rows (lengths and block table, one row per query row) and its ids buffer: made once per
    (seq_lens, block_table) pair, so the indexer peer's CUDA graphs see the same addresses call after call."""
    b = block_table.shape[0]
    ids = torch.empty(b, s_q, topk, dtype=torch.int32, device=block_table.device)
    if s_q == 1:
        return seq_lens, block_table, ids
    shift = torch.arange(s_q, device=seq_lens.device) - (s_q - 1)
    lens = (seq_lens[:, None] + shift[None, :]).clamp_min(0).to(torch.int32).reshape(-1)
    return lens, block_table.repeat_interleave(s_q, dim=0).contiguous(), ids


#: per (s_q, topk, sm_scale): sm_scale is baked into a captured step, so each value has its own states and graphs
_batches: dict[tuple[int, int, float], BatchCache] = {}
_step_graphs = GraphReplay()


def _step(fmt: KvRecordFormat, decode, rows: dict, index_k, slot_mapping, kv_cache, index_cache, q, q_index_fp8, weights, seq_lens,
          block_table, sm_scale, attn_sink, topk: int = TOPK) -> dict[str, torch.Tensor]:  # fmt: skip
    b, s_q = slot_mapping.shape
    slots = slot_mapping.reshape(b * s_q)
    cache = _batches.setdefault((s_q, topk, float(sm_scale)), BatchCache(functools.partial(_batch_of, s_q, topk)))
    state = cache.get(seq_lens, block_table)
    lens, table, ids = state.data

    def launch() -> tuple[torch.Tensor, torch.Tensor]:
        write_records(fmt, kv_cache, slots, expected_records(fmt, {**rows, "slot_mapping": slots, "block_size": BLOCK_SIZE}).parts)
        write_records(INDEXER_KEY_PAGE, index_cache, slots, INDEXER_KEY_PAGE.quantize(index_k.reshape(b * s_q, -1).float(), "raw"))
        indexer_peer.kernel(q_index_fp8.reshape(b * s_q, INDEX_HEADS, -1), index_cache, weights.reshape(b * s_q, INDEX_HEADS), lens,
                            table, ids.view(b * s_q, topk))  # fmt: skip
        return decode(q, kv_cache, ids, sm_scale, attn_sink)

    tensors = (q, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table, *rows.values(),
               *([attn_sink] if isinstance(attn_sink, torch.Tensor) else []))  # fmt: skip
    out, lse = _step_graphs(state, launch, tensors)
    return {"out": out, "lse": lse, "topk_indices": ids}


def step_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table, sm_scale,
             attn_sink) -> dict[str, torch.Tensor]:  # fmt: skip
    t = slot_mapping.numel()
    rows = {"kv_c": kv_c.reshape(t, -1), "k_pe": k_pe.reshape(t, -1)}
    return _step(V32, decode_peer.decode_v32, rows, index_k, slot_mapping, kv_cache, index_cache, q, q_index_fp8, weights, seq_lens,
                 block_table, sm_scale, attn_sink)


def step_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
            sm_scale, attn_sink, topk: int = TOPK) -> dict[str, torch.Tensor]:  # fmt: skip
    """dsa_decode_step_v4 (and, with ``topk`` 512 or 1024, the V4 models' other selection sizes)."""
    t = slot_mapping.numel()
    rows = {"kv": kv.reshape(t, -1), "positions": positions.reshape(t), "cos_sin_cache": cos_sin_cache}

    def decode(q, kv_cache, ids, sm_scale, attn_sink):  # no topk_length: -1 entries are not counted
        return decode_peer.decode_v4(q, kv_cache, ids, sm_scale, attn_sink, None)

    return _step(V4, decode, rows, index_k, slot_mapping, kv_cache, index_cache, q, q_index_fp8, weights, seq_lens, block_table,
                 sm_scale, attn_sink, topk)


step_v4_topk512 = functools.partial(step_v4, topk=512)
step_v4_topk1024 = functools.partial(step_v4, topk=1024)
