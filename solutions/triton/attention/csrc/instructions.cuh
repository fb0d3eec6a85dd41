// The instructions the sparse attention kernels are built from: profiling stamps, cp.async and bulk
// (TMA) copies, ldmatrix, the bf16 mma, bf16 packing and quad reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../../common/csrc/fast_math.cuh"
#include "../../common/csrc/sm90_sync.cuh"
#include "config.cuh"

namespace dsa_attention {
namespace {

using dsa_fast_math::fast_exp2;
using dsa_fast_math::fast_log2;
using dsa_fast_math::fast_rcp;
using dsa_fast_math::neg_inf;
using dsa_sm90::add_release;
using dsa_sm90::fence_mbarrier_init;
using dsa_sm90::fence_proxy_async;
using dsa_sm90::load_acquire;
using dsa_sm90::mbarrier_arrive;
using dsa_sm90::mbarrier_arrive_expect_tx;
using dsa_sm90::mbarrier_done;
using dsa_sm90::mbarrier_init;
using dsa_sm90::mbarrier_wait;
using dsa_sm90::smem_addr;

// log2 of the units each program combines, kUnits / S (S is a power of two known only at run
// time: the share arithmetic uses shifts and masks instead of integer divisions).
__device__ __forceinline__ int share_shift(int splits) { return kUnitsLog2 - (__ffs(splits) - 1); }

__device__ __forceinline__ int64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return static_cast<int64_t>(ns);
}

// Profiling stamp (see PhaseSlot): thread 0 of the program, only when the caller asked.
__device__ __forceinline__ void stamp(const AttentionArgs& a, int t, int s, PhaseSlot slot) {
  if (a.phase_clocks == nullptr || threadIdx.x != 0) return;
  const bool wall = slot == kPhaseEntryNs || slot == kPhaseExitNs;
  a.phase_clocks[(static_cast<int64_t>(t) * a.splits + s) * kPhaseSlots + slot] = wall ? global_ns() : static_cast<int64_t>(clock64());
}

// 16-byte global -> shared copy; `bytes` 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The gather stages' mbarriers (common/csrc/sm90_sync.cuh): every thread arrives once per tile,
// and the tile's bulk copies complete their bytes on them (expect_tx), so a completed phase
// means every row has landed.

// Bulk (TMA) copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// this program's shared memory, completing its bytes on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a (16 x 16, row-major bf16) * b (16 x 8, column-major bf16), fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t bits) {
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}


// Max over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

}  // namespace
}  // namespace dsa_attention
