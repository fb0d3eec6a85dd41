// FlashMLA-style sparse MLA decode over FP8 KV records for Hopper, hand-written (wgmma): the
// launcher of the 64-head kernel (kernel_m64.cuh) and of its combine (combine.cuh).
// Pure CUDA (no torch); nvcc links it with decode_capi.cpp, the C ABI, into one shared library
// (common/cuda_build.py). docs/kernels/mla_decode.md explains the design.
//
// Grid (h_q / 64 head blocks, 1, programs: DecodeArgs' schedule); M64Roles' threads: one or two
// producer warpgroups (m64_producer_groups) and two consumer warpgroups, one program per SM (the
// dequantized tiles fill shared memory). Program (hb, split s of S, token t) attends the 64 heads
// hb*64.. of query token t over the positions s, s + S, s + 2S, ... of its index row (S = 1: all),
// in tiles of 64 records:
//   producers  warpgroup 0 (and 1): the index row into L2 first; then R threads per record
//              (ProducerPlan: 4, V4 with one warpgroup 2) gather its FP8 bytes, scales and RoPE into registers, taking its
//              16-byte vectors in turn (one load of a warp reads 16 R contiguous bytes of each of
//              32 / R records; meanwhile the next tile's lines are prefetched into L2, by ids
//              read a tile earlier), wait for a free stage, dequantize (e4m3 x scale -> bf16,
//              RNE) and store the tile [64, d_qk] into shared memory in the 128-byte-swizzled
//              layout wgmma reads; then arrive on the stage's `full` mbarrier. Invalid ids (-1, or past topk_length) store zeros and a
//              -inf logit bias, never touching the cache.
//   consumers  the last two warpgroups (m = 0, 1) in one of two schedules (Role, below). Halves: S =
//              Q K^T for records 32m..32m+31 (wgmma m64n32k16, Q and K both from shared memory),
//              the online softmax in the log2 domain with the row maxima exchanged through shared
//              memory (both warpgroups keep the same running max), P (bf16) for their 32 records
//              stored into one shared [64, 64] tile, then O[:, 256m..256m+255] += P V (wgmma
//              m64n256k16, or two m64n128k16 in a 512-thread kernel; V the same tile read
//              transposed). Scorer: consumer m = 0 scores all 64 records (m64n64k16) and hands P
//              to m = 1 through shared memory. Both release
//              the stage on its `empty` mbarrier.
// The output is O / l (times the sink factor) with lse = (m + log2 l) ln 2, or with S > 1 a
// partial (O / l, m + log2 l) per split, which the split programs merge themselves behind a ticket
// barrier (DecodeArgs::tickets), or else combine_kernel, launched next as a programmatic dependent
// (its launch overlaps the decode's tail).
#include "decode_sm90.h"

#include "kernel_m64.cuh"
#include "combine.cuh"

namespace dsa_decode {
namespace {

// The 64-head kernel's combine.
constexpr int kCombineThreads = PartialsM64::kOwners;
__global__ void __launch_bounds__(kCombineThreads, 1) combine_kernel(const __grid_constant__ DecodeArgs a) {
  combine_unit<PartialsM64>(a);
}

template <int kFormat, bool kScorerSchedule, bool kMixed>
cudaError_t launch(const DecodeArgs& a, cudaStream_t stream) {
  constexpr int bytes = shared_bytes<kFormat>();
  constexpr int kGroups = m64_producer_groups<kFormat, kScorerSchedule>();
  const auto kernel = decode_kernel<kFormat, kScorerSchedule, kGroups, kMixed>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const int split = split_tokens(a);
  const dim3 grid(a.h_q / kHeadsPerProgram, 1, a.whole_tokens + split * a.splits);
  err = check_in_launch_combine(a, grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, M64Roles<kFormat, kGroups>::kThreads, bytes, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.splits == 1 || split == 0 || a.tickets != nullptr) return err;
  return launch_combine<PartialsM64>(combine_kernel, split * (a.h_q / kHeadsPerProgram), a, stream);
}

template <int kFormat, bool kScorerSchedule>
cudaError_t launch_schedule(const DecodeArgs& a, cudaStream_t stream) {
  return mixed_schedule(a) ? launch<kFormat, kScorerSchedule, true>(a, stream) : launch<kFormat, kScorerSchedule, false>(a, stream);
}

// Whether the consumers take the scorer schedule (Role): calls whose longest programs have at least
// kScorerMinTiles tiles of the index row.
bool takes_scorer_schedule(const DecodeArgs& args) {
  const int64_t positions = args.whole_tokens > 0 ? args.topk : (static_cast<int64_t>(args.topk) + args.splits - 1) / args.splits;
  return positions >= static_cast<int64_t>(kScorerMinTiles) * kTileTokens;
}

}  // namespace

cudaError_t launch_decode(const DecodeArgs& args, cudaStream_t stream) {
  if (args.h_q == kSmallHeads[0] || args.h_q == kSmallHeads[1]) return launch_decode_m16(args, stream);
  const bool scorer = takes_scorer_schedule(args);
  if (args.format != kFormatV32) return scorer ? launch_schedule<kFormatV4, true>(args, stream) : launch_schedule<kFormatV4, false>(args, stream);
  return scorer ? launch_schedule<kFormatV32, true>(args, stream) : launch_schedule<kFormatV32, false>(args, stream);
}

}  // namespace dsa_decode
