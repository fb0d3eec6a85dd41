// Host-side interface of the filtered radix top-k (plain C++; no CUDA kernels, no torch).
//
// Shared by topk_filtered.cu (the launcher) and topk_capi.cpp (the C ABI that indexer/cuda_topk.py
// calls through ctypes); nvcc links both into one shared library (common/cuda_build.py).
#pragma once

#include <cstdint>

#ifndef DSA_TOPK_HOST_EMULATION
#include <cuda_runtime_api.h>
#endif

namespace dsa_topk {

// Contract of dsa_topk_indexer_fp8_h64_d128_topk2048_ps64.
constexpr int kTopK = 2048;    // the most tokens kept per row (TopkArgs::topk picks 2048 or V4's 512 / 1024)
constexpr int kPageSize = 64;  // tokens per cache page

// Largest candidate buffer (entries) a block keeps in shared memory: two ping-pong buffers of
// 8-byte (key, position) pairs, 128 KiB at this size, which Hopper's 227 KiB per block allows.
constexpr int kMaxCandidates = 8192;

// Largest threshold bin the fast path ranks directly (see topk_filtered.cuh).
constexpr int kFastCandidates = 1024;

struct TopkArgs {
  const float* scores;        // [batch, score_stride] fp32 scores, position-major per row
  int64_t score_stride;       // elements between rows; a multiple of 4 (16-byte aligned rows)
  const int32_t* seq_lens;    // [batch]
  const int32_t* block_table; // [batch, bt_stride] page ids
  int64_t bt_stride;
  int32_t* out;               // [batch, out_stride] physical ids, written: kTopK per row
  int64_t out_stride;
  int batch;
  int max_len;                // score_stride rounded to pages: the longest row possible
  int candidate_capacity;     // entries per shared buffer; < 0 picks the default
  int fast_candidates;        // fast path's largest directly ranked bin; 0: radix select only; < 0: kFastCandidates
  int dependent_launch;       // 1: launch as a programmatic dependent of the stream's previous kernel
                              // (the score kernel): the blocks start during its tail, copy their
                              // block-table rows, and read scores only after it has completed
  int topk;                   // tokens kept per row, 1..kTopK: the definition's k (out holds topk per row)
  // Split rows (launch_split_topk; 0 elsewhere): each row is cut into chunks of split_len tokens.
  int split_len;              // tokens per chunk: a multiple of kPageSize above kTopK
  int split_chunks;           // chunks per row: ceil(max_len / split_len)
  int32_t* partial;           // [batch * split_chunks, topk] each chunk's selection as row positions
};

// Split rows: the top-k of a row is among the union of its chunks' top-k. Stage 1 selects each
// chunk's top-k with one block per chunk (a row's chunks run on different SMs at once) and writes
// them to `partial` as row positions (a chunk of at most topk tokens lists all of them); stage 2,
// one block per row and the programmatic dependent of stage 1, selects the row's top-k among its
// chunks' selections (at most split_chunks * topk scores, read through `partial`) and writes the
// physical ids. Every chunk but a row's last holds split_len > topk tokens and gives exactly topk
// positions, so a row's candidates are the first (chunks - 1) * topk + min(last chunk, topk)
// entries of its `partial` rows.
constexpr int kSplitMaxChunkLen = 32768;  // stage 1's blocks keep a chunk in registers or shared memory
constexpr int kSplitMaxCandidates = 32768;  // stage 2's likewise: split_chunks * topk

#ifndef DSA_TOPK_HOST_EMULATION
// Launches the top-k on `stream`. Returns the CUDA error of the launch (cudaSuccess when fine).
cudaError_t launch_filtered_topk(const TopkArgs& args, cudaStream_t stream);
// Launches both stages of the split top-k (above) on `stream`; the caller has checked split_len,
// split_chunks, partial and that topk is a multiple of 4 (stage 2 reads `partial` as int4).
cudaError_t launch_split_topk(const TopkArgs& args, cudaStream_t stream);
#endif

// Candidate capacity the launcher uses for rows up to `max_len` when none is requested: a row's
// threshold bin never holds more than the row, so max_len entries always suffice.
inline int default_candidate_capacity(int max_len) { return max_len < kMaxCandidates ? max_len : kMaxCandidates; }

}  // namespace dsa_topk
