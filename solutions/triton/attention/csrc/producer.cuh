// The producer side of a program: one tile's gather of slot rows into a shared-memory stage.
#pragma once

#include "instructions.cuh"

namespace dsa_attention {
namespace {

// Issues one tile's gather into stage `stage`. The kThreadsPerRow threads of row tid / 4 share
// it: for a valid slot the first one bulk-copies the ckv row (1024 B) and the kpe row (128 B)
// (bulk copies keep far more bytes in flight per SM than 16-byte cp.async, which capped the
// random gather well below the copy bandwidth); for padding they zero the row's value part instead (P is 0
// there, but 0 * NaN from stale bits would not be; the key part only feeds masked logits).
// Every thread then arrives on the stage's mbarrier, so its phase completes when all rows,
// zeroed or copied, are in place.
__device__ __forceinline__ void issue_tile(Shared& sh, const AttentionArgs& a, int id, int stage) {
  const int row = threadIdx.x / kThreadsPerRow;
  const int part = threadIdx.x % kThreadsPerRow;
  uint16_t* dst = sh.kv[stage][row];
  uint64_t* bar = &sh.full[stage];
  if (part == 0) sh.slot_ids[stage][row] = id;
  if (id >= 0) {
    if (part == 0) {
      const uint16_t* ckv_row = a.ckv + static_cast<int64_t>(id / kPageSize) * a.ckv_page + static_cast<int64_t>(id % kPageSize) * a.ckv_slot;
      const uint16_t* kpe_row = a.kpe + static_cast<int64_t>(id / kPageSize) * a.kpe_page + static_cast<int64_t>(id % kPageSize) * a.kpe_slot;
      fence_proxy_async();
      mbarrier_arrive_expect_tx(bar, kRowBytes);
      bulk_copy(dst, ckv_row, kDCkv * 2, bar);
      bulk_copy(dst + kDCkv, kpe_row, kDKpe * 2, bar);
      return;
    }
  } else {
    uint4* value = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int c = part; c < kCkvChunks; c += kThreadsPerRow) value[c] = make_uint4(0, 0, 0, 0);
  }
  mbarrier_arrive(bar);
}

}  // namespace
}  // namespace dsa_attention
