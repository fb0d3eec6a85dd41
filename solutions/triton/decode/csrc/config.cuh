// Device-side configuration of the SM90 decode: the thread roles, the shared-memory tile geometry
// (128-byte-swizzled atoms), the split partials' format, the per-format record Layout (its dims
// read from the one FormatDims descriptor of decode_sm90.h) and the shared-memory structs. Every
// constant a kernel relies on is named here and asserted. Included by the kernels' translation units.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../../common/csrc/fast_math.cuh"
#include "../../common/csrc/sm90_sync.cuh"
#include "decode_sm90.h"

namespace dsa_decode {
namespace {

using dsa_fast_math::fast_exp2;
using dsa_fast_math::fast_log2;
using dsa_fast_math::neg_inf;
using dsa_fast_math::pos_inf;
using dsa_sm90::add_release_returning;
using dsa_sm90::fence_mbarrier_init;
using dsa_sm90::fence_proxy_async;
using dsa_sm90::load_acquire;
using dsa_sm90::mbarrier_arrive;
using dsa_sm90::mbarrier_init;
using dsa_sm90::mbarrier_wait;
using dsa_sm90::named_barrier;
using dsa_sm90::named_barrier_arrive;
using dsa_sm90::smem_addr;

constexpr int kWarpSize = 32;
constexpr int kWarpgroupThreads = 128;
constexpr int kMathWarpgroups = 2;
constexpr int kThreads = (1 + kMathWarpgroups) * kWarpgroupThreads;  // one producer warpgroup + consumers
constexpr int kMathThreads = kMathWarpgroups * kWarpgroupThreads;
static_assert(kPartialScales == kMathThreads, "one fp16 scale per consumer thread");
// Named barriers of the two consumer warpgroups: both, at Q's load, inside a tile of the halves
// schedule and at the end; the scorer schedule's handoff of a tile's P and row scales to the
// second warpgroup, and that warpgroup's release of them.
constexpr int kMathBarrier = 1;
constexpr int kPReadyBarrier = 2;
constexpr int kPFreeBarrier = 3;
// Shared tiles are 128-byte-swizzled atoms: 64 rows of 64 bf16 (128 B), 8 KB, the 16-byte chunk
// c of row r stored at chunk c ^ (r % 8); a row of d_qk dims spans d_qk / 64 atoms.
constexpr int kAtomCols = 64;
constexpr int kAtomRowBytes = kAtomCols * 2;
constexpr int kAtomRows = 64;
constexpr int kAtomBytes = kAtomRows * kAtomRowBytes;
constexpr int kSwizzleGroupBytes = 8 * kAtomRowBytes;  // 8 rows: the swizzle period, wgmma's SBO
constexpr int kChunkCols = 8;                          // bf16 per 16-byte chunk
constexpr int kMmaK = 16;                              // k of one wgmma
constexpr int kQkTokens = kTileTokens / kMathWarpgroups;  // records each consumer scores
constexpr int kPvCols = kDv / kMathWarpgroups;            // value columns each consumer owns
constexpr int kPvColAtoms = kPvCols / kAtomCols;          // ... in atoms
constexpr int kAccRegs = kHeadsPerProgram * kPvCols / kWarpgroupThreads;
constexpr int kLogitRegs = kHeadsPerProgram * kQkTokens / kWarpgroupThreads;
constexpr int kScorerLogitRegs = kHeadsPerProgram * kTileTokens / kWarpgroupThreads;  // the scorer's S [64, 64]
constexpr int kPRegs = kScorerLogitRegs / 2;  // the scorer's P as bf16 pairs: wgmma's A fragments, 4 per k-step
constexpr uint32_t kL2Line = 128;
constexpr float kLn2 = 0.6931471805599453f;
// A split's partial O / l [64 heads, kDv] is stored in the consumers' fragment order, 8-byte
// fragment number j * kMathThreads + mt holding thread mt's accumulators 4j .. 4j + 3 as fp16:
// heads r0 and r0 + 8, columns c and c + 1 (partial_fragment names them); the combine reads the same order.
constexpr int kPartialFragments = kHeadsPerProgram * kDv / 4;
// A partial's elements are fp16 times part_scale: each consumer thread's largest |value| is
// stored as 2^14 (fp16 reaches 65504, so the RNE rounding of the largest cannot overflow).
constexpr float kPartialTop = 16384.0f;
__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float2 half2_floats(uint32_t bits) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return __half22float2(h);
}
struct Fragment {
  int r0, col;  // the fragment is (r0, col), (r0, col + 1), (r0 + 8, col), (r0 + 8, col + 1)
};
__device__ __forceinline__ Fragment partial_fragment(int mt, int j) {
  const int t = mt % kWarpgroupThreads, lane = t % kWarpSize;
  return {16 * (t / kWarpSize) + lane / 4, (mt / kWarpgroupThreads) * (kDv / kMathWarpgroups) + 8 * j + 2 * (lane % 4)};
}
// The split partials' format, which the combine reads (combine.cuh): a unit is kHeads heads of one
// query token; each of kOwners threads owns kFragments / kOwners 8-byte fragments (fragment
// j * kOwners + owner) and one fp32 scale; writes_lse names the owners that write each head's lse once.
struct PartialsM64 {
  static constexpr int kHeads = kHeadsPerProgram;
  static constexpr int kOwners = kMathThreads;
  static constexpr int kFragments = kPartialFragments;
  __device__ __forceinline__ static Fragment fragment(int owner, int j) { return partial_fragment(owner, j); }
  __device__ __forceinline__ static bool writes_lse(int owner) { return owner < kWarpgroupThreads && owner % 4 == 0; }  // warpgroup 0, quad 0
};
// The 16/32-head kernel (kernel_m16.cuh): the producer warpgroup and kM16Warps consumer warps;
// 16 heads are one m16 tile (mma.sync's M), 32 two over the same records. The warps work in pairs:
// pair p scores records 16p .. 16p + 15 of a tile, each of its warps over half of d_qk's k-steps, and
// the pair adds its halves through shared memory so that warp w holds S of records 8w .. 8w + 7
// (one n8 tile per m16 tile) for the softmax; warp w owns value columns 64w .. 64w + 63 of O.
constexpr int kMmaM = 16;
constexpr int kM16Warps = 8;
constexpr int kM16ConsumerThreads = kM16Warps * kWarpSize;
constexpr int kM16RecordsPerWarp = kTileTokens / kM16Warps;
constexpr int kM16ColsPerWarp = kDv / kM16Warps;
// Its partials: owner mi * kM16ConsumerThreads + t is consumer thread t's accumulators of m16 tile
// mi (heads 16 mi + lane / 4 and + 8, columns 64 (t / 32) + 8 j + 2 (lane % 4) + {0, 1}).
template <int kMTiles>
struct PartialsM16 {
  static constexpr int kHeads = kMmaM * kMTiles;
  static constexpr int kOwners = kM16ConsumerThreads * kMTiles;
  static constexpr int kFragments = kHeads * kDv / 4;
  __device__ __forceinline__ static Fragment fragment(int owner, int j) {
    const int t = owner % kM16ConsumerThreads, lane = t % kWarpSize;
    return {kMmaM * (owner / kM16ConsumerThreads) + lane / 4, (t / kWarpSize) * kM16ColsPerWarp + 8 * j + 2 * (lane % 4)};
  }
  __device__ __forceinline__ static bool writes_lse(int owner) {  // warp 0 of each m16 tile, quad 0
    return owner % kM16ConsumerThreads < kWarpSize && owner % 4 == 0;
  }
};
static_assert(PartialsM16<1>::kOwners == kSmallPartialScalesPer16 && kSmallHeads[0] == kMmaM && kSmallHeads[1] == 2 * kMmaM,
              "decode_sm90.h's description of the 16/32-head kernel");
static_assert(kM16ConsumerThreads == kMathThreads && kM16RecordsPerWarp == 8 && kM16ColsPerWarp == 64,
              "eight consumer warps: the 64-head kernel's consumer threads");
// Registers per thread before the warpgroups rebalance them (Layout sets the split per format).
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;

static_assert(kHeadsPerProgram == 64 && kAtomRows == kHeadsPerProgram && kAtomRows == kTileTokens,
              "Q, the record tiles and P are 64-row atoms; 64 is wgmma's M for one warpgroup");
static_assert(kQkTokens == 32 && kAccRegs == 128 && kLogitRegs == 16, "wgmma m64n32 for S, m64n256 for O");
static_assert(kScorerLogitRegs == 32 && kPRegs == 4 * (kTileTokens / kMmaK), "the scorer: wgmma m64n64 for S");

// How the two consumer warpgroups share a tile (docs/kernels/mla_decode.md, "Two consumer schedules"):
//   halves  each scores 32 of the 64 records (S = Q K^T, both reading Q), the row maxima exchanged
//           through shared memory, then each adds P V into its 256 value columns, P from shared memory;
//   scorer  warpgroup 1 scores all 64 records, runs the softmax alone and hands P (stmatrix) and the
//           rows' rescale factors to warpgroup 2 by a named barrier; both add P V into their columns,
//           warpgroup 1 with P from its registers. Q is read once per tile and warpgroup 1's next S
//           overlaps warpgroup 2's P V, but a tile's chain is longer: faster where a program has many
//           tiles (b >= 64 at h_q 128: V4 b = 128 389.2 against 439.2 µs on an H200), slower for
//           the two-tile split programs of b = 2.
enum class Role { kHalf, kScorer, kSecond };
// The launcher takes the scorer schedule for programs with at least this many tiles.
constexpr int kScorerMinTiles = 8;
static_assert(kPvCols % kAtomCols == 0 && kTileTokens % kMmaK == 0, "P.V in whole atoms and k-steps");
static_assert(kStages == 2, "the producer's and consumers' phase parities assume two stages");

// Format traits: the K row's dims (decode_sm90.h), how the producer splits a tile's records
// over its threads, and the registers each warpgroup keeps.
template <int kFormat>
struct Layout {
  static constexpr FormatDims kDims = kFormat == kFormatV32 ? kV32Dims : kV4Dims;
  static constexpr int kDqk = kDims.d_qk;
  static constexpr int kQuantDims = kDims.quant_dims;
  static constexpr int kRopeDims = kDims.rope_dims;
  static constexpr int kScaleTile = kDims.scale_tile;
  static constexpr bool kFp32Scales = kDims.fp32_scales;
  static constexpr bool kScalesInRow = kFormat == kFormatV32;  // per-token records: scales inside the data row
  static constexpr int kAtoms = kDqk / kAtomCols;
  static constexpr int kScaleWords = kFp32Scales ? 4 : 2;  // a record's scales: one 16-byte or 8-byte load
  // After setmaxnreg: the producer gives up what the consumers' accumulators take. The
  // producer of V3.2 holds two records' vectors; other splits spilled under nvcc 13.0.
  static constexpr int kProducerRegisters = kFormat == kFormatV32 ? 152 : 136;
  static constexpr int kConsumerRegisters = kFormat == kFormatV32 ? 176 : 184;
  // The scorer schedule: the scorer holds S beside O, the second warpgroup O alone.
  static constexpr int kScorerRegisters = 192;
  static constexpr int kSecondRegisters = 160;
  // Where the producer reads the ids two tiles on: V3.2's two records of vectors leave no
  // registers for them during the gathers, so after the stores; V4 before its L2 prefetch.
  // Each placement is the faster one for its format.
  static constexpr bool kIdsAfterStores = kFormat == kFormatV32;
  // Whether only a query token's first head block prefetches the next tile's records into L2: its
  // other head blocks gather the same records side by side and find them there (faster for V3.2
  // at b = 128); V4's producer spilled the head block it needs for the test, so V4 keeps the prefetch in every head block.
  static constexpr bool kFirstHeadBlockPrefetches = kFormat == kFormatV32;
  static_assert(kDqk % kAtomCols == 0 && kDqk >= kDv, "whole atoms; V is the first kDv dims");
  static_assert(kFp32Scales ? kDims.num_scales == kScaleWords : kDims.num_scales <= 4 * kScaleWords,
                "scales in one 16-byte (fp32) or 8-byte (UE8M0) load");
  static_assert(kWarpgroupThreads * (kLaunchRegisters - kProducerRegisters) >= kMathThreads * (kConsumerRegisters - kLaunchRegisters),
                "the consumers take only what the producer released");
  static_assert(kProducerRegisters + kScorerRegisters + kSecondRegisters <= 3 * kLaunchRegisters,
                "the scorer takes only what the producer and the second warpgroup released");
};

// How the producer warpgroups split a tile's records (producer.cuh): kGroups warpgroups each fill
// kGroupTokens = kTileTokens / kGroups records of every tile. R threads take a record's 16-byte
// vectors R v + part, so one load of a warp reads 16 R contiguous bytes of each of 32 / R records;
// each thread fills kPasses records of a tile, all their loads issued before any is used. With one
// warpgroup V3.2 is fastest at R = 4 (its 512 FP8 dims in 8 vectors a thread, two records a
// thread), V4 at 2 (one record a thread: its producer has fewer registers); with two warpgroups
// (the 16/32-head kernel) both take 4, one record a thread (docs/kernels/mla_decode.md).
template <int kFormat, int kGroups>
struct ProducerPlan {
  using L = Layout<kFormat>;
  static constexpr int kGroupTokens = kTileTokens / kGroups;
  static constexpr int kThreads = kGroups * kWarpgroupThreads;
  static constexpr int kRecordThreads = kGroups == 1 && kFormat == kFormatV4 ? 2 : 4;
  static constexpr int kPasses = kGroupTokens * kRecordThreads / kWarpgroupThreads;  // records per producer thread
  static constexpr int kFp8PerThread = L::kQuantDims / kRecordThreads;
  static constexpr int kFp8Vecs = kFp8PerThread / 16;             // 16-byte vectors of FP8 values
  static constexpr int kRopePerThread = L::kRopeDims / kRecordThreads;
  static constexpr int kRopeVecs = kRopePerThread / kChunkCols;   // 16-byte vectors of bf16 RoPE
  // Where a thread reads the ids two tiles on: after its stores when it holds two V3.2 records of
  // vectors (no registers for them during the gathers), else before the L2 prefetch (Layout;
  // with one record a thread that was faster for V3.2 too: 167.9 against 173.6 µs at 16 heads, b = 128).
  static constexpr bool kIdsAfterStores = L::kIdsAfterStores && kPasses > 1;
  static_assert(kGroups >= 1 && kTileTokens % kGroups == 0, "whole records per producer warpgroup");
  static_assert(kPasses >= 1 && kPasses * kWarpgroupThreads == kGroupTokens * kRecordThreads, "whole records per producer thread");
  static_assert(kFp8PerThread % 16 == 0 && kRopePerThread % kChunkCols == 0, "whole vectors per producer thread");
  static_assert(L::kScaleTile % (16 * kRecordThreads) == 0, "vectors R v .. R v + R - 1 share a scale tile");
};

// The 16/32-head kernel's roles (kernel_m16.cuh): kGroups producer warpgroups (ProducerPlan), then
// the eight consumer warps. With one producer warpgroup it is the 64-head kernel's 384 threads and
// register split; with two (512 threads, 128 registers each at launch) a producer thread fills one
// record a tile and gives up what the consumers' m16 accumulators need.
template <int kFormat, int kGroups>
struct M16Roles {
  static constexpr int kProducers = ProducerPlan<kFormat, kGroups>::kThreads;
  static constexpr int kThreads = kProducers + kM16ConsumerThreads;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kGroups == 1 ? Layout<kFormat>::kProducerRegisters : 80;
  static constexpr int kConsumerRegisters = kGroups == 1 ? Layout<kFormat>::kConsumerRegisters : 176;
  static_assert(kGroups == 1 ? kThreads == dsa_decode::kThreads : kThreads <= 1024, "one program per SM");
  static_assert(kProducers * (kLaunchRegisters - kProducerRegisters) >= kM16ConsumerThreads * (kConsumerRegisters - kLaunchRegisters),
                "the consumers take only what the producers released");
};
// Producer warpgroups of the 16/32-head kernel (one: 183.4 against 167.9 µs at V3.2 16 heads, b = 128).
constexpr int kM16ProducerGroups = 2;

// The 64-head kernel's roles (kernel_m64.cuh): kGroups producer warpgroups (ProducerPlan), then the two
// consumer warpgroups in their schedule. With one producer warpgroup: 384 threads and Layout's register
// split. With two (512 threads, 128 registers each at launch) a producer thread fills one record a tile
// in 80 registers, which leaves the consumers exactly what they hold with one: 176 each (halves), or
// 192 for the scorer and 160 for the second warpgroup.
template <int kFormat, int kGroups>
struct M64Roles {
  using L = Layout<kFormat>;
  static constexpr int kProducers = ProducerPlan<kFormat, kGroups>::kThreads;
  static constexpr int kThreads = kProducers + kMathThreads;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kGroups == 1 ? L::kProducerRegisters : 80;
  static constexpr int kConsumerRegisters = kGroups == 1 ? L::kConsumerRegisters : 176;
  static constexpr int kScorerRegisters = L::kScorerRegisters;
  static constexpr int kSecondRegisters = L::kSecondRegisters;
  static_assert(kGroups == 1 ? kThreads == dsa_decode::kThreads : kThreads <= 1024, "one program per SM");
  static_assert(kProducers * (kLaunchRegisters - kProducerRegisters) >= kMathThreads * (kConsumerRegisters - kLaunchRegisters),
                "the halves take only what the producers released");
  static_assert(kProducers * kProducerRegisters + kWarpgroupThreads * (kScorerRegisters + kSecondRegisters) <= 65536,
                "the scorer and the second warpgroup take only what the producers released");
};
// Producer warpgroups of the 64-head kernel: two (V3.2 h_q 128, b = 128: 410.4 against 435.1 µs on an
// H100), except for V4's halves schedule, whose consumers spill at 176 registers (448.1 against 439.0).
template <int kFormat, bool kScorerSchedule>
constexpr int m64_producer_groups() { return kFormat == kFormatV32 || kScorerSchedule ? 2 : 1; }
// ptxas compiles an m64n256 wgmma only where the kernel starts with at least this many registers a
// thread (setmaxnreg does not count: C7602), so a 512-thread kernel adds P V as two m64n128 halves.
constexpr int kM64N256MinRegisters = 154;

// A call's schedule (DecodeArgs): its split tokens, and whether it has whole tokens beside them (the
// kernels' kMixed: producer.cuh, position_stride).
inline int split_tokens(const DecodeArgs& a) { return a.batch * a.s_q - a.whole_tokens; }
inline bool mixed_schedule(const DecodeArgs& a) { return a.whole_tokens > 0 && a.splits > 1 && split_tokens(a) > 0; }

template <int kFormat>
struct Tiles {
  alignas(1024) uint8_t q[Layout<kFormat>::kAtoms * kAtomBytes];             // Q [64 heads, d_qk]
  alignas(1024) uint8_t kv[kStages][Layout<kFormat>::kAtoms * kAtomBytes];   // records [64, d_qk], bf16
  alignas(1024) uint8_t p[kAtomBytes];                                       // P [64 heads, 64 records]
};
struct Small {
  float bias[kStages][kTileTokens];             // 0 or -inf per record of a stage
  float row_max[kMathWarpgroups][kHeadsPerProgram];  // halves: each warpgroup's; scorer: its final m in [0]
  float row_sum[kMathWarpgroups][kHeadsPerProgram];  // halves: each warpgroup's; scorer: its final l in [0]
  float row_scale[kHeadsPerProgram];                 // scorer: the factor for the old O, per tile
  uint64_t full[kStages];   // producer -> consumers: the stage's tile is stored
  uint64_t empty[kStages];  // consumers -> producer: the stage's tile has been read
};
template <int kFormat>
constexpr int shared_bytes() {
  return static_cast<int>(sizeof(Tiles<kFormat>) + sizeof(Small)) + 1024;  // + the base's alignment
}
static_assert(shared_bytes<kFormatV32>() <= 227 * 1024, "V3.2 tiles fit Hopper's 227 KB per block");

}  // namespace
}  // namespace dsa_decode
