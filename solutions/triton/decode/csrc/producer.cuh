// The producer warpgroup: a program's share of the index row, then every tile's records gathered
// into registers, dequantized and stored into the shared-memory stages.
#pragma once

#include "instructions.cuh"

namespace dsa_decode {
namespace {

// The page of a valid id (n >= 0) by the launcher's magic multiplier (DecodeArgs): a division by
// the run-time block size was about 16 instructions, four times a tile in the producer.
__device__ __forceinline__ int page_of(const DecodeArgs& a, int n) {
  return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * a.block_magic) >> a.block_shift);
}

struct Row {
  int bi, si, hb, split, n_pos, n_tiles;
  int splits;          // the token's programs per head block (DecodeArgs' schedule): 1 for a whole row
  int64_t part;        // with splits > 1: the program's partial (DecodeArgs)
  const int32_t* ids;  // the query token's index row
};

// The stride of a program's positions: row.splits, or in a uniform call (kMixed false: no whole token
// beside split ones) a.splits, the same value from the parameter space, which costs the producer
// no register (with row.splits V3.2 b = 128 took 448.9 against 441.4 µs).
template <bool kMixed>
__device__ __forceinline__ int position_stride(const DecodeArgs& a, const Row& row) {
  return kMixed ? row.splits : a.splits;
}

template <bool kMixed>
__device__ __forceinline__ int record_id(const DecodeArgs& a, const Row& row, int tile, int token) {
  const int k = tile * kTileTokens + token;
  return k < row.n_pos ? __ldg(row.ids + row.split + static_cast<int64_t>(k) * position_stride<kMixed>(a, row)) : -1;
}

// The program's query token, head block, split and its share of the index row (DecodeArgs' schedule).
__device__ __forceinline__ Row program_row(const DecodeArgs& a) {
  Row row;
  row.hb = blockIdx.x;
  int t = blockIdx.z;
  row.split = 0;
  row.splits = 1;
  row.part = 0;
  if (t >= a.whole_tokens) {
    const int q = t - a.whole_tokens, tail = q / a.splits;
    row.split = q - tail * a.splits;
    row.splits = a.splits;
    row.part = (static_cast<int64_t>(tail) * gridDim.x + row.hb) * a.splits + row.split;
    t = a.whole_tokens + tail;
  }
  row.bi = t / a.s_q;
  row.si = t - row.bi * a.s_q;
  row.ids = a.indices + row.bi * a.idx_stride_b + row.si * a.idx_stride_s;
  int length = a.topk;
  if (a.topk_length != nullptr) length = min(length, max(__ldg(a.topk_length + row.bi), 0));
  row.n_pos = length > row.split ? (length - row.split + row.splits - 1) / row.splits : 0;
  row.n_tiles = (row.n_pos + kTileTokens - 1) / kTileTokens;
  return row;
}

