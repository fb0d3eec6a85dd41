// Host-side interface of the hand-written sparse MLA attention for Hopper (plain C++, no torch).
//
// Shared by attention_sm90.cu (the kernels and launcher) and attention_capi.cpp (the C ABI that
// attention/cuda.py calls through ctypes); nvcc links both into one shared library.
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

// Barrier words per token: the ticket word at 0, alone in its 128-byte cache line.
constexpr int kSyncStride = 32;

struct AttentionArgs {
  const uint16_t* q_nope;   // [T, 16, 512] bf16 bits
  const uint16_t* q_pe;     // [T, 16, 64]
  const uint16_t* ckv;      // [P, 64, 512]
  const uint16_t* kpe;      // [P, 64, 64]
  const int32_t* indices;   // [T, 2048] physical ids, -1 = padding
  uint16_t* out;            // [T, 16, 512] bf16 bits
  float* lse;               // [T, 16]
  uint16_t* part_out;       // [T, splits, 16 x 512 / 4 units]: each split's normalised output
                            // (unit: a bf16 pair of head g and one of head g + 8)
  float* part_lse;          // [T, splits, 8 pairs]: each split's log2-sum-exp of heads (g, g + 8)
                            // (-inf: no valid slot)
  int32_t* sync;            // [>= T * kSyncStride] barrier words: zeroed once, then only ever
                            // advanced (by kTicketsPerCall per call and token, modulo 2^32)
  int64_t q_nope_t, q_nope_h, q_pe_t, q_pe_h;      // strides in elements (last dims contiguous)
  int64_t ckv_page, ckv_slot, kpe_page, kpe_slot;
  int64_t indices_t, out_t, out_h, lse_t;
  int64_t* phase_clocks;    // profiling only, else null: [T * splits * kPhaseSlots] per program,
                            // see kPhase* below (benchmarks/kernels/profile_kernels.py phases reads them)
  float qk_scale_log2;      // sm_scale * log2(e)
  int tokens;
  int splits;               // slot splits per token: a power of two in [kMinSplits, kMaxSplits]
  int gather_lag;           // SM cycles: a tile is requested once the tile before it has landed
                            // or this long after that one was requested, whichever comes first
                            // (0: together with it, two tiles in flight; kGatherLagOnLanding:
                            // only once it has landed)
};

constexpr int kGatherLagOnLanding = 0x7fffffff;
// Slots a program gathers and scores together, and the tiles it holds in shared memory (at most
// that many in flight). attention/cuda.py holds the same two numbers (TILE_SLOTS, STAGES).
constexpr int kGatherTileSlots = 64;
constexpr int kGatherStages = 2;

// Phase stamps of one program (thread 0), when phase_clocks is set: the global timer (ns) at
// entry and exit, and the SM clock (cycles) at entry and at the end of each phase.
enum PhaseSlot : int {
  kPhaseEntryNs = 0,
  kPhaseEntryCycles,
  kPhaseIdsCycles,         // slot ids loaded, active tiles known
  kPhaseFirstTileCycles,   // first tile's rows in shared memory
  kPhaseAttendedCycles,    // every tile scored and folded into the output
  kPhasePartialCycles,     // partial stores issued (to global memory, or to shared in a cluster)
  kPhaseReleasedCycles,    // past the token's barrier (fused or cluster launch)
  kPhaseCombinedCycles,    // combine share written (fused or cluster launch)
  kPhaseExitNs,
  kPhaseSlots
};

constexpr int kMinSplits = 8;
constexpr int kMaxSplits = 64;
constexpr int kMaxClusterSplits = 16;  // a token's programs form one thread-block cluster
// Each call advances a token's ticket word by this much in all (kTicketsPerCall / S per
// program), whatever its split count S; a power of two, so it divides 2^32.
constexpr unsigned kTicketsPerCall = kMaxSplits;

// How the splits of a token are combined.
enum class Combine : int {
  kBarrier = 0,    // same launch, behind a per-token barrier in global memory when the grid is
                   // co-resident, else a second launch (part_out / part_lse / sync are used)
  kTwoLaunch = 1,  // always a second launch
  kCluster = 2,    // same launch: the token's programs are one cluster and combine through
                   // distributed shared memory (splits <= kMaxClusterSplits; no scratch used)
};

// How a call was launched.
enum class Launch : int { kFused = 0, kTwoLaunch = 1, kCluster = 2 };

// Launches the attention on `stream` with the requested combine. Returns the CUDA error
// (cudaSuccess when fine).
cudaError_t launch_sparse_attention(const AttentionArgs& args, Combine combine, cudaStream_t stream, Launch* used);

// Programs of the split kernel the current device keeps resident at once (occupancy x SMs).
cudaError_t resident_programs(int* programs);

// Clusters of `splits` programs (the cluster kernel) the current device keeps resident at once;
// 0 when such a cluster cannot be scheduled at all.
cudaError_t resident_clusters(int splits, int* clusters);

}  // namespace dsa_attention
