// FlashMLA-style sparse MLA decode over FP8 KV records for Hopper, hand-written (wgmma).
// Pure CUDA (no torch); nvcc links it with decode_capi.cpp, the C ABI, into one shared library
// (common/cuda_build.py). docs/kernels/mla_decode.md explains the design.
//
// Grid (h_q / 64 head blocks, S splits, b * s_q query tokens); 384 threads = three warpgroups,
// one program per SM (the dequantized tiles fill shared memory). Program (hb, s, t) attends the
// 64 heads hb*64.. of query token t over the positions s, s + S, s + 2S, ... of its index row,
// in tiles of 64 records:
//   producer   warpgroup 0: the index row into L2 first; then R threads per record (V3.2 4,
//              V4 2: Layout) gather its FP8 bytes, scales and RoPE into registers, taking its
//              16-byte vectors in turn (one load of a warp reads 16 R contiguous bytes of each of
//              32 / R records; meanwhile the next tile's lines are prefetched into L2, by ids
//              read a tile earlier), wait for a free stage, dequantize (e4m3 x scale -> bf16,
//              RNE) and store the tile [64, d_qk] into shared memory in the 128-byte-swizzled
//              layout wgmma reads; then arrive on the
//              stage's `full` mbarrier. Invalid ids (-1, or past topk_length) store zeros and a
//              -inf logit bias, never touching the cache.
//   consumers  warpgroups 1 and 2 (m = 0, 1) in one of two schedules (Role, below). Halves: S =
//              Q K^T for records 32m..32m+31 (wgmma m64n32k16, Q and K both from shared memory),
//              the online softmax in the log2 domain with the row maxima exchanged through shared
//              memory (both warpgroups keep the same running max), P (bf16) for their 32 records
//              stored into one shared [64, 64] tile, then O[:, 256m..256m+255] += P V (wgmma
//              m64n256k16, V the same tile read transposed). Scorer: warpgroup 1 scores all 64
//              records (m64n64k16) and hands P to warpgroup 2 through shared memory. Both release
//              the stage on its `empty` mbarrier.
// The output is O / l (times the sink factor) with lse = (m + log2 l) ln 2, or with S > 1 a
// partial (O / l, m + log2 l) per split that combine_kernel, launched next as a programmatic
// dependent (its launch overlaps the decode's tail), merges.
#include "decode_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../../common/csrc/fast_math.cuh"
#include "../../common/csrc/sm90_sync.cuh"

