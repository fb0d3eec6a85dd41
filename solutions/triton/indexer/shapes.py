"""The indexer's contract constants (``dsa_topk_indexer_fp8_h64_d128_topk2048_ps64``) and its cache page layout.

Every kernel of this folder is built for exactly these numbers: the Triton kernels take them as
constexprs and ``tl.static_assert`` their relations, the CUDA top-k's header
(``csrc/topk_filtered.h``) repeats TOPK and PAGE_SIZE and ``cuda_topk.py`` checks the built module
against them on load. The entry's tensors, for B rows of block tables of max_num_pages columns::

    q_index_fp8        [B, NUM_HEADS, HEAD_DIM]                       float8_e4m3fn
    k_index_cache_fp8  [num_pages, PAGE_SIZE, 1, BYTES_PER_TOKEN]     int8 (PAGE_BYTES per page)
    weights            [B, NUM_HEADS]                                 float32
    seq_lens           [B]                                            int32
    block_table        [B, max_num_pages]                             int32
    topk_indices       [B, TOPK]                                      int32 (written)
"""

NUM_HEADS = 64  # index heads per query
HEAD_DIM = 128  # FP8 values per key
PAGE_SIZE = 64  # tokens per cache page
TOPK = 2048  # tokens kept per row
#: DeepGEMM paged layout of one cache page: all tokens' FP8 values, then one fp32 scale per token.
PAGE_VALUE_BYTES = PAGE_SIZE * HEAD_DIM  # 8192
SCALE_BYTES = 4
PAGE_BYTES = PAGE_VALUE_BYTES + PAGE_SIZE * SCALE_BYTES  # 8448
BYTES_PER_TOKEN = HEAD_DIM + SCALE_BYTES  # 132: the cache tensor's last dim (a view, not the layout)
assert PAGE_BYTES == PAGE_SIZE * BYTES_PER_TOKEN
assert PAGE_VALUE_BYTES % 16 == 0, "scales must start 16-byte aligned inside a page"
assert TOPK % PAGE_SIZE == 0
