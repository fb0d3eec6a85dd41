// C ABI of the filtered radix top-k, loaded by indexer/cuda_topk.py through ctypes.
//
// Plain C++ over the CUDA runtime (no torch, no pybind11: their headers were most of a fresh
// machine's build time). It takes device pointers, strides in elements, the caller's stream and
// device, and returns 0, a cudaError_t value (> 0), or one of the argument errors below (< 0);
// dsa_topk_error_string names any of them. indexer/cuda_topk.py checks every argument before the
// call; the checks here only guard what this file hands on to the launcher.
#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "topk_filtered.h"
#include "../../common/csrc/capi.h"

namespace {

enum ArgumentError : int {
  kTooLarge = -1,
  kMisalignedScores = -2,
  kBadCandidateCapacity = -3,
  kBadFastCandidates = -4,
  kNullPointer = -5,
  kBadTopk = -6,
  kBadSplit = -7,
};

}  // namespace

// Constants of topk_filtered.h, which indexer/cuda_topk.py compares with its own on load.
DSA_EXPORT const int64_t dsa_topk_TOPK = dsa_topk::kTopK;
DSA_EXPORT const int64_t dsa_topk_PAGE_SIZE = dsa_topk::kPageSize;
DSA_EXPORT const int64_t dsa_topk_MAX_CANDIDATES = dsa_topk::kMaxCandidates;
DSA_EXPORT const int64_t dsa_topk_FAST_CANDIDATES = dsa_topk::kFastCandidates;
DSA_EXPORT const int64_t dsa_topk_SPLIT_MAX_CHUNK_LEN = dsa_topk::kSplitMaxChunkLen;
DSA_EXPORT const int64_t dsa_topk_SPLIT_MAX_CANDIDATES = dsa_topk::kSplitMaxCandidates;

DSA_EXPORT const char* dsa_topk_error_string(int code) {
  switch (code) {
    case kTooLarge: return "problem too large for 32-bit indexing";
    case kMisalignedScores: return "score rows must be 16-byte aligned (the kernel reads them as float4)";
    case kBadCandidateCapacity: return "candidate_capacity must be -1 or non-negative";
    case kBadFastCandidates: return "fast_candidates must be -1 or 0..FAST_CANDIDATES";
    case kNullPointer: return "null tensor pointer";
    case kBadTopk: return "topk must be in 1..TOPK";
    case kBadSplit: return "split rows need split_len a multiple of PAGE_SIZE in (topk, SPLIT_MAX_CHUNK_LEN], split_chunks * split_len >= max_len, split_chunks * topk <= SPLIT_MAX_CANDIDATES and topk a multiple of 4";
    default: return code >= 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown argument error";
  }
}

namespace {

// The checks and arguments both entry points share; returns 0 and fills `args`, or an ArgumentError.
int common_args(const float* scores, int64_t score_stride, const int32_t* seq_lens, const int32_t* block_table, int64_t bt_stride,
                int32_t* topk_indices, int64_t out_stride, int64_t batch, int64_t max_len, int64_t candidate_capacity,
                int64_t fast_candidates, int dependent_launch, int64_t topk, dsa_topk::TopkArgs& args) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (batch < 0 || batch > kIntMax || max_len < 0 || max_len > kIntMax) return kTooLarge;
  if (score_stride % 4 != 0 || reinterpret_cast<uintptr_t>(scores) % 16 != 0) return kMisalignedScores;
  if (candidate_capacity < -1 || candidate_capacity > kIntMax) return kBadCandidateCapacity;
  if (fast_candidates < -1 || fast_candidates > dsa_topk::kFastCandidates) return kBadFastCandidates;
  if (topk < 1 || topk > dsa_topk::kTopK) return kBadTopk;
  if (batch > 0 && (scores == nullptr || seq_lens == nullptr || block_table == nullptr || topk_indices == nullptr)) return kNullPointer;
  args = dsa_topk::TopkArgs{};
  args.scores = scores;
  args.score_stride = score_stride;
  args.seq_lens = seq_lens;
  args.block_table = block_table;
  args.bt_stride = bt_stride;
  args.out = topk_indices;
  args.out_stride = out_stride;
  args.batch = static_cast<int>(batch);
  args.max_len = static_cast<int>(max_len);
  args.candidate_capacity = static_cast<int>(candidate_capacity);
  args.fast_candidates = static_cast<int>(fast_candidates);
  args.dependent_launch = dependent_launch != 0;
  args.topk = static_cast<int>(topk);
  return 0;
}

}  // namespace

