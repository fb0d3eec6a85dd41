// The 16/32-head kernel: the producer warpgroup (producer.cuh) and four consumer warps
// (consumer_m16.cuh) per program; grid and launch: launch_m16.cu.
#pragma once

#include "consumer_m16.cuh"
#include "producer.cuh"

namespace dsa_decode {
namespace {

template <int kFormat, int kMTiles>
__global__ void __launch_bounds__(kM16Threads, 1) decode_kernel_m16(const __grid_constant__ DecodeArgs a) {
  extern __shared__ uint8_t shared_raw[];
  uint8_t* base = shared_raw + ((1024 - (smem_addr(shared_raw) & 1023)) & 1023);
  TilesM16<kFormat, kMTiles>& tiles = *reinterpret_cast<TilesM16<kFormat, kMTiles>*>(base);
  SmallM16& sm = *reinterpret_cast<SmallM16*>(base + sizeof(TilesM16<kFormat, kMTiles>));
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&sm.full[s], kProducerThreads);
      mbarrier_init(&sm.empty[s], kM16Warps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  // 256 threads of up to 255 registers fit the register file: no rebalancing. The row is computed
  // in each role (computed once before the branch, V3.2's producer spilled a value of it).
  if (threadIdx.x >= kProducerThreads) {
    consume_m16<kFormat, kMTiles>(a, program_row(a), tiles, sm);
  } else {
    produce<kFormat>(a, program_row(a), tiles, sm);
  }
}

}  // namespace
}  // namespace dsa_decode
