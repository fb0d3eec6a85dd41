// The combine: merges a unit's split partials (config.cuh, the partials' format) into out and lse, in
// the combine kernel (a second launch) or in the decode's own split programs behind a ticket barrier.
#pragma once

#include "config.cuh"

namespace dsa_decode {
namespace {

// Grid (split units, combine_programs<P>()), P::kOwners threads (P: the partials' format, config.cuh): program
// (u, c) merges the splits' partials of split unit u (kHeads heads of query token whole_tokens + u / head
// blocks: DecodeArgs' schedule) for fragments
// j = c * kCombineFragRows .. (P::fragment): thread mt takes fragment j * kOwners + mt of every split.
// With M = max_s lse2_s (0 when every split is empty) and w_s = 2^(lse2_s - M),
// out = sum_s w_s out_s / sum_s w_s, lse = (M + log2 sum_s w_s) ln 2, then the sink factor.
constexpr int kCombineFragRows = 2;  // 16 programs a unit of 64 heads: 128 at b = 2
template <class P>
constexpr int combine_programs() {
  return P::kFragments / P::kOwners / kCombineFragRows;
}
// Splits whose partials one thread of the combine kernel loads before it adds them up.
constexpr int kCombineSplitsInFlight = 4;

// Owner mt's fragments j0 .. j0 + kRows - 1 of split unit `unit`: the merge above over all a.splits
// partials, kInFlight splits' loads issued together. (Loads interleaved with the multiply-adds split
// by split waited on L2 once per split. The combine kernel's launch bounds of one block per SM let
// ptxas keep a whole batch in registers; the in-launch combine runs in the consumers' registers.)
template <class P, int kRows, int kInFlight>
__device__ __forceinline__ void combine_fragments(const DecodeArgs& a, int unit, int mt, int j0) {
  const int head_blocks = a.h_q / P::kHeads;
  const int tail = unit / head_blocks, hb = unit - tail * head_blocks, t = a.whole_tokens + tail;
  const int bi = t / a.s_q, si = t - bi * a.s_q;
  const Fragment at = P::fragment(mt, 0);
  const int r1 = at.r0 + 8;
  const int64_t first = static_cast<int64_t>(unit) * a.splits;
  float top0 = neg_inf(), top1 = neg_inf();
  for (int s = 0; s < a.splits; ++s) {
    top0 = fmaxf(top0, __ldcg(a.part_lse + (first + s) * P::kHeads + at.r0));
    top1 = fmaxf(top1, __ldcg(a.part_lse + (first + s) * P::kHeads + r1));
  }
  const float ref0 = top0 == neg_inf() ? 0.0f : top0, ref1 = top1 == neg_inf() ? 0.0f : top1;
  float4 acc[kRows];
#pragma unroll
  for (int f = 0; f < kRows; ++f) acc[f] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float total0 = 0.0f, total1 = 0.0f;
  const uint2* frags = reinterpret_cast<const uint2*>(a.part_out) + j0 * P::kOwners + mt;
  for (int s0 = 0; s0 < a.splits; s0 += kInFlight) {
    uint2 v[kInFlight][kRows];
    float w0[kInFlight], w1[kInFlight], d[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      // Past the count, the last split is loaded again (no branch around the loads) at weight 0.
      const bool present = s0 + k < a.splits;
      const int64_t part = first + min(s0 + k, a.splits - 1);
      const float lse0 = __ldcg(a.part_lse + part * P::kHeads + at.r0), lse1 = __ldcg(a.part_lse + part * P::kHeads + r1);
      w0[k] = present ? lse0 : neg_inf();
      w1[k] = present ? lse1 : neg_inf();
      d[k] = __ldcg(a.part_scale + part * P::kOwners + mt);  // the owner mt's fp16 scale
#pragma unroll
      for (int f = 0; f < kRows; ++f) v[k][f] = __ldcg(frags + part * P::kFragments + f * P::kOwners);
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const float weight0 = fast_exp2(w0[k] - ref0), weight1 = fast_exp2(w1[k] - ref1);  // 0 for an absent or empty split
      total0 += weight0;
      total1 += weight1;
      const float unit0 = weight0 * d[k], unit1 = weight1 * d[k];  // the split's weight times its fp16 scale
#pragma unroll
      for (int f = 0; f < kRows; ++f) {
        const float2 top = half2_floats(v[k][f].x), bottom = half2_floats(v[k][f].y);
        acc[f].x = fmaf(unit0, top.x, acc[f].x);
        acc[f].y = fmaf(unit0, top.y, acc[f].y);
        acc[f].z = fmaf(unit1, bottom.x, acc[f].z);
        acc[f].w = fmaf(unit1, bottom.y, acc[f].w);
      }
    }
  }
  const int head0 = hb * P::kHeads + at.r0, head1 = head0 + 8;
  const bool empty0 = total0 == 0.0f, empty1 = total1 == 0.0f;
  const float lse0 = (ref0 + fast_log2(empty0 ? 1.0f : total0)) * kLn2, lse1 = (ref1 + fast_log2(empty1 ? 1.0f : total1)) * kLn2;
  const float factor0 = a.sink != nullptr ? 1.0f / (1.0f + expf(__ldg(a.sink + head0) - lse0)) : 1.0f;
  const float factor1 = a.sink != nullptr ? 1.0f / (1.0f + expf(__ldg(a.sink + head1) - lse1)) : 1.0f;
  const float scale0 = empty0 ? 0.0f : factor0 / total0, scale1 = empty1 ? 0.0f : factor1 / total1;
  uint16_t* out0 = a.out + bi * a.out_stride_b + si * a.out_stride_s + head0 * a.out_stride_h;
  uint16_t* out1 = out0 + 8 * a.out_stride_h;
#pragma unroll
  for (int f = 0; f < kRows; ++f) {
    const int col = P::fragment(mt, j0 + f).col;
    *reinterpret_cast<__nv_bfloat162*>(out0 + col) = __floats2bfloat162_rn(acc[f].x * scale0, acc[f].y * scale0);
    *reinterpret_cast<__nv_bfloat162*>(out1 + col) = __floats2bfloat162_rn(acc[f].z * scale1, acc[f].w * scale1);
  }
  if (j0 == 0 && P::writes_lse(mt)) {  // each head once
    float* lse = a.lse + bi * a.lse_stride_b + si * a.lse_stride_s;
    lse[head0 * a.lse_stride_h] = empty0 ? pos_inf() : lse0;
    lse[head1 * a.lse_stride_h] = empty1 ? pos_inf() : lse1;
  }
}

// The combine kernel's program (u, c): owner threadIdx.x's fragment rows c * kCombineFragRows ..
// of unit u, once the decode grid is done.
template <class P>
__device__ __forceinline__ void combine_unit(const DecodeArgs& a) {
  static_assert(P::kFragments % (P::kOwners * kCombineFragRows) == 0, "whole fragment rows per program");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the decode grid's partials are complete and visible
  combine_fragments<P, kCombineFragRows, kCombineSplitsInFlight>(a, blockIdx.x, threadIdx.x, blockIdx.y * kCombineFragRows);
}

// ---------------------------------------------------------------- in-launch combine (DecodeArgs::tickets)
// Splits whose partials one consumer thread loads together in the in-launch combine: a program's
// share is one fragment per thread or two, so one batch covers 8 splits and two cover 16.
constexpr int kFusedSplitsInFlight = 8;

// Split program `split` of split unit `unit`, after its partial: the ticket barrier, then its share
// of the unit's merge. Called by the program's `threads` consumer threads (thread ct), the ones
// that stored the partial; `barrier` is a named barrier free among them. Every program of the
// grid is resident (the host launches this only for a grid of at most one program per SM), so
// waiting for the unit's other splits cannot deadlock. The unit's ticket word only grows (modulo
// 2^32): each call adds kTicketsPerCall to it in all, kTicketsPerCall / S per program, so a call
// starts on a multiple of kTicketsPerCall whatever earlier calls' split counts were, and the value
// before this program's arrival rounded down is the call's start. The block barrier orders every
// consumer's partial stores before thread 0's release; its acquire of the episode's end, then the
// barrier again, order the merge's loads (through L2) after every split's stores.
// Program s merges items [s * chunk, (s + 1) * chunk) of the unit's P::kFragments (item i: owner
// i % kOwners's fragment i / kOwners, the partials' own order): consecutive threads take adjacent
// 8-byte words, and every program an equal share.
template <class P>
__device__ __forceinline__ void arrive_and_combine(const DecodeArgs& a, int unit, int split, int ct, int threads, int barrier) {
  named_barrier(barrier, threads);  // every consumer's partial stores are done
  if (ct == 0) {
    unsigned* word = a.tickets + static_cast<int64_t>(unit) * kTicketStride;
    const unsigned old = add_release_returning(word, kTicketsPerCall / static_cast<unsigned>(a.splits));
    const unsigned end = (old / kTicketsPerCall + 1u) * kTicketsPerCall;
    while (static_cast<int>(load_acquire(word) - end) < 0) {
    }
  }
  named_barrier(barrier, threads);
  constexpr int kItems = P::kFragments;
  const int chunk = (kItems + a.splits - 1) / a.splits;
  const int begin = split * chunk, end = min(begin + chunk, kItems);
  for (int i = begin + ct; i < end; i += threads) {
    combine_fragments<P, 1, kFusedSplitsInFlight>(a, unit, i % P::kOwners, i / P::kOwners);
  }
}

// The in-launch combine's residency precondition (DecodeArgs::tickets; none without tickets): the grid
// has at most one program per SM, so every program is resident at once (a kernel that launches at all
// fits one a SM) and the ticket barrier cannot deadlock. (The C ABI has checked that the split count
// divides kTicketsPerCall.)
inline cudaError_t check_in_launch_combine(const DecodeArgs& a, dim3 grid) {
  if (a.tickets == nullptr) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  return static_cast<int64_t>(grid.x) * grid.y * grid.z <= sms ? cudaSuccess : cudaErrorInvalidConfiguration;
}

// The combine of a kernel whose partials have the format P (the 16/32-head kernel's: PartialsM16).
template <class P>
__global__ void __launch_bounds__(P::kOwners, 1) combine_kernel_for(const __grid_constant__ DecodeArgs a) {
  combine_unit<P>(a);
}

// Launches `combine` (grid (units, combine_programs<P>()), P::kOwners threads) as a programmatic
// dependent of the decode kernel launched just before it on `stream`: its launch overlaps the
// decode's tail, and griddepcontrol.wait (combine_unit) holds it until the partials are written.
template <class P>
cudaError_t launch_combine(void (*combine)(DecodeArgs), int units, const DecodeArgs& a, cudaStream_t stream) {
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(units), combine_programs<P>());
  config.blockDim = dim3(P::kOwners);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, combine, a);
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace
}  // namespace dsa_decode
