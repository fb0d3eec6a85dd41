// The 64-head kernel: kGroups producer warpgroups and two consumer warpgroups per program (M64Roles;
// grid and roles: launch_sm90.cu's header).
#pragma once

#include "combine.cuh"
#include "consumer_m64.cuh"
#include "producer.cuh"

namespace dsa_decode {
namespace {

template <int kFormat, bool kScorerSchedule, int kGroups, bool kMixed>
__global__ void __launch_bounds__(M64Roles<kFormat, kGroups>::kThreads, 1) decode_kernel(const __grid_constant__ DecodeArgs a) {
  using Roles = M64Roles<kFormat, kGroups>;
  constexpr bool kSplitPv = Roles::kLaunchRegisters < kM64N256MinRegisters;
  extern __shared__ uint8_t shared_raw[];
  // Offset from shared_raw itself (not through an integer): the compiler then knows every tile
  // pointer is shared memory and emits STS/LDS instead of generic stores and loads.
  uint8_t* base = shared_raw + ((1024 - (smem_addr(shared_raw) & 1023)) & 1023);
  Tiles<kFormat>& tiles = *reinterpret_cast<Tiles<kFormat>*>(base);
  Small& sm = *reinterpret_cast<Small*>(base + sizeof(Tiles<kFormat>));

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&sm.full[s], Roles::kProducers);
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
  if (threadIdx.x >= Roles::kProducers) {
    const int mt = threadIdx.x - Roles::kProducers;  // consumer thread 0 .. kMathThreads - 1
    if constexpr (!kScorerSchedule) {
      set_registers<Roles::kConsumerRegisters, Roles::kLaunchRegisters>();
      consume<kFormat, Role::kHalf, kSplitPv>(a, row, tiles, sm, mt);
    } else if (mt < kWarpgroupThreads) {
      set_registers<Roles::kScorerRegisters, Roles::kLaunchRegisters>();
      consume<kFormat, Role::kScorer, kSplitPv>(a, row, tiles, sm, mt);
    } else {
      set_registers<Roles::kSecondRegisters, Roles::kLaunchRegisters>();
      consume<kFormat, Role::kSecond, kSplitPv>(a, row, tiles, sm, mt);
    }
    // The in-launch combine: the consumers stored the partial (part = unit * splits + split).
    if (a.tickets != nullptr && row.splits > 1) {
      arrive_and_combine<PartialsM64>(a, static_cast<int>(row.part / row.splits), row.split, mt, kMathThreads, kMathBarrier);
    }
  } else {
    set_registers<Roles::kProducerRegisters, Roles::kLaunchRegisters>();
    produce<kFormat, kGroups, kMixed>(a, row, tiles, sm);
  }
}

}  // namespace
}  // namespace dsa_decode