// The producer warpgroups (threads 0 .. kGroups * 128 - 1): they gather and dequantize every tile
// of the program into the stages, warpgroup g records g * kGroupTokens .. of each tile (ProducerPlan).
// StageTiles holds kv[kStages][records in kFormat's Layout], Barriers bias[kStages][kTileTokens] and the
// stages' full / empty mbarriers (Tiles and Small here; the 16/32-head kernel's own structs).
template <int kFormat, int kGroups, bool kMixed, class StageTiles, class Barriers>
__device__ __forceinline__ void produce(const DecodeArgs& a, const Row& row, StageTiles& tiles, Barriers& sm) {
  using L = Layout<kFormat>;
  using Plan = ProducerPlan<kFormat, kGroups>;
  constexpr int R = Plan::kRecordThreads;
  constexpr int kPasses = Plan::kPasses;
  constexpr int kRecordsPerPass = kWarpgroupThreads / R;
  // (One warpgroup: threadIdx.x itself, so the 64-head kernel's producer code is what it was.)
  const int group = kGroups == 1 ? 0 : threadIdx.x / kWarpgroupThreads;
  const unsigned pt = kGroups == 1 ? threadIdx.x : threadIdx.x % kWarpgroupThreads;  // unsigned: / R and % R are shifts
  const int part = pt % R;  // its vectors R v + part of each record
  // The records it fills: token[p] of every tile.
  int token[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) token[p] = group * Plan::kGroupTokens + pt / R + p * kRecordsPerPass;
  // The index row into L2 first, and the ids read a tile ahead of the L2 prefetch of their
  // records: otherwise each tile's chain is a DRAM round trip for the next ids (the cache is
  // cold after a flush), then another for the records they name, then the gathers.
  if (row.n_pos > 0) {  // (an empty row has no line to prefetch, not even the byte before it)
    const int64_t bytes = (static_cast<int64_t>(row.n_pos - 1) * position_stride<kMixed>(a, row) + 1) * 4;
    const char* first = reinterpret_cast<const char*>(row.ids + row.split);
    for (int64_t at = threadIdx.x * static_cast<int64_t>(kL2Line); at < bytes + kL2Line - 1; at += Plan::kThreads * kL2Line)
      prefetch_l2(first + min(at, bytes - 1));
  }
  int id[kPasses], next[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    id[p] = row.n_tiles > 0 ? record_id<kMixed>(a, row, 0, token[p]) : -1;
    next[p] = row.n_tiles > 1 ? record_id<kMixed>(a, row, 1, token[p]) : -1;
  }
  for (int i = 0; i < row.n_tiles; ++i) {
    const int stage = i % kStages;
    uint4 raw[kPasses][Plan::kFp8Vecs];
    uint4 rope[kPasses][Plan::kRopeVecs];
    uint32_t scale_words[kPasses][L::kScaleWords];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if (id[p] >= 0) {
        const int block = page_of(a, id[p]);
        const int slot = id[p] - block * a.block_size;
        const uint8_t* page = a.cache + static_cast<int64_t>(block) * a.page_stride;
        const uint8_t* data = page + static_cast<int64_t>(slot) * a.data_slot_bytes;
        const uint4* values = reinterpret_cast<const uint4*>(data) + part;
#pragma unroll
        for (int v = 0; v < Plan::kFp8Vecs; ++v) raw[p][v] = __ldg(values + R * v);
        const uint4* rope_src = reinterpret_cast<const uint4*>(data + a.rope_offset) + part;
#pragma unroll
        for (int v = 0; v < Plan::kRopeVecs; ++v) rope[p][v] = __ldg(rope_src + R * v);
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
        for (int v = 0; v < Plan::kFp8Vecs; ++v) raw[p][v] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int v = 0; v < Plan::kRopeVecs; ++v) rope[p][v] = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int w = 0; w < L::kScaleWords; ++w) scale_words[p][w] = 0;
      }
    }
    // The ids two tiles on (here or after the stores: Layout), and the next tile's records into
    // L2 while this one's loads are in flight (for V3.2 by the token's first head block only: Layout).
    int after[kPasses];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if constexpr (!Plan::kIdsAfterStores) after[p] = i + 2 < row.n_tiles ? record_id<kMixed>(a, row, i + 2, token[p]) : -1;
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
    for (int p = 0; p < kPasses; ++p) {
#pragma unroll
      for (int v = 0; v < Plan::kFp8Vecs; ++v) {
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
      for (int v = 0; v < Plan::kRopeVecs; ++v)
        *reinterpret_cast<uint4*>(tile + swizzled(token[p], L::kQuantDims + kChunkCols * (R * v + part))) = rope[p][v];
      if (part == 0) sm.bias[stage][token[p]] = id[p] >= 0 ? 0.0f : neg_inf();
    }
    fence_proxy_async();  // the stores above are read by wgmma (the async proxy)
    mbarrier_arrive(&sm.full[stage]);
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if constexpr (Plan::kIdsAfterStores) after[p] = i + 2 < row.n_tiles ? record_id<kMixed>(a, row, i + 2, token[p]) : -1;
      id[p] = next[p];
      next[p] = after[p];
    }
  }
}

}  // namespace
}  // namespace dsa_decode