namespace dsa_decode {
namespace {

using dsa_fast_math::fast_exp2;
using dsa_fast_math::fast_log2;
using dsa_fast_math::neg_inf;
using dsa_fast_math::pos_inf;
using dsa_sm90::fence_mbarrier_init;
using dsa_sm90::fence_proxy_async;
using dsa_sm90::mbarrier_arrive;
using dsa_sm90::mbarrier_init;
using dsa_sm90::mbarrier_wait;
using dsa_sm90::named_barrier;
using dsa_sm90::named_barrier_arrive;
using dsa_sm90::smem_addr;

constexpr int kWarpSize = 32;
constexpr int kWarpgroupThreads = 128;
constexpr int kMathWarpgroups = 2;
constexpr int kThreads = (1 + kMathWarpgroups) * kWarpgroupThreads;  // producer + consumers
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
constexpr int kProducerThreads = kWarpgroupThreads;
constexpr int kQkTokens = kTileTokens / kMathWarpgroups;  // records each consumer scores
constexpr int kPvCols = kDv / kMathWarpgroups;            // value columns each consumer owns
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
//           tiles (V3.2 b >= 64), slower for the two-tile split programs of b = 2 and for V4.
enum class Role { kHalf, kScorer, kSecond };
// The launcher takes the scorer schedule for V3.2 programs with at least this many tiles.
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
  // Threads per record: R threads take its 16-byte vectors R v + part, so one load of a warp
  // reads 16 R contiguous bytes of each of 32 / R records; each thread fills kPasses records of
  // a tile, all their loads issued before any is used. V3.2 is fastest at 4 (its 512 FP8 dims
  // split in 8 vectors a thread), V4 at 2 (docs/kernels/mla_decode.md).
  static constexpr int kRecordThreads = kFormat == kFormatV32 ? 4 : 2;
  static constexpr int kPasses = kTileTokens * kRecordThreads / kWarpgroupThreads;  // records per producer thread
  static constexpr int kFp8PerThread = kQuantDims / kRecordThreads;
  static constexpr int kFp8Vecs = kFp8PerThread / 16;             // 16-byte vectors of FP8 values
  static constexpr int kRopePerThread = kRopeDims / kRecordThreads;
  static constexpr int kRopeVecs = kRopePerThread / kChunkCols;   // 16-byte vectors of bf16 RoPE
  static constexpr int kScaleWords = kFp32Scales ? 4 : 2;         // one 16-byte or 8-byte load
  // After setmaxnreg: the producer gives up what the consumers' accumulators take. The
  // producer of V3.2 holds two records' vectors; other splits spilled under nvcc 13.0.
  static constexpr int kProducerRegisters = kFormat == kFormatV32 ? 152 : 136;
  static constexpr int kConsumerRegisters = kFormat == kFormatV32 ? 176 : 184;
  // The scorer schedule (V3.2 only): the scorer holds S beside O, the second warpgroup O alone.
  static constexpr int kScorerRegisters = 192;
  static constexpr int kSecondRegisters = 160;
  // Where the producer reads the ids two tiles on: V3.2's two records of vectors leave no
  // registers for them during the gathers, so after the stores; V4 before its L2 prefetch.
  // Each placement measured faster for its format (benchmarks/h200/decode_ids_placement.log).
  static constexpr bool kIdsAfterStores = kFormat == kFormatV32;
  // Whether only a query token's first head block prefetches the next tile's records into L2: its
  // other head blocks gather the same records side by side and find them there. V3.2 b = 128 took
  // 442.7 against 449.2 us with it (benchmarks/h200/decode_pair_prefetch.log); V4's producer
  // spilled the head block it needs for the test, so V4 keeps the prefetch in every head block.
  static constexpr bool kFirstHeadBlockPrefetches = kFormat == kFormatV32;
  static_assert(kDqk % kAtomCols == 0 && kDqk >= kDv, "whole atoms; V is the first kDv dims");
  static_assert(kPasses >= 1 && kPasses * kWarpgroupThreads == kTileTokens * kRecordThreads, "whole records per producer thread");
  static_assert(kFp8PerThread % 16 == 0 && kRopePerThread % kChunkCols == 0, "whole vectors per producer thread");
  static_assert(kFp32Scales ? kDims.num_scales == kScaleWords : kDims.num_scales <= 4 * kScaleWords,
                "scales in one 16-byte (fp32) or 8-byte (UE8M0) load");
  static_assert(kScaleTile % (16 * kRecordThreads) == 0, "vectors R v .. R v + R - 1 share a scale tile");
  static_assert(kWarpgroupThreads * (kLaunchRegisters - kProducerRegisters) >= kMathThreads * (kConsumerRegisters - kLaunchRegisters),
                "the consumers take only what the producer released");
  static_assert(kProducerRegisters + kScorerRegisters + kSecondRegisters <= 3 * kLaunchRegisters,
                "the scorer takes only what the producer and the second warpgroup released");
};

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

template <int kRegisters>
__device__ __forceinline__ void set_registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void set_registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
// Four 8x8 bf16 blocks from the mma fragment layout into shared memory, lane l giving the address
// of row l % 8 of block l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(b0), "r"(b1), "r"(b2), "r"(b3)
               : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Byte offset of the 16-byte chunk holding column `col` (a multiple of 8) of row `row` in a
// swizzled tile of atoms.
__device__ __forceinline__ uint32_t swizzled(int row, int col) {
  const int chunk = (col / kChunkCols) % (kAtomRowBytes / 16);
  return (col / kAtomCols) * kAtomBytes + row * kAtomRowBytes + ((chunk ^ (row % 8)) << 4);
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32) | (1ull << 62);
}
// K-major operand (rows of 64 k-values per atom): 8-row groups 1024 B apart; the leading offset
// is unused with this swizzle. A k-step of 16 moves the start by 32 bytes inside the atom.
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) { return smem_desc(addr, 16, kSwizzleGroupBytes); }
// MN-major operand (V: rows are k = records, 64 n-values per atom row): atoms along n are
// kAtomBytes apart (leading), 8-row k-groups 1024 B apart (stride).
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t addr) { return smem_desc(addr, kAtomBytes, kSwizzleGroupBytes); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64, 32] (+)= A[64, 16] B[16, 32]: A and B K-major in shared memory (S = Q K^T).
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64, 64] (+)= A[64, 16] B[16, 64]: A and B K-major in shared memory (S = Q K^T).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The 128 accumulator operands of an m64n256 wgmma, shared by its two forms below.
#define DSA_WGMMA_ACC128                                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),              \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),        \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),      \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),      \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),      \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),      \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),      \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),      \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),      \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),      \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),      \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),      \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define DSA_WGMMA_D128                                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                     \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// D[64, 256] += A[64, 16] B[16, 256]: A in registers (four bf16 pairs per thread: heads r0 and
// r0 + 8, k 2 quad .. and 8 + 2 quad ..), B MN-major (transposed) in shared memory (O += P V, P the
// scorer's own).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"  // scale-d is a predicate operand: always accumulate
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DSA_WGMMA_D128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC128
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

// D[64, 256] (+)= A[64, 16] B[16, 256]: A K-major, B MN-major (transposed) in shared memory (O += P V).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DSA_WGMMA_D128
      "}, %128, %129, p, 1, 1, 0, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC128
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// 8 e4m3 values (two 32-bit words) times `scale`, as 8 bf16 (round to nearest even), through
// fp32: e4m3x2 -> f16x2 -> 2 x f32, the multiply, f32 x 2 -> bf16x2. (A path of integer bit moves
// and one bf16x2 multiply by the scale was slower on the H200: docs/kernels/mla_decode.md.)
__device__ __forceinline__ uint4 dequant8(uint32_t w0, uint32_t w1, float scale) {
  uint32_t out[4];
  const uint32_t words[2] = {w0, w1};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t pair = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A UE8M0 scale byte as the float 2^(e - 127) (e = 0: 2^-127, a subnormal).
__device__ __forceinline__ float ue8m0(uint32_t e) { return __int_as_float(e ? e << 23 : 0x00400000); }

// The page of a valid id (n >= 0) by the launcher's magic multiplier (DecodeArgs): a division by
// the run-time block size was about 16 instructions, four times a tile in the producer.
__device__ __forceinline__ int page_of(const DecodeArgs& a, int n) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * a.block_magic) >> a.block_shift);
}

struct Row {
  int bi, si, hb, split, n_pos, n_tiles;
  const int32_t* ids;  // the query token's index row
};

__device__ __forceinline__ int record_id(const DecodeArgs& a, const Row& row, int tile, int token) {
  const int k = tile * kTileTokens + token;
  return k < row.n_pos ? __ldg(row.ids + row.split + static_cast<int64_t>(k) * a.splits) : -1;
}

// The program's query token, head block, split and its share of the index row.
__device__ __forceinline__ Row program_row(const DecodeArgs& a) {
  Row row;
  row.hb = blockIdx.x;
  row.split = blockIdx.y;
  const int t = blockIdx.z;
  row.bi = t / a.s_q;
  row.si = t - row.bi * a.s_q;
  row.ids = a.indices + row.bi * a.idx_stride_b + row.si * a.idx_stride_s;
  int length = a.topk;
  if (a.topk_length != nullptr) length = min(length, max(__ldg(a.topk_length + row.bi), 0));
  row.n_pos = length > row.split ? (length - row.split + a.splits - 1) / a.splits : 0;
  row.n_tiles = (row.n_pos + kTileTokens - 1) / kTileTokens;
  return row;
}

