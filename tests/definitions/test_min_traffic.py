"""min_traffic_bytes: the DRAM bytes a correct kernel cannot avoid, on hand-counted cases."""

from __future__ import annotations

import torch

from dsa_bench.definitions import get_definition
from dsa_bench.definitions import indexer as idx
from dsa_bench.definitions import sparse_attention as attn
from dsa_bench.definitions.base import InputRng

CPU = torch.device("cpu")
INDEXER = get_definition(idx.NAME)
ATTENTION = get_definition(attn.NAME)


def indexer_inputs(seq_lens: list[int], table: list[list[int]], num_pages: int = 128) -> tuple[dict, dict]:
    axes = idx.DEFINITION.axes({"batch_size": len(seq_lens), "max_num_pages": len(table[0]), "num_pages": num_pages})
    given = {"seq_lens": torch.tensor(seq_lens, dtype=torch.int32), "block_table": torch.tensor(table, dtype=torch.int32)}
    assert idx.validate(axes, given, {}) == []
    return axes, idx.generate(axes, given, {}, InputRng(0, CPU))


def test_indexer_passthrough_row_reads_only_its_length_and_block_table():
    axes, inputs = indexer_inputs([200], [[7, 8, 9, 10]])
    # seq_lens 4 + 4 block-table entries of 4 B + 2048 int32 written.
    assert INDEXER.min_traffic_bytes(axes, inputs) == 4 + 4 * 4 + 2048 * 4


def test_indexer_scored_rows_count_each_shared_token_once():
    # Row 0 empty, row 1 passthrough (100 tokens, 2 pages), row 2 scored (2049 tokens: pages
    # 10..42, the last holding one token), row 3 scored (3000 tokens, 47 pages) whose first 32
    # pages are row 2's first 32 (2048 shared tokens), the rest its own.
    width = 47
    row2 = list(range(10, 43)) + [0] * (width - 33)
    row3 = list(range(10, 42)) + list(range(60, 75))
    table = [[0] * width, [1, 2] + [0] * (width - 2), row2, row3]
    axes, inputs = indexer_inputs([0, 100, 2049, 3000], table)
    distinct_tokens = 2048 + 1 + (3000 - 2048)  # shared pages, row 2's own token, row 3's own
    expected = (
        4 * 4  # seq_lens
        + 4 * (2 + 33 + 47)  # block-table entries the rows reach
        + 2 * (64 * 128 + 64 * 4)  # query and weights of the two scored rows
        + 132 * distinct_tokens  # key records
        + 4 * 2048 * 4  # output
    )
    assert expected == 446_140
    assert INDEXER.min_traffic_bytes(axes, inputs) == expected
    # The same rows on pages of their own read the 2048 shared tokens' records twice.
    table[3] = list(range(80, 127))
    axes, apart = indexer_inputs([0, 100, 2049, 3000], table)
    assert INDEXER.min_traffic_bytes(axes, apart) == expected + 132 * 2048


def attention_inputs(rows: list[list[int]], num_pages: int = 8) -> tuple[dict, dict]:
    axes = attn.DEFINITION.axes({"num_tokens": len(rows), "num_pages": num_pages})
    indices = torch.full((len(rows), attn.TOPK), -1, dtype=torch.int32)
    for t, ids in enumerate(rows):
        positions = torch.randperm(attn.TOPK, generator=torch.Generator().manual_seed(t))[: len(ids)]
        indices[t, positions] = torch.tensor(ids, dtype=torch.int32)  # scattered padding
    return axes, attn.generate(axes, {"sparse_indices": indices}, {}, InputRng(0, CPU))


def test_attention_counts_distinct_slots_once_and_no_query_for_empty_tokens():
    axes, inputs = attention_inputs([list(range(100)), [], list(range(50, 150))])
    expected = (
        3 * 2048 * 4  # indices
        + 2 * 16 * (512 + 64) * 2  # q_nope and q_pe of the two tokens with valid slots
        + 150 * (512 + 64) * 2  # ckv and kpe of slots 0..149, the 50 shared ones once
        + 3 * (16 * 512 * 2 + 16 * 4)  # output and lse
    )
    assert expected == 283_584
    assert ATTENTION.min_traffic_bytes(axes, inputs) == expected


def test_attention_all_empty_tokens_read_only_indices():
    axes, inputs = attention_inputs([[], []])
    assert ATTENTION.min_traffic_bytes(axes, inputs) == 2 * 2048 * 4 + 2 * (16 * 512 * 2 + 16 * 4)
