// C ABI of the long-row top-k, loaded by indexer/cuda_topk_long.py through ctypes.
//
// Plain C++ over the CUDA runtime, like topk_capi.cpp: device pointers, strides in elements, the
// caller's stream and device; returns 0, a cudaError_t value (> 0), or one of the argument errors
// below (< 0), which dsa_topk_long_error_string names. indexer/cuda_topk_long.py checks every argument
// before the call; the checks here only guard what this file hands on to the launcher.
#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "topk_filtered.h"
#include "topk_long.h"
#include "../../common/csrc/capi.h"

namespace {

enum ArgumentError : int {
  kTooLarge = -1,
  kMisaligned = -2,
  kBadTopk = -3,
  kNullPointer = -4,
};

}  // namespace

// Constants of topk_long.h, which indexer/cuda_topk_long.py compares with its own on load.
DSA_EXPORT const int64_t dsa_topk_long_TOPK = dsa_topk::kTopK;
DSA_EXPORT const int64_t dsa_topk_long_PAGE_SIZE = dsa_topk::kPageSize;
DSA_EXPORT const int64_t dsa_topk_long_SCRATCH_INTS = dsa_topk::kLongScratchInts;
DSA_EXPORT const int64_t dsa_topk_long_CLUSTER_MAX_LEN = dsa_topk::kClusterMaxLen;

DSA_EXPORT const char* dsa_topk_long_error_string(int code) {
  switch (code) {
    case kTooLarge: return "problem too large for 32-bit indexing or the launch grid";
    case kMisaligned: return "score rows, scratch and candidates must be 16-byte aligned";
    case kBadTopk: return "topk must be in 1..TOPK";
    case kNullPointer: return "null tensor pointer";
    default: return code >= 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown argument error";
  }
}

namespace {

// Checks a call's arguments (the multi-pass kernel's scratch and candidates when `with_scratch`) and
// fills `args`; returns 0 or an ArgumentError.
int make_args(dsa_topk::LongTopkArgs& args, const float* scores, int64_t score_stride, const int32_t* seq_lens, const int32_t* block_table,
              int64_t bt_stride, int32_t* topk_indices, int64_t out_stride, int32_t* scratch, uint32_t* candidates, int64_t batch,
              int64_t max_len, int64_t topk, int dependent_launch, bool with_scratch, int64_t longest) {
  if (batch < 0 || batch > 65535 || max_len < 0 || max_len > longest) return kTooLarge;
  const bool misaligned_scratch = with_scratch && (reinterpret_cast<uintptr_t>(scratch) % 16 != 0 || reinterpret_cast<uintptr_t>(candidates) % 16 != 0);
  if (score_stride % 4 != 0 || reinterpret_cast<uintptr_t>(scores) % 16 != 0 || misaligned_scratch) return kMisaligned;
  if (topk < 1 || topk > dsa_topk::kTopK) return kBadTopk;
  if (batch != 0 && (scores == nullptr || seq_lens == nullptr || block_table == nullptr || topk_indices == nullptr ||
                     (with_scratch && (scratch == nullptr || candidates == nullptr))))
    return kNullPointer;
  args = dsa_topk::LongTopkArgs{};
  args.scores = scores;
  args.score_stride = score_stride;
  args.seq_lens = seq_lens;
  args.block_table = block_table;
  args.bt_stride = bt_stride;
  args.out = topk_indices;
  args.out_stride = out_stride;
  args.scratch = with_scratch ? scratch : nullptr;
  args.candidates = with_scratch ? candidates : nullptr;
  args.batch = static_cast<int>(batch);
  args.max_len = static_cast<int>(max_len);
  args.topk = static_cast<int>(topk);
  args.dependent_launch = dependent_launch != 0;
  return 0;
}

}  // namespace

// scores [batch, score_stride] fp32 (rows 16-byte aligned), seq_lens [batch] int32, block_table
// [batch, bt_stride] int32 page ids, topk_indices [batch, out_stride] int32 (topk per row written),
// scratch [batch, SCRATCH_INTS] int32 (zero before, left zero after), candidates [batch, 4 * max_len]
// uint32 (two buffers of max_len (key, position) pairs per row); max_len = max_num_pages * PAGE_SIZE.
// `cluster`: the cluster kernel instead (max_len <= CLUSTER_MAX_LEN; scratch and candidates unused, may be null).
DSA_EXPORT int dsa_topk_long_select(int device, void* stream, const float* scores, int64_t score_stride, const int32_t* seq_lens,
                                    const int32_t* block_table, int64_t bt_stride, int32_t* topk_indices, int64_t out_stride,
                                    int32_t* scratch, uint32_t* candidates, int64_t batch, int64_t max_len, int64_t topk,
                                    int dependent_launch, int cluster) {
  constexpr int64_t kLongest = std::numeric_limits<int>::max() / 4;  // 32-bit indexing of the candidate buffers
  dsa_topk::LongTopkArgs args;
  const int problem = make_args(args, scores, score_stride, seq_lens, block_table, bt_stride, topk_indices, out_stride, scratch, candidates,
                                batch, max_len, topk, dependent_launch, cluster == 0, cluster != 0 ? dsa_topk::kClusterMaxLen : kLongest);
  if (problem != 0 || batch == 0) return problem;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  const cudaStream_t on = static_cast<cudaStream_t>(stream);
  return static_cast<int>(cluster != 0 ? dsa_topk::launch_cluster_topk(args, on) : dsa_topk::launch_long_topk(args, on));
}

// Writes to *clusters how many clusters of the cluster top-k for rows of up to max_len tokens the
// device runs at once (0 when it cannot run them, or max_len > CLUSTER_MAX_LEN).
DSA_EXPORT int dsa_topk_long_cluster_capacity(int device, int64_t max_len, int32_t* clusters) {
  if (clusters == nullptr) return kNullPointer;
  *clusters = 0;
  if (max_len < 0 || max_len > dsa_topk::kClusterMaxLen) return 0;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  int count = 0;
  const cudaError_t err = dsa_topk::cluster_topk_capacity(static_cast<int>(max_len), &count);
  *clusters = count;
  return static_cast<int>(err);
}
