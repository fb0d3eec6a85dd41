"""dsa-bench's reference implementations, wrapped in destination-passing style."""

import torch

from dsa_bench.definitions import indexer as indexer_definition
from dsa_bench.definitions import sparse_attention as attention_definition


def indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices: torch.Tensor) -> None:
    result = indexer_definition.reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    topk_indices.copy_(result["topk_indices"])


def sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output: torch.Tensor, lse: torch.Tensor) -> None:
    result = attention_definition.reference(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)
    output.copy_(result["output"])
    lse.copy_(result["lse"])
