// Float helpers of the solution's CUDA kernels (inline PTX). Header-only, device code only.
#pragma once

namespace dsa_fast_math {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// Approximate exp2 / log2 / reciprocal (MUFU, denormals flushed): the accurate library forms
// add range checks to every call, and the softmax and the combine are chains of such calls.
// ex2(-inf) = +0 and lg2(0) = -inf, as the online softmax needs.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace dsa_fast_math
