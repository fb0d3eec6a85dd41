// The combine: a split's partial written to a sink, a program's share of the token's S partials
// merged, the global-memory ticket barrier's loads, and the cluster combine's distributed
// shared-memory copies.
#pragma once

#include "consumer.cuh"

namespace dsa_attention {
namespace {

// ---------------------------------------------------------------- partials and the combine
// A split's partial: unit (warp, n-tile j, lane) = {bf16 pair of head g, bf16 pair of head g + 8}
// at value columns 64 * warp + 8 * j + 2 * tig, divided by l (0 without a valid slot), and per
// head pair g its lse = m + log2 l (-inf without a valid slot). Sinks take them to where the
// combine reads them; every tig == 0 lane of every warp holds its pair's lse (the running (m, l)
// are block-wide), so `warp` lets a sink spread lse copies over the warps.

// Global memory, read back by the combine through L2 (the ticket barrier and the second launch).
struct GlobalSink {
  uint2* units;      // this split's kUnits units
  float2* lse_pairs;  // this split's kLsePairs lse pairs
  __device__ GlobalSink(const AttentionArgs& a, int t, int s)
      : units(reinterpret_cast<uint2*>(a.part_out) + (static_cast<int64_t>(t) * a.splits + s) * kUnits),
        lse_pairs(reinterpret_cast<float2*>(a.part_lse) + (static_cast<int64_t>(t) * a.splits + s) * kLsePairs) {}
  __device__ void put_unit(int unit, uint2 bits) const { units[unit] = bits; }
  __device__ void put_lse_pair(int g, float2 pair, int warp) const {
    if (warp == 0) lse_pairs[g] = pair;
  }
};

// Slices of one owner's share, split by split: kUnits / S units, then kLsePairs lse pairs.
struct Slices {
  uint2* base;      // slice 0
  int shift;        // log2 of per_program
  int per_program;  // units each program combines
  __device__ Slices(uint2* b, int S) : base(b), shift(share_shift(S)), per_program(1 << share_shift(S)) {}
  __device__ int slice_units() const { return per_program + kLsePairs; }
  __device__ uint2* slice(int i) const { return base + i * slice_units(); }
  __device__ uint2* lse_pair(int i, int g) const { return slice(i) + per_program + g; }
};

template <class Sink>
__device__ __forceinline__ void store_partial(const Sink& sink, const RowState& st, const float (&o)[kColTiles][4]) {
  const Fragment f;
  float inv_l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv_l[r] = st.l[r] > 0.f ? fast_rcp(st.l[r]) : 0.f;
#pragma unroll
  for (int j = 0; j < kColTiles; ++j) {
    sink.put_unit(f.unit(j), make_uint2(pack_bf16x2(o[j][0] * inv_l[0], o[j][1] * inv_l[0]), pack_bf16x2(o[j][2] * inv_l[1], o[j][3] * inv_l[1])));
  }
  if (f.tig == 0) {
    const float lse_lo = st.l[0] > 0.f ? st.m[0] + fast_log2(st.l[0]) : neg_inf();
    const float lse_hi = st.l[1] > 0.f ? st.m[1] + fast_log2(st.l[1]) : neg_inf();
    sink.put_lse_pair(f.g, make_float2(lse_lo, lse_hi), f.warp);
  }
}

// What one combining thread reads: one unit and one lse pair of each of its splits.
struct SplitPartials {
  uint2 bits[kCombineSplitsPerThread];
  float2 lse[kCombineSplitsPerThread];  // (head g, head g + 8)
};

// A combining thread's place in program s's share of a token (S splits): units
// [s * kUnits / S, (s + 1) * kUnits / S), each merged from the S partials by S / 8 threads in
// adjacent lanes (`block`: which 8 splits), so the blocks merge by warp shuffles.
template <int S>
struct Share {
  static_assert(S >= kMinSplits && S <= kMaxSplits && (S & (S - 1)) == 0, "power-of-two split counts");
  static constexpr int kPerProgram = kUnits / S;
  static constexpr int kBlocks = S / kCombineSplitsPerThread;
  static_assert(kPerProgram * kBlocks == kThreads, "one unit and kCombineSplitsPerThread splits per thread");
  static_assert(kBlocks <= kWarpSize && kPerProgram >= kLsePairs, "a unit's blocks share a warp; a slice's lse pairs have readers");
  int local;  // unit within the share
  int block;  // splits 8 * block .. 8 * block + 7
  int unit;   // unit within the token
  int g;      // heads g and g + 8
  int d;      // the unit's first value column
  __device__ explicit Share(int s)
      : local(static_cast<int>(threadIdx.x) / kBlocks), block(static_cast<int>(threadIdx.x) % kBlocks), unit(s * kPerProgram + local) {
    const int lane = unit % kWarpSize;
    g = lane / 4;
    d = unit / (kWarpSize * kColTiles) * kColsPerWarp + unit / kWarpSize % kColTiles * 8 + 2 * (lane % 4);
  }
  __device__ int first_split() const { return block * kCombineSplitsPerThread; }
};

// The weighted mean of the S partials (weights 2^(lse_split - lse_max) per head) of this
// thread's unit: the blocks of a unit merge by shuffles, block 0 stores the output (and, for
// the unit at column 0, the lse).
template <int S>
__device__ __forceinline__ void merge_and_store(const AttentionArgs& a, int t, const Share<S>& share, const SplitPartials& p) {
  float top_lo = neg_inf(), top_hi = neg_inf();
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    top_lo = fmaxf(top_lo, p.lse[k].x);
    top_hi = fmaxf(top_hi, p.lse[k].y);
  }
#pragma unroll
  for (int m = 1; m < Share<S>::kBlocks; m *= 2) {
    top_lo = fmaxf(top_lo, __shfl_xor_sync(kFullMask, top_lo, m));
    top_hi = fmaxf(top_hi, __shfl_xor_sync(kFullMask, top_hi, m));
  }
  // A head without any valid slot has max -inf: 0 as the reference keeps every weight 0, not NaN.
  const float ref_lo = top_lo == neg_inf() ? 0.f : top_lo;
  const float ref_hi = top_hi == neg_inf() ? 0.f : top_hi;
  float sums[6] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f};  // outputs lo.x, lo.y, hi.x, hi.y; totals lo, hi
#pragma unroll
  for (int k = 0; k < kCombineSplitsPerThread; ++k) {
    const float w_lo = fast_exp2(p.lse[k].x - ref_lo);
    const float w_hi = fast_exp2(p.lse[k].y - ref_hi);
    const float2 lo = unpack_bf16x2(p.bits[k].x);
    const float2 hi = unpack_bf16x2(p.bits[k].y);
    sums[0] += w_lo * lo.x;
    sums[1] += w_lo * lo.y;
    sums[2] += w_hi * hi.x;
    sums[3] += w_hi * hi.y;
    sums[4] += w_lo;
    sums[5] += w_hi;
  }
#pragma unroll
  for (int m = 1; m < Share<S>::kBlocks; m *= 2) {
#pragma unroll
    for (int i = 0; i < 6; ++i) sums[i] += __shfl_xor_sync(kFullMask, sums[i], m);
  }
  if (share.block != 0) return;
  const float scale_lo = sums[4] > 0.f ? fast_rcp(sums[4]) : 0.f;
  const float scale_hi = sums[5] > 0.f ? fast_rcp(sums[5]) : 0.f;
  uint16_t* out_lo = a.out + t * a.out_t + share.g * a.out_h + share.d;
  *reinterpret_cast<uint32_t*>(out_lo) = pack_bf16x2(sums[0] * scale_lo, sums[1] * scale_lo);
  *reinterpret_cast<uint32_t*>(out_lo + 8 * a.out_h) = pack_bf16x2(sums[2] * scale_hi, sums[3] * scale_hi);
  if (share.d == 0) {
    a.lse[t * a.lse_t + share.g] = sums[4] > 0.f ? ref_lo + fast_log2(sums[4]) : neg_inf();
    a.lse[t * a.lse_t + share.g + 8] = sums[5] > 0.f ? ref_hi + fast_log2(sums[5]) : neg_inf();
  }
}