// Warpgroup 0: gathers and dequantizes every tile of the program into the stages.
template <int kFormat>
__device__ __forceinline__ void produce(const DecodeArgs& a, const Row& row, Tiles<kFormat>& tiles, Small& sm) {
  using L = Layout<kFormat>;
  constexpr int R = L::kRecordThreads;
  constexpr int kRecordsPerPass = kProducerThreads / R;
  const int part = threadIdx.x % R;  // its vectors R v + part of each record
  // The records it fills: token[p] of every tile.
  int token[L::kPasses];
#pragma unroll
  for (int p = 0; p < L::kPasses; ++p) token[p] = threadIdx.x / R + p * kRecordsPerPass;
  // The index row into L2 first, and the ids read a tile ahead of the L2 prefetch of their
  // records: otherwise each tile's chain is a DRAM round trip for the next ids (the cache is
  // cold after a flush), then another for the records they name, then the gathers.
  if (row.n_pos > 0) {  // (an empty row has no line to prefetch, not even the byte before it)
    const int64_t bytes = (static_cast<int64_t>(row.n_pos - 1) * a.splits + 1) * 4;
    const char* first = reinterpret_cast<const char*>(row.ids + row.split);
    for (int64_t at = threadIdx.x * static_cast<int64_t>(kL2Line); at < bytes + kL2Line - 1; at += kProducerThreads * kL2Line)
      prefetch_l2(first + min(at, bytes - 1));
  }
  int id[L::kPasses], next[L::kPasses];
#pragma unroll
  for (int p = 0; p < L::kPasses; ++p) {
    id[p] = row.n_tiles > 0 ? record_id(a, row, 0, token[p]) : -1;
    next[p] = row.n_tiles > 1 ? record_id(a, row, 1, token[p]) : -1;
  }
  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    uint4 raw[L::kPasses][L::kFp8Vecs];
    uint4 rope[L::kPasses][L::kRopeVecs];
    uint32_t scale_words[L::kPasses][L::kScaleWords];
#pragma unroll
    for (int p = 0; p < L::kPasses; ++p) {
      if (id[p] >= 0) {
        const int block = page_of(a, id[p]);
        const int slot = id[p] - block * a.block_size;
        const uint8_t* page = a.cache + static_cast<int64_t>(block) * a.page_stride;
        const uint8_t* data = page + static_cast<int64_t>(slot) * a.data_slot_bytes;
        const uint4* values = reinterpret_cast<const uint4*>(data) + part;
#pragma unroll
        for (int v = 0; v < L::kFp8Vecs; ++v) raw[p][v] = __ldg(values + R * v);
        const uint4* rope_src = reinterpret_cast<const uint4*>(data + a.rope_offset) + part;
#pragma unroll
        for (int v = 0; v < L::kRopeVecs; ++v) rope[p][v] = __ldg(rope_src + R * v);
        const uint8_t* scale_src = page + a.scale_base + static_cast<int64_t>(slot) * a.scale_slot_bytes;
        if constexpr (L::kFp32Scales) {
          const uint4 all = __ldg(reinterpret_cast<const uint4*>(scale_src));
          scale_words[p][0] = all.x, scale_words[p][1] = all.y, scale_words[p][2] = all.z, scale_words[p][3] = all.w;
        } else {
          const uint2 all = __ldg(reinterpret_cast<const uint2*>(scale_src));
          scale_words[p][0] = all.x, scale_words[p][1] = all.y;
        }
      } else {  // zeros (scale 0 too: an invalid record's values must not be NaN, P is 0 there)
#pragma unroll
        for (int v = 0; v < L::kFp8Vecs; ++v) raw[p][v] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int v = 0; v < L::kRopeVecs; ++v) rope[p][v] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int w = 0; w < L::kScaleWords; ++w) scale_words[p][w] = 0;
      }
    }
    // The ids two tiles on (here or after the stores: Layout), and the next tile's records into
    // L2 while this one's loads are in flight (for V3.2 by the token's first head block only: Layout).
    int after[L::kPasses];
#pragma unroll
    for (int p = 0; p < L::kPasses; ++p) {
      if constexpr (!L::kIdsAfterStores) after[p] = i + 2 < row.n_tiles ? record_id(a, row, i + 2, token[p]) : -1;
      if (next[p] >= 0 && (!L::kFirstHeadBlockPrefetches || row.hb == 0)) {
        const int block = page_of(a, next[p]);
        const int slot = next[p] - block * a.block_size;
        const uint8_t* page = a.cache + static_cast<int64_t>(block) * a.page_stride;
        const uint8_t* data = page + static_cast<int64_t>(slot) * a.data_slot_bytes;
        const uint32_t span = static_cast<uint32_t>(a.data_slot_bytes);
        for (uint32_t at = part * kL2Line; at < span + kL2Line - 1; at += R * kL2Line) prefetch_l2(data + min(at, span - 1));
        if (!L::kScalesInRow && part == R - 1) prefetch_l2(page + a.scale_base + static_cast<int64_t>(slot) * a.scale_slot_bytes);
      }
    }
    if (i >= kStages) mbarrier_wait(&sm.empty[stage], ((i / kStages) - 1) & 1);
    uint8_t* tile = tiles.kv[stage];
