"""The definitions' math one row (indexer) or one token (attention) at a time: the executable spec.

These are the references as they were before they were batched (dsa_bench/definitions/indexer.py
and sparse_attention.py now compute every row at once on the device). They stay here, written
straight from the contract text with a Python loop, so tests/definitions/test_references.py can cross-check
the batched references against them on fresh random inputs and edge cases.
"""

from __future__ import annotations

import math

import torch

from dsa_bench.definitions.indexer import HEAD_DIM, PAGE_SIZE, TOPK, token_ids
from dsa_bench.definitions.kv_records import INDEXER_KEY_PAGE

_SCALES_AT = INDEXER_KEY_PAGE.offsets(0)["scales"]  # the indexer page's value rows end here


def indexer_row_scores(
    q_row: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights_row: torch.Tensor, block_table_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """``[seq_len]`` float32 scores of one row: ``Σ_h w[h]·relu(q[h]·K[j])`` times the token's scale."""
    pages = block_table_row[: -(-seq_len // PAGE_SIZE)].long()
    raw = INDEXER_KEY_PAGE.raw_pages(k_index_cache_fp8)[pages]  # gather bytes: fp8 has no index kernel
    keys = raw[:, :_SCALES_AT].view(torch.float8_e4m3fn)
    keys = keys.reshape(-1, HEAD_DIM)[:seq_len].float()
    scales = raw[:, _SCALES_AT:].contiguous().view(torch.float32).reshape(-1)[:seq_len]
    logits = q_row.float() @ keys.T  # [heads, seq_len]
    return (logits.relu() * weights_row.float()[:, None]).sum(dim=0) * scales


def indexer_per_row(
    q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor
) -> torch.Tensor:
    """``[batch, 2048]`` int32: a row of L <= 2048 tokens is all its ids in position order, a longer
    row the ids of its 2048 best scores (torch.topk order); then -1."""
    batch = q_index_fp8.shape[0]
    out = torch.full((batch, TOPK), -1, dtype=torch.int32, device=q_index_fp8.device)
    for b, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        ids = token_ids(block_table[b], seq_len)
        if seq_len > TOPK:
            scores = indexer_row_scores(q_index_fp8[b], k_index_cache_fp8, weights[b], block_table[b], seq_len)
            ids = ids[torch.topk(scores, TOPK).indices]
        out[b, : ids.numel()] = ids.to(torch.int32)
    return out


def attention_per_token(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    sparse_indices: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``output [T, 16, 512]`` and base-2 ``lse [T, 16]``, one token at a time over its
    valid indices; a token with none has output 0 and lse -inf."""
    tokens, heads, ckv_dim = q_nope.shape
    output = torch.zeros(tokens, heads, ckv_dim, dtype=torch.float32)
    lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32)
    ckv_rows = ckv_cache.reshape(-1, ckv_dim)
    kpe_rows = kpe_cache.reshape(-1, kpe_cache.shape[-1])
    for t in range(tokens):
        row = sparse_indices[t]
        valid = row[row >= 0].long()
        if valid.numel() == 0:
            continue
        ckv = ckv_rows[valid].float()
        kpe = kpe_rows[valid].float()
        logits = (q_nope[t].float() @ ckv.T + q_pe[t].float() @ kpe.T) * float(sm_scale)  # [heads, valid]
        lse[t] = torch.logsumexp(logits, dim=-1) / math.log(2.0)
        output[t] = torch.softmax(logits, dim=-1) @ ckv
    return output, lse
