// Host-side interface of the hand-written sparse MLA attention for Hopper (plain C++, no torch).
//
// Shared by attention_sm90.cu (nvcc) and attention_binding.cpp (the torch binding, host compiler).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsa_attention {

// Contract of dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64.
constexpr int kHeads = 16;
constexpr int kDCkv = 512;  // compressed KV width; also the value width
constexpr int kDKpe = 64;   // RoPE key width
constexpr int kTopK = 2048;
constexpr int kPageSize = 64;

// Barrier words per token (count at 0, sense at kSenseOffset): 128 bytes, one cache line each.
constexpr int kSyncStride = 32;
constexpr int kSenseOffset = 16;

struct AttentionArgs {
  const uint16_t* q_nope;   // [T, 16, 512] bf16 bits
  const uint16_t* q_pe;     // [T, 16, 64]
  const uint16_t* ckv;      // [P, 64, 512]
  const uint16_t* kpe;      // [P, 64, 64]
  const int32_t* indices;   // [T, 2048] physical ids, -1 = padding
  uint16_t* out;            // [T, 16, 512] bf16 bits
  float* lse;               // [T, 16]
  uint16_t* part_out;       // [T, splits, 16, 512] bf16: each split's normalised output
  float* part_lse;          // [T, splits, 16]: each split's log2-sum-exp (-inf: no valid slot)
  int32_t* sync;            // [>= T * kSyncStride] barrier words, zeroed once, left at count 0
  int64_t q_nope_t, q_nope_h, q_pe_t, q_pe_h;      // strides in elements (last dims contiguous)
  int64_t ckv_page, ckv_slot, kpe_page, kpe_slot;
  int64_t indices_t, out_t, out_h, lse_t;
  int64_t* phase_clocks;    // profiling only, else null: [T * splits * kPhaseSlots] per program,
                            // see kPhase* below (tools/profile_kernels.py phases reads them)
  float qk_scale_log2;      // sm_scale * log2(e)
  int tokens;
  int splits;               // slot splits per token: a power of two in [kMinSplits, kMaxSplits]
};

// Phase stamps of one program (thread 0), when phase_clocks is set: the global timer (ns) at
// entry and exit, and the SM clock (cycles) at entry and at the end of each phase.
enum PhaseSlot : int {
  kPhaseEntryNs = 0,
  kPhaseEntryCycles,
  kPhaseIdsCycles,         // slot ids loaded, active tiles known
  kPhaseFirstTileCycles,   // first tile's rows in shared memory
  kPhaseAttendedCycles,    // every tile scored and folded into the output
  kPhasePartialCycles,     // partial stores issued
  kPhaseReleasedCycles,    // past the token's barrier (fused launch)
  kPhaseCombinedCycles,    // combine share written (fused launch)
  kPhaseExitNs,
  kPhaseSlots
};

constexpr int kMinSplits = 8;
constexpr int kMaxSplits = 64;

// How a call was launched.
enum class Launch : int { kFused = 0, kTwoLaunch = 1 };

// Launches the attention on `stream`: one launch with the combine behind a per-token barrier
// when every program of the grid can be resident at once and `force_two_launch` is false, else
// the split kernel and then the combine kernel. Returns the CUDA error (cudaSuccess when fine).
cudaError_t launch_sparse_attention(const AttentionArgs& args, bool force_two_launch, cudaStream_t stream, Launch* used);

// Programs of the split kernel the current device keeps resident at once (occupancy x SMs).
cudaError_t resident_programs(int* programs);

}  // namespace dsa_attention