#pragma unroll
    for (int p = 0; p < L::kPasses; ++p) {
#pragma unroll
      for (int v = 0; v < L::kFp8Vecs; ++v) {
        const int col = 16 * (R * v + part);
        const int scale_tile = (16 * R * v) / L::kScaleTile;  // the same for every part (Layout)
        float scale;
        if constexpr (L::kFp32Scales) {
          scale = __uint_as_float(scale_words[p][scale_tile]);
        } else {
          scale = ue8m0((scale_words[p][scale_tile / 4] >> (8 * (scale_tile % 4))) & 0xff);
        }
        *reinterpret_cast<uint4*>(tile + swizzled(token[p], col)) = dequant8(raw[p][v].x, raw[p][v].y, scale);
        *reinterpret_cast<uint4*>(tile + swizzled(token[p], col + kChunkCols)) = dequant8(raw[p][v].z, raw[p][v].w, scale);
      }
#pragma unroll
      for (int v = 0; v < L::kRopeVecs; ++v)
        *reinterpret_cast<uint4*>(tile + swizzled(token[p], L::kQuantDims + kChunkCols * (R * v + part))) = rope[p][v];
      if (part == 0) sm.bias[stage][token[p]] = id[p] >= 0 ? 0.0f : neg_inf();
    }
    fence_proxy_async();  // the stores above are read by wgmma (the async proxy)
    mbarrier_arrive(&sm.full[stage]);
#pragma unroll
    for (int p = 0; p < L::kPasses; ++p) {
      if constexpr (L::kIdsAfterStores) after[p] = i + 2 < row.n_tiles ? record_id(a, row, i + 2, token[p]) : -1;
      id[p] = next[p];
      next[p] = after[p];
    }
  }
}

// S [64 heads, kRecords] = Q K^T over the tile's d_qk (kAtoms atoms), Q and K (records from
// k_base) K-major in shared memory: chained wgmma m64n32k16 or m64n64k16, completed on return.
template <int kAtoms, int kRecords>
__device__ __forceinline__ void score_tile(float (&s)[kRecords / 2], uint32_t q_base, uint32_t k_base) {
  static_assert(kRecords == 32 || kRecords == 64, "wgmma m64n32 or m64n64");
#pragma unroll
  for (int j = 0; j < kRecords / 2; ++j) s[j] = 0.0f;
  fence_registers(s);
  wgmma_fence();
#pragma unroll
  for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
    for (int k = 0; k < kAtomCols / kMmaK; ++k) {
      const uint32_t offset = atom * kAtomBytes + k * kMmaK * 2;
      if constexpr (kRecords == 32) {
        wgmma_m64n32k16(s, kmajor_desc(q_base + offset), kmajor_desc(k_base + offset), atom + k > 0);
      } else {
        wgmma_m64n64k16(s, kmajor_desc(q_base + offset), kmajor_desc(k_base + offset), atom + k > 0);
      }
    }
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_registers(s);
}

// S times the softmax scale (log2 domain) plus each record's bias (0, or -inf for an invalid id;
// `bias` is the tile's first scored record's), and the rows' maxima over the quad. Fragment j of
// S: records 8j + 2 quad + {0, 1} from the first, rows r0 and r0 + 8.
template <int kRegs>
__device__ __forceinline__ void scale_and_row_max(float (&s)[kRegs], const float* bias, int quad, float scale_log2,
                                                  float& max0, float& max1) {
  max0 = neg_inf(), max1 = neg_inf();
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    const int token = 8 * j + 2 * quad;
    const float b0 = bias[token], b1 = bias[token + 1];
    s[4 * j + 0] = fmaf(s[4 * j + 0], scale_log2, b0);
    s[4 * j + 1] = fmaf(s[4 * j + 1], scale_log2, b1);
    s[4 * j + 2] = fmaf(s[4 * j + 2], scale_log2, b0);
    s[4 * j + 3] = fmaf(s[4 * j + 3], scale_log2, b1);
    max0 = fmaxf(max0, fmaxf(s[4 * j + 0], s[4 * j + 1]));
    max1 = fmaxf(max1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int x = 1; x < 4; x *= 2) {
    max0 = fmaxf(max0, __shfl_xor_sync(0xffffffffu, max0, x));
    max1 = fmaxf(max1, __shfl_xor_sync(0xffffffffu, max1, x));
  }
}

// One online-softmax step of a row: the new running max from the tile's, the reference its P is
// taken against (a row that has seen no valid record keeps -inf as its max and 0 as its
// reference) and the factor for the old O and l.
__device__ __forceinline__ void softmax_step(float& m_run, float tile_max, float& ref, float& alpha) {
  const float next = fmaxf(m_run, tile_max);
  ref = next == neg_inf() ? 0.0f : next;
  alpha = fast_exp2(m_run - ref);
  m_run = next;
}

// Records 8j + 2 quad + {0, 1} of S's fragment j: P = 2^(S - ref) of rows r0 (.x) and r0 + 8 (.y)
// as bf16 pairs, the rows' sums of P grown by them.
template <int kRegs>
__device__ __forceinline__ uint2 softmax_p_pairs(const float (&s)[kRegs], int j, float ref0, float ref1, float& sum0,
                                                 float& sum1) {
  const float p0 = fast_exp2(s[4 * j + 0] - ref0), p1 = fast_exp2(s[4 * j + 1] - ref0);
  const float p2 = fast_exp2(s[4 * j + 2] - ref1), p3 = fast_exp2(s[4 * j + 3] - ref1);
  sum0 += p0 + p1;
  sum1 += p2 + p3;
  const __nv_bfloat162 top = __floats2bfloat162_rn(p0, p1), bottom = __floats2bfloat162_rn(p2, p3);
  return make_uint2(*reinterpret_cast<const uint32_t*>(&top), *reinterpret_cast<const uint32_t*>(&bottom));
}

// O's rows r0 and r0 + 8 times their factors.
__device__ __forceinline__ void rescale_rows(float (&acc)[kAccRegs], float alpha0, float alpha1) {
#pragma unroll
  for (int j = 0; j < kAccRegs / 4; ++j) {
    acc[4 * j + 0] *= alpha0;
    acc[4 * j + 1] *= alpha0;
    acc[4 * j + 2] *= alpha1;
    acc[4 * j + 3] *= alpha1;
  }
}

