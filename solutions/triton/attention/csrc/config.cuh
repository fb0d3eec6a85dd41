// The sparse attention kernels' configuration: the tiling constants derived from attention_sm90.h,
// the relations they must keep (static_asserts with their reasons), and the shared-memory layout.
#pragma once

#include <cstdint>

#include "attention_sm90.h"

namespace dsa_attention {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kDQk = kDCkv + kDKpe;                      // 576: one gathered slot row
constexpr int kTileSlots = kGatherTileSlots;             // slots gathered and scored together
constexpr int kStages = kGatherStages;
constexpr int kMaxTiles = kTopK / kMinSplits / kTileSlots;  // tiles of the longest split
// 16 bytes of padding per shared row: rows 1168 B apart put the 8 rows of one ldmatrix in 8
// different 16-byte bank groups (unpadded, 1152 B = 9 x 128 B would make it an 8-way conflict).
constexpr int kRowPad = 8;
constexpr int kRowStride = kDQk + kRowPad;               // bf16 per shared slot row
constexpr int kChunk = 8;                                // bf16 per 16-byte cp.async
constexpr int kCkvChunks = kDCkv / kChunk;
constexpr int kRowChunks = kDQk / kChunk;
constexpr int kThreadsPerRow = kThreads / kTileSlots;    // threads sharing one slot row's gather
constexpr uint32_t kRowBytes = kDQk * 2;                 // bytes bulk-copied per valid slot
constexpr int kSlotsPerGroup = 8;                        // slots of one mma n-tile of logits
constexpr int kSlotGroups = kTileSlots / kSlotsPerGroup;  // logit n-tiles per tile
constexpr int kKSplits = kWarps / kSlotGroups;           // warps sharing one n-tile, each a k-range
constexpr int kPSteps = kTileSlots / 16;                 // P.V k-steps of a tile
// Shared logits rows (fp32) padded by 8 floats: the float2 reads of rows g = 0..3 of a
// half-warp then hit 32 distinct banks.
constexpr int kLogitStride = kTileSlots + 8;
constexpr int kColsPerWarp = kDCkv / kWarps;             // value columns per warp
constexpr int kColTiles = kColsPerWarp / 8;              // mma n-tiles of output per warp
constexpr int kQSteps = kDQk / 16;                       // mma k-steps of a logit row
constexpr int kQStepsPerWarp = kQSteps / kKSplits;       // k-steps of the logit k-range one warp scores
constexpr int kNopeSteps = kDCkv / 16;                   // k-steps < kNopeSteps are q_nope . ckv, the rest q_pe . kpe
// Partials are stored in the accumulators' own order (see store_partial): one 8-byte unit per
// (warp, output n-tile, lane) holds a bf16 pair of head g and one of head g + 8.
constexpr int kUnits = kWarps * kColTiles * kWarpSize;   // units per token
constexpr int kCombineSplitsPerThread = 8;               // partials one combining thread reads
constexpr int kUnitsLog2 = 11;

static_assert(kHeads == 16, "the heads are the M = 16 rows of every mma");
static_assert(kTileSlots % kSlotsPerGroup == 0 && kWarps % kSlotGroups == 0, "every warp scores one n-tile over one k-range");
static_assert(kQSteps % (2 * kKSplits) == 0 && kNopeSteps % 2 == 0, "k-ranges of whole step pairs, none straddling q_nope / q_pe");
static_assert(kTileSlots % 16 == 0 && kPSteps >= 1, "P.V k-steps of 16 slots");
static_assert(kDCkv % 32 == 0 && kDKpe % 32 == 0, "logit k-loops take two 16-wide k-steps at a time");
static_assert(kThreads % kTileSlots == 0 && kCkvChunks % kThreadsPerRow == 0, "whole rows per thread group");
static_assert((kDCkv * 2) % 16 == 0 && (kDKpe * 2) % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(kColTiles % 2 == 0, "ldmatrix.x4.trans loads two value n-tiles");
static_assert((kRowStride * 2) % 16 == 0 && kLogitStride % 2 == 0, "16-byte aligned slot rows, 8-byte aligned logit pairs");
static_assert(kTopK % kMaxSplits == 0 && (kTopK / kMaxSplits) % kSlotsPerGroup == 0, "splits hold whole n-tiles");
static_assert(kUnits * 4 == kHeads * kDCkv, "a unit holds 4 outputs");
static_assert(kUnits == 1 << kUnitsLog2, "units per token are a power of two");
static_assert(kUnits / kMaxSplits * (kMaxSplits / kCombineSplitsPerThread) == kThreads &&
              kUnits / kMinSplits * (kMinSplits / kCombineSplitsPerThread) == kThreads,
              "every split count gives each combining thread one unit and kCombineSplitsPerThread splits");
constexpr int kLsePairs = kHeads / 2;                    // a split's lse as (head g, head g + 8) pairs

// A split's partial of one program's share (cluster inbox): its kUnits / S units, then
// its lse as kLsePairs (head g, head g + 8) pairs, one 8-byte unit each: one contiguous slice.
constexpr int kInboxUnits = kUnits + kMaxClusterSplits * kLsePairs;

struct Shared {
  uint16_t q[kHeads][kRowStride];
  uint16_t kv[kStages][kTileSlots][kRowStride];
  // A tile's logits (unscaled, -inf at padding), one plane per k-range; two buffers, by tile parity.
  float logits[2][kKSplits][kHeads][kLogitStride];
  int32_t slot_ids[kStages][kTileSlots];
  int32_t warp_active[kWarps];  // per warp: its threads' last tile holding a valid slot, + 1
  uint64_t full[kStages];  // mbarrier per gather stage
  alignas(16) uint32_t ticket[4];  // split_kernel, fused: the token's ticket word at entry (a 16-byte cp.async)
  // Cluster combine only: every program of the cluster copies in its partial of this
  // program's share (see ClusterInbox), and the copies complete their bytes on inbox_full.
  // Apart from the gather buffers: a fast program pushes while a slow one still gathers.
  uint2 inbox[kInboxUnits];
  uint64_t inbox_full;
};

}  // namespace
}  // namespace dsa_attention
