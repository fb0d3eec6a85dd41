// C ABI of the hand-written sparse MLA attention, loaded by attention/cuda.py through ctypes.
//
// Plain C++ over the CUDA runtime (no torch, no pybind11: their headers were most of a fresh
// machine's build time). It takes device pointers, strides in elements, the caller's stream and
// device, and returns 0, a cudaError_t value (> 0), or one of the argument errors below (< 0);
// dsa_attention_error_string names any of them. attention/cuda.py checks every argument before
// the call; the checks here only guard what this file hands on to the launcher.
#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention_sm90.h"
#include "../../common/csrc/capi.h"

namespace {

enum ArgumentError : int {
  kBadCombine = -1,
  kBadGatherLag = -2,
  kBadSplits = -3,
  kBadTokens = -4,
  kScratchTooSmall = -5,
  kPhaseClocksTooSmall = -6,
  kNullPointer = -7,
};

}  // namespace

// Constants of attention_sm90.h, which attention/cuda.py compares with its own on load.
DSA_EXPORT const int64_t dsa_attention_HEADS = dsa_attention::kHeads;
DSA_EXPORT const int64_t dsa_attention_D_CKV = dsa_attention::kDCkv;
DSA_EXPORT const int64_t dsa_attention_D_KPE = dsa_attention::kDKpe;
DSA_EXPORT const int64_t dsa_attention_TOPK = dsa_attention::kTopK;
DSA_EXPORT const int64_t dsa_attention_PAGE_SIZE = dsa_attention::kPageSize;
DSA_EXPORT const int64_t dsa_attention_SYNC_STRIDE = dsa_attention::kSyncStride;
DSA_EXPORT const int64_t dsa_attention_TICKETS_PER_CALL = dsa_attention::kTicketsPerCall;
DSA_EXPORT const int64_t dsa_attention_MIN_SPLITS = dsa_attention::kMinSplits;
DSA_EXPORT const int64_t dsa_attention_MAX_SPLITS = dsa_attention::kMaxSplits;
DSA_EXPORT const int64_t dsa_attention_MAX_CLUSTER_SPLITS = dsa_attention::kMaxClusterSplits;
DSA_EXPORT const int64_t dsa_attention_TILE_SLOTS = dsa_attention::kGatherTileSlots;
DSA_EXPORT const int64_t dsa_attention_STAGES = dsa_attention::kGatherStages;
DSA_EXPORT const int64_t dsa_attention_GATHER_LAG_ON_LANDING = dsa_attention::kGatherLagOnLanding;
DSA_EXPORT const int64_t dsa_attention_PHASE_SLOTS = dsa_attention::kPhaseSlots;

DSA_EXPORT const char* dsa_attention_error_string(int code) {
  switch (code) {
    case kBadCombine: return "unknown combine";
    case kBadGatherLag: return "gather_lag out of range";
    case kBadSplits: return "splits must be a power of two in [MIN_SPLITS, MAX_SPLITS] (MAX_CLUSTER_SPLITS for the cluster combine)";
    case kBadTokens: return "tokens out of range";
    case kScratchTooSmall: return "part_out, part_lse or sync too small";
    case kPhaseClocksTooSmall: return "phase_clocks too small";
    case kNullPointer: return "null tensor pointer";
    default: return code >= 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown argument error";
  }
}

