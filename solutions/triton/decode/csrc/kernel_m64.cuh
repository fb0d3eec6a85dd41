// The 64-head kernel: one producer and two consumer warpgroups per program (grid and roles:
// launch_sm90.cu's header).
#pragma once

#include "consumer_m64.cuh"
#include "producer.cuh"

namespace dsa_decode {
namespace {

template <int kFormat, bool kScorerSchedule, bool kMixed>
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
  // The program's row once, before the warpgroups rebalance their registers (computing it in
  // each warpgroup after setmaxnreg was slower for V3.2 and no faster for V4).
  const Row row = program_row(a);
  __syncthreads();
  // The consumers' branch written first puts the producer first in the SASS, so its code no longer
  // moves with the consumers' epilogue (that placement alone made V3.2 b = 128 faster).
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
    produce<kFormat, 1, kMixed>(a, row, tiles, sm);
  }
}

}  // namespace
}  // namespace dsa_decode