// Warpgroups 1 and 2: attend the tiles in their Role (above), then write the output (or the
// split's partial).
template <int kFormat, Role kRole>
__device__ __forceinline__ void consume(const DecodeArgs& a, const Row& row, Tiles<kFormat>& tiles, Small& sm) {
  using L = Layout<kFormat>;
  const int mt = threadIdx.x - kWarpgroupThreads;  // 0 .. kMathThreads - 1
  // Value columns 256m.. of O (halves: also records 32m.. of S).
  const int m = kRole == Role::kHalf ? mt / kWarpgroupThreads : kRole == Role::kScorer ? 0 : 1;
  const int lane = mt % kWarpSize;
  const int quad = lane % 4;
  // Accumulator fragment j: heads r0 and r0 + 8, value columns col0 + 8 j (+ 1).
  const Fragment frag = partial_fragment(mt, 0);
  const int r0 = frag.r0, r1 = r0 + 8;

  // Q [64 heads, d_qk] into its swizzled tile, by both consumer warpgroups.
  // Every load of a thread is issued before its first store: a loop of load-then-store waited
  // for DRAM once per chunk (6.6 us before the first tile could start at b = 2).
  constexpr int kQChunks = L::kDqk / kChunkCols;
  constexpr int kQChunksPerThread = kHeadsPerProgram * kQChunks / kMathThreads;
  static_assert(kHeadsPerProgram * kQChunks % kMathThreads == 0, "Q's chunks split evenly over the consumers");
  const uint16_t* q_rows = a.q + row.bi * a.q_stride_b + row.si * a.q_stride_s +
                           static_cast<int64_t>(row.hb) * kHeadsPerProgram * a.q_stride_h;
  {
    uint4 q_chunks[kQChunksPerThread];
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = mt + k * kMathThreads;
      q_chunks[k] = __ldg(reinterpret_cast<const uint4*>(q_rows + (c / kQChunks) * a.q_stride_h + (c % kQChunks) * kChunkCols));
    }
#pragma unroll
    for (int k = 0; k < kQChunksPerThread; ++k) {
      const int c = mt + k * kMathThreads;
      *reinterpret_cast<uint4*>(tiles.q + swizzled(c / kQChunks, (c % kQChunks) * kChunkCols)) = q_chunks[k];
    }
  }
  fence_proxy_async();
  named_barrier(kMathBarrier, kMathThreads);

  float acc[kAccRegs];
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) acc[i] = 0.0f;
  float m_run0 = neg_inf(), m_run1 = neg_inf(), l_run0 = 0.0f, l_run1 = 0.0f;
  const uint32_t q_base = smem_addr(tiles.q);
  const uint32_t p_base = smem_addr(tiles.p);
  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    mbarrier_wait(&sm.full[stage], (i / kStages) & 1);
    const uint32_t kv_base = smem_addr(tiles.kv[stage]);
    const uint32_t v_base = kv_base + m * (kPvCols / kAtomCols) * kAtomBytes;  // V's columns 256m..
    if constexpr (kRole == Role::kHalf) {
      // S [64 heads, 32 records] = Q K^T for records 32m .. 32m + 31; the online softmax, log2 domain.
      float s[kLogitRegs];
      score_tile<L::kAtoms, kQkTokens>(s, q_base, kv_base + m * kQkTokens * kAtomRowBytes);
      float max0, max1;
      scale_and_row_max(s, &sm.bias[stage][m * kQkTokens], quad, a.scale_log2, max0, max1);
      if (quad == 0) {
        sm.row_max[m][r0] = max0;
        sm.row_max[m][r1] = max1;
      }
      // Barrier A: both halves' maxima are in (and, by program order, both warpgroups' P.V of the
      // previous tile has completed, so P may be overwritten below).
      named_barrier(kMathBarrier, kMathThreads);
      float ref0, ref1, alpha0, alpha1;
      softmax_step(m_run0, fmaxf(max0, sm.row_max[1 - m][r0]), ref0, alpha0);
      softmax_step(m_run1, fmaxf(max1, sm.row_max[1 - m][r1]), ref1, alpha1);
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kLogitRegs / 4; ++j) {
        const uint2 pair = softmax_p_pairs(s, j, ref0, ref1, sum0, sum1);
        const int token = m * kQkTokens + 8 * j + 2 * quad;
        const int within = (token % kChunkCols) * 2;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled(r0, token) + within) = pair.x;
        *reinterpret_cast<uint32_t*>(tiles.p + swizzled(r1, token) + within) = pair.y;
      }
      l_run0 = l_run0 * alpha0 + sum0;
      l_run1 = l_run1 * alpha1 + sum1;
      fence_proxy_async();
      named_barrier(kMathBarrier, kMathThreads);  // barrier B: all of P is stored

      // O[:, 256m ..] = alpha O + P V.
      rescale_rows(acc, alpha0, alpha1);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        wgmma_m64n256k16(acc, kmajor_desc(p_base + k * kMmaK * 2),
                         mnmajor_desc(v_base + k * kMmaK * kAtomRowBytes), 1);
    } else if constexpr (kRole == Role::kScorer) {
      // S [64 heads, 64 records] = Q K^T; the online softmax, log2 domain.
      float s[kScorerLogitRegs];
      score_tile<L::kAtoms, kTileTokens>(s, q_base, kv_base);
      float max0, max1;
      scale_and_row_max(s, sm.bias[stage], quad, a.scale_log2, max0, max1);
      float ref0, ref1, alpha0, alpha1;
      softmax_step(m_run0, max0, ref0, alpha0);
      softmax_step(m_run1, max1, ref1, alpha1);
      // P as bf16 pairs in the A-fragment order of wgmma: pair 2j heads r0, pair 2j + 1 heads r1.
      uint32_t pa[kPRegs];
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < kScorerLogitRegs / 4; ++j) {
        const uint2 pair = softmax_p_pairs(s, j, ref0, ref1, sum0, sum1);
        pa[2 * j] = pair.x;
        pa[2 * j + 1] = pair.y;
      }
      l_run0 = l_run0 * alpha0 + sum0;
      l_run1 = l_run1 * alpha1 + sum1;
      // P and the rescale factors to warpgroup 2, once it has read the previous tile's: one
      // stmatrix per k-step stores its four 8x8 blocks (heads r0.. and r0 + 8.., records 16k.. and
      // 16k + 8..), lane l giving the address of row l % 8 of block l / 8.
      if (i > 0) named_barrier(kPFreeBarrier, kMathThreads);
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k) {
        const int block = lane / 8;
        const int head = 16 * (mt / kWarpSize) + 8 * (block % 2) + lane % 8;
        stmatrix_x4(p_base + swizzled(head, k * kMmaK + kChunkCols * (block / 2)), pa[4 * k], pa[4 * k + 1], pa[4 * k + 2],
                    pa[4 * k + 3]);
      }
      if (quad == 0) {
        sm.row_scale[r0] = alpha0;
        sm.row_scale[r1] = alpha1;
      }
      fence_proxy_async();  // P is read by warpgroup 2's wgmma
      named_barrier_arrive(kPReadyBarrier, kMathThreads);

      // O[:, 0 .. 255] = alpha O + P V, P from registers.
      rescale_rows(acc, alpha0, alpha1);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        wgmma_m64n256k16_rs(acc, pa[4 * k], pa[4 * k + 1], pa[4 * k + 2], pa[4 * k + 3],
                            mnmajor_desc(v_base + k * kMmaK * kAtomRowBytes));
    } else {  // Role::kSecond
      // O[:, 256 .. 511] = alpha O + P V, P and alpha from the scorer.
      named_barrier(kPReadyBarrier, kMathThreads);
      rescale_rows(acc, sm.row_scale[r0], sm.row_scale[r1]);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kTileTokens / kMmaK; ++k)
        wgmma_m64n256k16(acc, kmajor_desc(p_base + k * kMmaK * 2), mnmajor_desc(v_base + k * kMmaK * kAtomRowBytes), 1);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(acc);
    if (lane == 0) mbarrier_arrive(&sm.empty[stage]);
    // Scorer schedule: P and the scales are read (the wgmma has completed), the scorer may store the next tile's.
    if (kRole == Role::kSecond && i + 1 < row.n_tiles) named_barrier_arrive(kPFreeBarrier, kMathThreads);
  }

  // Row sums over the quad; halves: then over both warpgroups; scorer: its m and l to the second.
  if constexpr (kRole != Role::kSecond) {
#pragma unroll
    for (int x = 1; x < 4; x *= 2) {
      l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, x);
      l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, x);
    }
    if (quad == 0) {
      sm.row_sum[m][r0] = l_run0, sm.row_sum[m][r1] = l_run1;
      if constexpr (kRole == Role::kScorer) sm.row_max[0][r0] = m_run0, sm.row_max[0][r1] = m_run1;
    }
  }
  named_barrier(kMathBarrier, kMathThreads);
  float l0 = l_run0, l1 = l_run1;
  if constexpr (kRole == Role::kHalf) {
    l0 += sm.row_sum[1 - m][r0], l1 += sm.row_sum[1 - m][r1];
  } else if constexpr (kRole == Role::kSecond) {
    m_run0 = sm.row_max[0][r0], m_run1 = sm.row_max[0][r1];
    l0 = sm.row_sum[0][r0], l1 = sm.row_sum[0][r1];
  }
  const bool empty0 = l0 == 0.0f, empty1 = l1 == 0.0f;
  const float lse2_0 = m_run0 + fast_log2(empty0 ? 1.0f : l0), lse2_1 = m_run1 + fast_log2(empty1 ? 1.0f : l1);
  const int head0 = row.hb * kHeadsPerProgram + r0, head1 = head0 + 8;
  const int col0 = m * kPvCols + 2 * quad;  // + 8 j
  if (a.splits == 1) {
    const float lse0 = lse2_0 * kLn2, lse1 = lse2_1 * kLn2;
    float f0 = 1.0f, f1 = 1.0f;
    if (a.sink != nullptr) {
      f0 = 1.0f / (1.0f + expf(__ldg(a.sink + head0) - lse0));
      f1 = 1.0f / (1.0f + expf(__ldg(a.sink + head1) - lse1));
    }
    const float inv0 = empty0 ? 0.0f : f0 / l0, inv1 = empty1 ? 0.0f : f1 / l1;
    uint16_t* out0 = a.out + row.bi * a.out_stride_b + row.si * a.out_stride_s + head0 * a.out_stride_h + col0;
    uint16_t* out1 = out0 + 8 * a.out_stride_h;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j) {
      const __nv_bfloat162 top = __floats2bfloat162_rn(acc[4 * j + 0] * inv0, acc[4 * j + 1] * inv0);
      const __nv_bfloat162 bottom = __floats2bfloat162_rn(acc[4 * j + 2] * inv1, acc[4 * j + 3] * inv1);
      *reinterpret_cast<__nv_bfloat162*>(out0 + 8 * j) = top;
      *reinterpret_cast<__nv_bfloat162*>(out1 + 8 * j) = bottom;
    }
    if (m == 0 && quad == 0) {
      float* lse = a.lse + row.bi * a.lse_stride_b + row.si * a.lse_stride_s;
      lse[head0 * a.lse_stride_h] = empty0 ? pos_inf() : lse0;
      lse[head1 * a.lse_stride_h] = empty1 ? pos_inf() : lse1;
    }
  } else {
    const int64_t unit = static_cast<int64_t>(row.bi * a.s_q + row.si) * (a.h_q / kHeadsPerProgram) + row.hb;
    const int64_t part = unit * a.splits + row.split;
    // fp16 with the thread's largest |O / l| at 2^14: every element keeps fp16's 11 bits (2^-11
    // of itself) and none overflows; part_scale undoes the factor.
    const float inv0 = empty0 ? 0.0f : 1.0f / l0, inv1 = empty1 ? 0.0f : 1.0f / l1;
    float top0 = 0.0f, top1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j) {
      top0 = fmaxf(top0, fmaxf(fabsf(acc[4 * j + 0]), fabsf(acc[4 * j + 1])));
      top1 = fmaxf(top1, fmaxf(fabsf(acc[4 * j + 2]), fabsf(acc[4 * j + 3])));
    }
    const float top = fmaxf(top0 * inv0, top1 * inv1);
    const float up = top > 0.0f ? kPartialTop / top : 0.0f;
    const float up0 = inv0 * up, up1 = inv1 * up;
    // In fragment order (partial_fragment): store j of the 256 consumer threads is 2 KB in a row.
    uint2* frags = reinterpret_cast<uint2*>(a.part_out) + part * kPartialFragments + mt;