// scores [batch, score_stride] fp32 (rows 16-byte aligned), seq_lens [batch] int32, block_table
// [batch, bt_stride] int32 page ids, topk_indices [batch, out_stride] int32 (topk per row written, 1..kTopK);
// max_len = max_num_pages * kPageSize. candidate_capacity < 0 picks the default shared-memory
// candidate buffer; 0 or a small value forces rows onto the filter-the-row path (a test hook).
// fast_candidates < 0 picks the fast path's default; 0 turns the fast path off (a test hook for
// the radix select). dependent_launch != 0 launches the kernel as a programmatic dependent of the
// stream's previous kernel (TopkArgs::dependent_launch).
DSA_EXPORT int dsa_topk_filtered(int device, void* stream, const float* scores, int64_t score_stride, const int32_t* seq_lens,
                                 const int32_t* block_table, int64_t bt_stride, int32_t* topk_indices, int64_t out_stride,
                                 int64_t batch, int64_t max_len, int64_t candidate_capacity, int64_t fast_candidates,
                                 int dependent_launch, int64_t topk) {
  dsa_topk::TopkArgs args;
  const int bad = common_args(scores, score_stride, seq_lens, block_table, bt_stride, topk_indices, out_stride, batch, max_len,
                              candidate_capacity, fast_candidates, dependent_launch, topk, args);
  if (bad != 0 || batch == 0) return bad;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return static_cast<int>(dsa_topk::launch_filtered_topk(args, static_cast<cudaStream_t>(stream)));
}

// The split top-k (topk_filtered.h): dsa_topk_filtered's arguments, then split_len (tokens per
// chunk), split_chunks (chunks per row) and partial [batch * split_chunks, topk] int32, contiguous
// (stage 1's positions; scratch the caller owns).
DSA_EXPORT int dsa_topk_split(int device, void* stream, const float* scores, int64_t score_stride, const int32_t* seq_lens,
                              const int32_t* block_table, int64_t bt_stride, int32_t* topk_indices, int64_t out_stride,
                              int64_t batch, int64_t max_len, int64_t candidate_capacity, int64_t fast_candidates,
                              int dependent_launch, int64_t topk, int64_t split_len, int64_t split_chunks, int32_t* partial) {
  dsa_topk::TopkArgs args;
  const int bad = common_args(scores, score_stride, seq_lens, block_table, bt_stride, topk_indices, out_stride, batch, max_len,
                              candidate_capacity, fast_candidates, dependent_launch, topk, args);
  if (bad != 0) return bad;
  if (split_len <= topk || split_len > dsa_topk::kSplitMaxChunkLen || split_len % dsa_topk::kPageSize != 0 || topk % 4 != 0 ||
      split_chunks < 1 || split_chunks * split_len < max_len || split_chunks * topk > dsa_topk::kSplitMaxCandidates ||
      batch * split_chunks > std::numeric_limits<int>::max()) {
    return kBadSplit;
  }
  if (batch == 0) return 0;
  if (partial == nullptr || reinterpret_cast<uintptr_t>(partial) % 16 != 0) return kNullPointer;
  args.split_len = static_cast<int>(split_len);
  args.split_chunks = static_cast<int>(split_chunks);
  args.partial = partial;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return static_cast<int>(dsa_topk::launch_split_topk(args, static_cast<cudaStream_t>(stream)));
}
