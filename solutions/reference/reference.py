"""dsa-bench's reference implementations, wrapped in destination-passing style."""

import torch

from dsa_bench.definitions import decode_step as decode_step_definition
from dsa_bench.definitions import indexer as indexer_definition
from dsa_bench.definitions import kv_insert as kv_insert_definition
from dsa_bench.definitions import mla_decode as mla_decode_definition
from dsa_bench.definitions import sparse_attention as attention_definition


def indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices: torch.Tensor) -> None:
    result = indexer_definition.reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    topk_indices.copy_(result["topk_indices"])


def sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output: torch.Tensor, lse: torch.Tensor) -> None:
    result = attention_definition.reference(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)
    output.copy_(result["output"])
    lse.copy_(result["lse"])


def kv_insert_v32(kv_c, k_pe, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    kv_insert_definition.insert(kv_insert_definition.V32, {"kv_c": kv_c, "k_pe": k_pe, "slot_mapping": slot_mapping,
                                                           "block_size": block_size}, kv_cache)


def _rotating_insert(fmt, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    inputs = {"kv": kv, "positions": positions, "cos_sin_cache": cos_sin_cache, "slot_mapping": slot_mapping, "block_size": block_size}
    kv_insert_definition.insert(fmt, inputs, kv_cache)


def kv_insert_v4(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    _rotating_insert(kv_insert_definition.V4, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)


def kv_insert_v41(kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache: torch.Tensor) -> None:
    _rotating_insert(kv_insert_definition.V41, kv, positions, cos_sin_cache, slot_mapping, block_size, kv_cache)


def _mla_decode(fmt, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out: torch.Tensor, lse: torch.Tensor) -> None:
    result = mla_decode_definition.decode(fmt, q, kv_cache, indices, sm_scale, attn_sink, topk_length)
    out.copy_(result["out"])
    lse.copy_(result["lse"])


def mla_decode_v32(q, kv_cache, indices, sm_scale, attn_sink, out: torch.Tensor, lse: torch.Tensor) -> None:
    _mla_decode(mla_decode_definition.V32, q, kv_cache, indices, sm_scale, attn_sink, None, out, lse)


def mla_decode_v4(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out: torch.Tensor, lse: torch.Tensor) -> None:
    _mla_decode(mla_decode_definition.V4, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)


def mla_decode_v41(q, kv_cache, indices, sm_scale, attn_sink, topk_length, out: torch.Tensor, lse: torch.Tensor) -> None:
    _mla_decode(mla_decode_definition.V41, q, kv_cache, indices, sm_scale, attn_sink, topk_length, out, lse)


def _decode_step(fmt, inputs: dict, out: torch.Tensor, lse: torch.Tensor, topk_indices: torch.Tensor) -> None:
    result = decode_step_definition.step(fmt, inputs, topk_indices.shape[-1])  # the caches are updated in place
    out.copy_(result["out"])
    lse.copy_(result["lse"])
    topk_indices.copy_(result["topk_indices"])


def decode_step_v32(q, kv_c, k_pe, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens, block_table,
                    sm_scale, attn_sink, out: torch.Tensor, lse: torch.Tensor, topk_indices: torch.Tensor) -> None:
    inputs = {"q": q, "kv_c": kv_c, "k_pe": k_pe, "index_k": index_k, "slot_mapping": slot_mapping, "kv_cache": kv_cache,
              "index_cache": index_cache, "q_index_fp8": q_index_fp8, "weights": weights, "seq_lens": seq_lens,
              "block_table": block_table, "sm_scale": sm_scale, "attn_sink": attn_sink}
    _decode_step(decode_step_definition.V32, inputs, out, lse, topk_indices)


def decode_step_v4(q, kv, positions, cos_sin_cache, index_k, slot_mapping, kv_cache, index_cache, q_index_fp8, weights, seq_lens,
                   block_table, sm_scale, attn_sink, out: torch.Tensor, lse: torch.Tensor, topk_indices: torch.Tensor) -> None:
    inputs = {"q": q, "kv": kv, "positions": positions, "cos_sin_cache": cos_sin_cache, "index_k": index_k,
              "slot_mapping": slot_mapping, "kv_cache": kv_cache, "index_cache": index_cache, "q_index_fp8": q_index_fp8,
              "weights": weights, "seq_lens": seq_lens, "block_table": block_table, "sm_scale": sm_scale, "attn_sink": attn_sink}
    _decode_step(decode_step_definition.V4, inputs, out, lse, topk_indices)