#pragma unroll
    for (int j = 0; j < kAccRegs / 4; ++j)
      frags[j * kMathThreads] = make_uint2(half2_bits(acc[4 * j + 0] * up0, acc[4 * j + 1] * up0),
                                           half2_bits(acc[4 * j + 2] * up1, acc[4 * j + 3] * up1));
    a.part_scale[part * kMathThreads + mt] = top * (1.0f / kPartialTop);
    if (m == 0 && quad == 0) {
      a.part_lse[part * kHeadsPerProgram + r0] = empty0 ? neg_inf() : lse2_0;
      a.part_lse[part * kHeadsPerProgram + r1] = empty1 ? neg_inf() : lse2_1;
    }
  }
}

template <int kFormat, bool kScorerSchedule>
__global__ void __launch_bounds__(kThreads, 1) decode_kernel(const __grid_constant__ DecodeArgs a) {
  extern __shared__ uint8_t shared_raw[];
  // Offset from shared_raw itself (not through an integer): the compiler then knows every tile
  // pointer is shared memory and emits STS/LDS instead of generic stores and loads.
  uint8_t* base = shared_raw + ((1024 - (smem_addr(shared_raw) & 1023)) & 1023);
  Tiles<kFormat>& tiles = *reinterpret_cast<Tiles<kFormat>*>(base);
  Small& sm = *reinterpret_cast<Small*>(base + sizeof(Tiles<kFormat>));

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&sm.full[s], kProducerThreads);
      mbarrier_init(&sm.empty[s], kMathThreads / kWarpSize);
    }
    fence_mbarrier_init();
  }
  using L = Layout<kFormat>;
  // The program's row once, before the warpgroups rebalance their registers (with the row computed
  // by each warpgroup after setmaxnreg V3.2 b = 128 took 455.8 against 448.5 us, V4 the same).
  const Row row = program_row(a);
  __syncthreads();
  // The consumers' branch written first puts the producer first in the SASS, so its code no longer
  // moves with the consumers' epilogue (measured: V3.2 b = 128 467.5 -> 456.7 us with nothing else changed).
  if (threadIdx.x >= kWarpgroupThreads) {
    if constexpr (!kScorerSchedule) {
      set_registers_up<L::kConsumerRegisters>();
      consume<kFormat, Role::kHalf>(a, row, tiles, sm);
    } else if (threadIdx.x < 2 * kWarpgroupThreads) {
      set_registers_up<L::kScorerRegisters>();
      consume<kFormat, Role::kScorer>(a, row, tiles, sm);
    } else {
      set_registers_down<L::kSecondRegisters>();
      consume<kFormat, Role::kSecond>(a, row, tiles, sm);
    }
  } else {
    set_registers_down<L::kProducerRegisters>();
    produce<kFormat>(a, row, tiles, sm);
  }
}