// The token's partials in global memory, written by other SMs of this launch or of the previous
// one, so read through L2 (ld.cg), never a stale L1 line.
struct GlobalSource {
  const uint2* units;      // the token's S x kUnits units
  const float2* lse_pairs;  // the token's S x kLsePairs lse pairs
  __device__ GlobalSource(const AttentionArgs& a, int t)
      : units(reinterpret_cast<const uint2*>(a.part_out) + static_cast<int64_t>(t) * a.splits * kUnits),
        lse_pairs(reinterpret_cast<const float2*>(a.part_lse) + static_cast<int64_t>(t) * a.splits * kLsePairs) {}
  template <int S>
  __device__ void load(const Share<S>& share, SplitPartials& p) const {
    const uint2* u = units + share.first_split() * kUnits + share.unit;
    const float2* l = lse_pairs + share.first_split() * kLsePairs + share.g;
#pragma unroll
    for (int k = 0; k < kCombineSplitsPerThread; ++k) {
      p.bits[k] = __ldcg(u + k * kUnits);
      p.lse[k] = __ldcg(l + k * kLsePairs);
    }
  }
};

// Program s's share of token t, from `source` (S a template argument: the share arithmetic is
// shifts and immediates).
template <int S, class Source>
__device__ __forceinline__ void combine_share(const AttentionArgs& a, int t, int s, const Source& source) {
  const Share<S> share(s);
  SplitPartials p;
  source.load(share, p);
  stamp(a, t, s, kPhaseReleasedCycles);
  merge_and_store(a, t, share, p);
  stamp(a, t, s, kPhaseCombinedCycles);
}