// Shapes: see attention_sm90.h (bf16 tensors as their bits). `combine` is a dsa_attention::Combine;
// `*used` receives the dsa_attention::Launch (0 fused, 1 two launches, 2 cluster). The scratch
// (part_out, part_lse, sync) may be empty for the cluster combine; phase_clocks is null when not
// profiling. Sizes are element counts.
DSA_EXPORT int dsa_attention_launch(
    int device, void* stream,
    const void* q_nope, int64_t q_nope_t, int64_t q_nope_h,
    const void* q_pe, int64_t q_pe_t, int64_t q_pe_h,
    const void* ckv, int64_t ckv_page, int64_t ckv_slot,
    const void* kpe, int64_t kpe_page, int64_t kpe_slot,
    const int32_t* indices, int64_t indices_t,
    void* out, int64_t out_t, int64_t out_h,
    float* lse, int64_t lse_t,
    void* part_out, int64_t part_out_elements,
    float* part_lse, int64_t part_lse_elements,
    int32_t* sync, int64_t sync_elements,
    int64_t* phase_clocks, int64_t phase_clock_elements,
    int64_t tokens, double sm_scale, int64_t splits, int64_t combine, int64_t gather_lag, int* used) {
  using namespace dsa_attention;
  if (combine < 0 || combine > static_cast<int64_t>(Combine::kCluster)) return kBadCombine;
  const auto how = static_cast<Combine>(combine);
  if (gather_lag < 0 || gather_lag > kGatherLagOnLanding) return kBadGatherLag;
  const int64_t most = how == Combine::kCluster ? kMaxClusterSplits : kMaxSplits;
  if (splits < kMinSplits || splits > most || (splits & (splits - 1)) != 0) return kBadSplits;
  if (tokens < 0 || tokens > 65535) return kBadTokens;  // the grid's y dimension
  if (how != Combine::kCluster &&  // the cluster combine needs no global scratch
      (part_out_elements < tokens * splits * kHeads * kDCkv || part_lse_elements < tokens * splits * kHeads ||
       sync_elements < tokens * kSyncStride)) {
    return kScratchTooSmall;
  }
  if (phase_clocks != nullptr && phase_clock_elements < tokens * splits * kPhaseSlots) return kPhaseClocksTooSmall;
  if (used == nullptr) return kNullPointer;
  *used = static_cast<int>(Launch::kFused);
  if (tokens == 0) return 0;
  if (q_nope == nullptr || q_pe == nullptr || ckv == nullptr || kpe == nullptr || indices == nullptr || out == nullptr ||
      lse == nullptr || (how != Combine::kCluster && (part_out == nullptr || part_lse == nullptr || sync == nullptr))) {
    return kNullPointer;
  }

  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  AttentionArgs a{};
  a.q_nope = static_cast<const uint16_t*>(q_nope);
  a.q_pe = static_cast<const uint16_t*>(q_pe);
  a.ckv = static_cast<const uint16_t*>(ckv);
  a.kpe = static_cast<const uint16_t*>(kpe);
  a.indices = indices;
  a.out = static_cast<uint16_t*>(out);
  a.lse = lse;
  a.part_out = static_cast<uint16_t*>(part_out);
  a.part_lse = part_lse;
  a.sync = sync;
  a.q_nope_t = q_nope_t;
  a.q_nope_h = q_nope_h;
  a.q_pe_t = q_pe_t;
  a.q_pe_h = q_pe_h;
  a.ckv_page = ckv_page;
  a.ckv_slot = ckv_slot;
  a.kpe_page = kpe_page;
  a.kpe_slot = kpe_slot;
  a.indices_t = indices_t;
  a.out_t = out_t;
  a.out_h = out_h;
  a.lse_t = lse_t;
  a.phase_clocks = phase_clocks;
  a.qk_scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  a.tokens = static_cast<int>(tokens);
  a.splits = static_cast<int>(splits);
  a.gather_lag = static_cast<int>(gather_lag);
  Launch launched = Launch::kFused;
  const cudaError_t err = launch_sparse_attention(a, how, static_cast<cudaStream_t>(stream), &launched);
  *used = static_cast<int>(launched);
  return static_cast<int>(err);
}

// Programs of the split kernel that `device` keeps resident at once.
DSA_EXPORT int dsa_attention_resident_programs(int device, int* programs) {
  if (programs == nullptr) return kNullPointer;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return static_cast<int>(dsa_attention::resident_programs(programs));
}

// Clusters of `splits` programs (the cluster kernel) that `device` keeps resident at once.
DSA_EXPORT int dsa_attention_resident_clusters(int device, int splits, int* clusters) {
  if (clusters == nullptr) return kNullPointer;
  if (splits < dsa_attention::kMinSplits || splits > dsa_attention::kMaxClusterSplits || (splits & (splits - 1)) != 0) return kBadSplits;
  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return static_cast<int>(dsa_attention::resident_clusters(splits, clusters));
}