// Grid (units, kCombinePrograms), kMathThreads threads: program (u, c) merges the splits'
// partials of unit u (a query token's head block) for fragments j = c * kCombineFragRows ..
// (partial_fragment): thread mt takes fragment j * kMathThreads + mt of every split. With
// M = max_s lse2_s (0 when every split is empty) and w_s = 2^(lse2_s - M),
// out = sum_s w_s out_s / sum_s w_s, lse = (M + log2 sum_s w_s) ln 2, then the sink factor.
constexpr int kCombineThreads = kMathThreads;
constexpr int kCombineFragRows = 2;  // 16 programs a unit: 128 at b = 2
constexpr int kCombinePrograms = kPartialFragments / kMathThreads / kCombineFragRows;
// Splits whose partials one thread loads before it adds them up.
constexpr int kCombineSplitsInFlight = 4;
static_assert(kPartialFragments % (kMathThreads * kCombineFragRows) == 0, "whole fragment rows per program");

__global__ void __launch_bounds__(kCombineThreads, 1) combine_kernel(const __grid_constant__ DecodeArgs a) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the decode grid's partials are complete and visible
  const int unit = blockIdx.x;
  const int head_blocks = a.h_q / kHeadsPerProgram;
  const int t = unit / head_blocks, hb = unit - t * head_blocks;
  const int bi = t / a.s_q, si = t - bi * a.s_q;
  const int mt = threadIdx.x;
  const Fragment at = partial_fragment(mt, 0);
  const int r1 = at.r0 + 8;
  const int64_t first = static_cast<int64_t>(unit) * a.splits;
  float top0 = neg_inf(), top1 = neg_inf();
  for (int s = 0; s < a.splits; ++s) {
    top0 = fmaxf(top0, __ldcg(a.part_lse + (first + s) * kHeadsPerProgram + at.r0));
    top1 = fmaxf(top1, __ldcg(a.part_lse + (first + s) * kHeadsPerProgram + r1));
  }
  const float ref0 = top0 == neg_inf() ? 0.0f : top0, ref1 = top1 == neg_inf() ? 0.0f : top1;
  float4 acc[kCombineFragRows];
