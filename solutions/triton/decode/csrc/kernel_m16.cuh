// The 16/32-head kernel: kGroups producer warpgroups (producer.cuh) and eight consumer warps in four
// pairs (consumer_m16.cuh) per program (M16Roles); grid and launch: launch_m16.cu.
#pragma once

#include "combine.cuh"
#include "consumer_m16.cuh"
#include "consumer_st.cuh"
#include "producer.cuh"

namespace dsa_decode {
namespace {

// Shared memory per head count: 16 heads the mma.sync pairs' (consumer_m16.cuh), 32 the transposed
// wgmma consumers' (consumer_st.cuh).
template <int kFormat, int kMTiles>
struct M16Shared {
  using Tiles = TilesM16<kFormat, kMTiles>;
  using Small = SmallM16;
  static constexpr int kBytes = shared_bytes_m16<kFormat, kMTiles>();
};
template <int kFormat>
struct M16Shared<kFormat, 2> {
  using Tiles = TilesST<kFormat>;
  using Small = SmallST;
  static constexpr int kBytes = shared_bytes_st<kFormat>();
};

template <int kFormat, int kMTiles, int kGroups, bool kMixed>
__global__ void __launch_bounds__(M16Roles<kFormat, kGroups>::kThreads, 1) decode_kernel_m16(const __grid_constant__ DecodeArgs a) {
  using Roles = M16Roles<kFormat, kGroups>;
  using Shared = M16Shared<kFormat, kMTiles>;
  extern __shared__ uint8_t shared_raw[];
  uint8_t* base = shared_raw + ((1024 - (smem_addr(shared_raw) & 1023)) & 1023);
  typename Shared::Tiles& tiles = *reinterpret_cast<typename Shared::Tiles*>(base);
  typename Shared::Small& sm = *reinterpret_cast<typename Shared::Small*>(base + sizeof(typename Shared::Tiles));
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&sm.full[s], Roles::kProducers);
      mbarrier_init(&sm.empty[s], kM16Warps);
    }
    fence_mbarrier_init();
  }
  // The program's row once, before the roles rebalance their registers (as the 64-head kernel).
  const Row row = program_row(a);
  __syncthreads();
  // The consumers' branch first in the source, as in the 64-head kernel (the producer first in the SASS).
  if (threadIdx.x >= Roles::kProducers) {
    set_registers<Roles::kConsumerRegisters, Roles::kLaunchRegisters>();
    const int ct = threadIdx.x - Roles::kProducers;
    if constexpr (kMTiles == 2) {
      consume_st<kFormat>(a, row, tiles, sm, ct);
    } else {
      consume_m16<kFormat, kMTiles>(a, row, tiles, sm, ct);
    }
    // The in-launch combine: the consumers stored the partial (part = unit * splits + split).
    if (a.tickets != nullptr && row.splits > 1) {
      arrive_and_combine<PartialsM16<kMTiles>>(a, static_cast<int>(row.part / row.splits), row.split, ct, kM16ConsumerThreads, kMathBarrier);
    }
  } else {
    set_registers<Roles::kProducerRegisters, Roles::kLaunchRegisters>();
    produce<kFormat, kGroups, kMixed>(a, row, tiles, sm);
  }
}

}  // namespace
}  // namespace dsa_decode