template <class Source>
__device__ __forceinline__ void combine_share(const AttentionArgs& a, int t, int s, const Source& source) {
  switch (a.splits) {
    case 8: combine_share<8>(a, t, s, source); break;
    case 16: combine_share<16>(a, t, s, source); break;
    case 32: combine_share<32>(a, t, s, source); break;
    default: combine_share<64>(a, t, s, source); break;
  }
  static_assert(kMinSplits == 8 && kMaxSplits == 64, "the split counts dispatched above");
}

// ---------------------------------------------------------------- cluster combine
// The token's S programs are one thread-block cluster (S <= kMaxClusterSplits). A program that
// has attended its slots writes its partial into its own shared memory as the owners' slices
// (Slices layout) and bulk-copies each into its owner's inbox (distributed shared memory, one
// TMA copy per owner). Each owner's inbox mbarrier expects all S slices' bytes, so waiting on it
// replaces the global-memory barrier; the combine then reads only local shared memory. Copies
// from fast programs land while slow ones still gather.

__device__ __forceinline__ uint32_t cluster_addr(const void* p, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
  return remote;
}
// Bulk copy of `bytes` from this program's shared memory into program `rank`'s (dst and bar are
// this program's addresses of the same objects, mapped to `rank`).
__device__ __forceinline__ void bulk_copy_to_peer(const void* dst, const void* src, uint32_t bytes, const uint64_t* bar, int rank) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(cluster_addr(dst, rank)),
               "r"(smem_addr(src)), "r"(bytes), "r"(cluster_addr(bar, rank))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Writes the partial into the outgoing slices (slice i: owner i's units and this split's lse).
struct StagingSink {
  Slices out;
  int splits;
  __device__ StagingSink(uint2* staging, int S) : out(staging, S), splits(S) {}
  __device__ void put_unit(int unit, uint2 bits) const { out.slice(unit >> out.shift)[unit & (out.per_program - 1)] = bits; }
  __device__ void put_lse_pair(int g, float2 pair, int warp) const {
    for (int owner = warp; owner < splits; owner += kWarps) *reinterpret_cast<float2*>(out.lse_pair(owner, g)) = pair;
  }
};

// Reads this program's share from its inbox (slice i: split i's partial), once it is complete.
struct ClusterInbox {
  Slices in;
  uint64_t* full;  // the inbox mbarrier
  template <int S>
  __device__ void load(const Share<S>& share, SplitPartials& p) const {
    mbarrier_wait(full, 0);
#pragma unroll
    for (int k = 0; k < kCombineSplitsPerThread; ++k) {
      p.bits[k] = in.slice(share.first_split() + k)[share.local];
      p.lse[k] = *reinterpret_cast<const float2*>(in.lse_pair(share.first_split() + k, share.g));
    }
  }
};

static_assert((kUnits / kMaxClusterSplits + kLsePairs) * 8 % 16 == 0 && (kUnits / kMinSplits + kLsePairs) * 8 % 16 == 0,
              "slices are whole 16-byte bulk-copy units");
static_assert(kInboxUnits * sizeof(uint2) <= sizeof(Shared::kv), "the outgoing slices fit the gather buffers");

// Hardware cluster barrier, split in its two halves (every thread of every program takes part).
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }

}  // namespace
}  // namespace dsa_attention