#pragma unroll
  for (int f = 0; f < kCombineFragRows; ++f) acc[f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float total0 = 0.0f, total1 = 0.0f;
  const uint2* frags = reinterpret_cast<const uint2*>(a.part_out) + blockIdx.y * kCombineFragRows * kMathThreads + mt;
  // kCombineSplitsInFlight splits' loads issued together, then their sums. (Loads interleaved
  // with the multiply-adds split by split waited on L2 once per split. The launch bounds of one
  // block per SM let ptxas keep a whole batch in registers.)
  for (int s0 = 0; s0 < a.splits; s0 += kCombineSplitsInFlight) {
    uint2 v[kCombineSplitsInFlight][kCombineFragRows];
    float w0[kCombineSplitsInFlight], w1[kCombineSplitsInFlight], d[kCombineSplitsInFlight];
#pragma unroll
    for (int k = 0; k < kCombineSplitsInFlight; ++k) {
      // Past the count, the last split is loaded again (no branch around the loads) at weight 0.
      const bool present = s0 + k < a.splits;
      const int64_t part = first + min(s0 + k, a.splits - 1);
      const float lse0 = __ldcg(a.part_lse + part * kHeadsPerProgram + at.r0), lse1 = __ldcg(a.part_lse + part * kHeadsPerProgram + r1);
      w0[k] = present ? lse0 : neg_inf();
      w1[k] = present ? lse1 : neg_inf();
      d[k] = __ldcg(a.part_scale + part * kMathThreads + mt);  // the consumer thread mt's fp16 scale
#pragma unroll
      for (int f = 0; f < kCombineFragRows; ++f) v[k][f] = __ldcg(frags + part * kPartialFragments + f * kMathThreads);
    }
#pragma unroll
    for (int k = 0; k < kCombineSplitsInFlight; ++k) {
      const float weight0 = fast_exp2(w0[k] - ref0), weight1 = fast_exp2(w1[k] - ref1);  // 0 for an absent or empty split
      total0 += weight0;
      total1 += weight1;
      const float unit0 = weight0 * d[k], unit1 = weight1 * d[k];  // the split's weight times its fp16 scale
#pragma unroll
      for (int f = 0; f < kCombineFragRows; ++f) {
        const float2 top = half2_floats(v[k][f].x), bottom = half2_floats(v[k][f].y);
        acc[f].x = fmaf(unit0, top.x, acc[f].x);
        acc[f].y = fmaf(unit0, top.y, acc[f].y);
        acc[f].z = fmaf(unit1, bottom.x, acc[f].z);
        acc[f].w = fmaf(unit1, bottom.y, acc[f].w);
      }
    }
  }
  const int head0 = hb * kHeadsPerProgram + at.r0, head1 = head0 + 8;
  const bool empty0 = total0 == 0.0f, empty1 = total1 == 0.0f;
  const float lse0 = (ref0 + fast_log2(empty0 ? 1.0f : total0)) * kLn2, lse1 = (ref1 + fast_log2(empty1 ? 1.0f : total1)) * kLn2;
  const float factor0 = a.sink != nullptr ? 1.0f / (1.0f + expf(__ldg(a.sink + head0) - lse0)) : 1.0f;
  const float factor1 = a.sink != nullptr ? 1.0f / (1.0f + expf(__ldg(a.sink + head1) - lse1)) : 1.0f;
  const float scale0 = empty0 ? 0.0f : factor0 / total0, scale1 = empty1 ? 0.0f : factor1 / total1;
  uint16_t* out0 = a.out + bi * a.out_stride_b + si * a.out_stride_s + head0 * a.out_stride_h;
  uint16_t* out1 = out0 + 8 * a.out_stride_h;
#pragma unroll
  for (int f = 0; f < kCombineFragRows; ++f) {
    const int col = partial_fragment(mt, blockIdx.y * kCombineFragRows + f).col;
    *reinterpret_cast<__nv_bfloat162*>(out0 + col) = __floats2bfloat162_rn(acc[f].x * scale0, acc[f].y * scale0);
    *reinterpret_cast<__nv_bfloat162*>(out1 + col) = __floats2bfloat162_rn(acc[f].z * scale1, acc[f].w * scale1);
  }
  if (blockIdx.y == 0 && mt < kWarpgroupThreads && mt % 4 == 0) {  // each head once: warpgroup 0, quad 0
    float* lse = a.lse + bi * a.lse_stride_b + si * a.lse_stride_s;
    lse[head0 * a.lse_stride_h] = empty0 ? pos_inf() : lse0;
    lse[head1 * a.lse_stride_h] = empty1 ? pos_inf() : lse1;
  }
}

template <int kFormat, bool kScorerSchedule>
cudaError_t launch(const DecodeArgs& a, cudaStream_t stream) {
  constexpr int bytes = shared_bytes<kFormat>();
  cudaError_t err = cudaFuncSetAttribute(decode_kernel<kFormat, kScorerSchedule>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(a.h_q / kHeadsPerProgram, a.splits, a.batch * a.s_q);
  decode_kernel<kFormat, kScorerSchedule><<<grid, kThreads, bytes, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.splits == 1) return err;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(a.batch * a.s_q * (a.h_q / kHeadsPerProgram)), kCombinePrograms);
  config.blockDim = dim3(kCombineThreads);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, combine_kernel, a);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Whether the consumers take the scorer schedule (Role): V3.2 programs of at least
// kScorerMinTiles tiles of the index row.
bool takes_scorer_schedule(const DecodeArgs& args) {
  const int64_t positions = (static_cast<int64_t>(args.topk) + args.splits - 1) / args.splits;  // a program's share
  return args.format == kFormatV32 && positions >= static_cast<int64_t>(kScorerMinTiles) * kTileTokens;
}

}  // namespace

cudaError_t launch_decode(const DecodeArgs& args, cudaStream_t stream) {
  if (args.format != kFormatV32) return launch<kFormatV4, false>(args, stream);
  return takes_scorer_schedule(args) ? launch<kFormatV32, true>(args, stream) : launch<kFormatV32, false>(args, stream);
}

}  // namespace dsa_decode
