// Thin wrappers of the SM90 instructions the decode uses (inline PTX): register rebalancing,
// stmatrix, L2 prefetch, the swizzled tile address, wgmma descriptors and wgmma itself, and the
// FP8 -> bf16 dequantization.
#pragma once

#include "config.cuh"

namespace dsa_decode {
namespace {

// The warpgroup's registers a thread from the kernel's kLaunch to kRegisters (setmaxnreg: a release
// below the launch's count, a claim above it).
template <int kRegisters, int kLaunch>
__device__ __forceinline__ void set_registers() {
  if constexpr (kRegisters < kLaunch) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else if constexpr (kRegisters > kLaunch) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
}
// Four 8x8 bf16 blocks from the mma fragment layout into shared memory, lane l giving the address
// of row l % 8 of block l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(b0), "r"(b1), "r"(b2), "r"(b3)
               : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Byte offset of the 16-byte chunk holding column `col` (a multiple of 8) of row `row` of a tile of
// kRows-row atoms (64 bf16 a row, 128-byte swizzle: 8 consecutive rows hit 8 bank groups).
template <int kRows>
__device__ __forceinline__ uint32_t swizzled_rows(int row, int col) {
  const int chunk = (col / kChunkCols) % (kAtomRowBytes / 16);
  return (col / kAtomCols) * (kRows * kAtomRowBytes) + row * kAtomRowBytes + ((chunk ^ (row % 8)) << 4);
}
// The same in a tile of 64-row atoms (Q, the record stages and P of the 64-head kernel).
__device__ __forceinline__ uint32_t swizzled(int row, int col) { return swizzled_rows<kAtomRows>(row, col); }

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride
// byte offsets (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32) | (1ull << 62);
}
// K-major operand (rows of 64 k-values per atom): 8-row groups 1024 B apart; the leading offset
// is unused with this swizzle. A k-step of 16 moves the start by 32 bytes inside the atom.
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t addr) { return smem_desc(addr, 16, kSwizzleGroupBytes); }
// MN-major operand (V: rows are k = records, 64 n-values per atom row): atoms along n are
// kAtomBytes apart (leading), 8-row k-groups 1024 B apart (stride).
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t addr) { return smem_desc(addr, kAtomBytes, kSwizzleGroupBytes); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across wgmma fences and waits.
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64, 32] (+)= A[64, 16] B[16, 32]: A and B K-major in shared memory (S = Q K^T).
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64, 32] += A[64, 16] B[16, 32]: A MN-major (transposed: V^T, rows of V are k = records), B
// K-major in shared memory (the 32-head kernel's O^T = V^T P^T).
__device__ __forceinline__ void wgmma_m64n32k16_ta(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b));
}
// Four 8x8 bf16 blocks into shared memory transposed (.trans): a thread's fragment element (row r,
// column c) of a block lands in row c, position r; lane l gives the address of row l % 8 of block l / 8.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(b0), "r"(b1), "r"(b2),
               "r"(b3)
               : "memory");
}

// D[64, 64] (+)= A[64, 16] B[16, 64]: A and B K-major in shared memory (S = Q K^T).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The 64 accumulator operands of an m64n128 wgmma (half of O's 256 columns: the 64-head kernel with
// two producer warpgroups, whose 128 registers at launch cannot hold one m64n256's operands), and the
// 128 of an m64n256, shared by the forms below.
#define DSA_WGMMA_ACC64  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),  \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),  \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),  \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),  \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),  \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),  \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define DSA_WGMMA_D64  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DSA_WGMMA_ACC128 DSA_WGMMA_ACC64,  \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),  \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),  \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),  \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),  \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),  \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),  \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),  \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define DSA_WGMMA_D128 DSA_WGMMA_D64 ", "  \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "  \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "  \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "  \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// D[64, 256] += A[64, 16] B[16, 256]: A in registers (four bf16 pairs per thread: heads r0 and
// r0 + 8, k 2 quad .. and 8 + 2 quad ..), B MN-major (transposed) in shared memory (O += P V, P the
// scorer's own).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"  // scale-d is a predicate operand: always accumulate
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DSA_WGMMA_D128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC128
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

// D[64, 256] (+)= A[64, 16] B[16, 256]: A K-major, B MN-major (transposed) in shared memory (O += P V).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" DSA_WGMMA_D128
      "}, %128, %129, p, 1, 1, 0, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC128
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64, 128] += A[64, 16] B[16, 128]: A in registers as for m64n256 below, B MN-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                    uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DSA_WGMMA_D64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC64
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

// D[64, 128] += A[64, 16] B[16, 128]: A K-major, B MN-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" DSA_WGMMA_D64
      "}, %64, %65, p, 1, 1, 0, 1;\n"
      "}\n"
      : DSA_WGMMA_ACC64
      : "l"(desc_a), "l"(desc_b));
}

// 8 e4m3 values (two 32-bit words) times `scale`, as 8 bf16 (round to nearest even), through
// fp32: e4m3x2 -> f16x2 -> 2 x f32, the multiply, f32 x 2 -> bf16x2. (A path of integer bit moves
// and one bf16x2 multiply by the scale was slower.)
__device__ __forceinline__ uint4 dequant8(uint32_t w0, uint32_t w1, float scale) {
  uint32_t out[4];
  const uint32_t words[2] = {w0, w1};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t pair = static_cast<uint16_t>(words[i / 2] >> (16 * (i % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A UE8M0 scale byte as the float 2^(e - 127) (e = 0: 2^-127, a subnormal).
__device__ __forceinline__ float ue8m0(uint32_t e) { return __int_as_float(e ? e << 23 : 0x00400000); }

}  // namespace
}  // namespace dsa_decode
