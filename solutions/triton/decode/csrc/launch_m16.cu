// The launcher of the 16/32-head decode (kernel_m16.cuh; docs/kernels/mla_decode.md, "16 and 32
// heads"): grid (1, 1, programs: DecodeArgs' schedule), M16Roles' threads, one program per SM; split tokens'
// partials (PartialsM16) are merged in the same launch behind the ticket barrier (DecodeArgs::tickets)
// or by the combine kernel (combine.cuh), launched next as a programmatic dependent, as for 64 heads.
// Its own translation unit, so the 64-head kernels' code (launch_sm90.cu) does not change with it.
#include "combine.cuh"
#include "decode_sm90.h"
#include "kernel_m16.cuh"

namespace dsa_decode {
namespace {

template <int kFormat, int kMTiles, bool kMixed>
cudaError_t launch_m16(const DecodeArgs& a, cudaStream_t stream) {
  constexpr int bytes = M16Shared<kFormat, kMTiles>::kBytes;
  const auto kernel = decode_kernel_m16<kFormat, kMTiles, kM16ProducerGroups, kMixed>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) return err;
  const int split = split_tokens(a);
  const dim3 grid(1, 1, a.whole_tokens + split * a.splits);
  err = check_in_launch_combine(a, grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, M16Roles<kFormat, kM16ProducerGroups>::kThreads, bytes, stream>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.splits == 1 || split == 0 || a.tickets != nullptr) return err;
  return launch_combine<PartialsM16<kMTiles>>(combine_kernel_for<PartialsM16<kMTiles>>, split, a, stream);
}

}  // namespace

template <int kFormat, int kMTiles>
cudaError_t launch_m16_schedule(const DecodeArgs& a, cudaStream_t stream) {
  return mixed_schedule(a) ? launch_m16<kFormat, kMTiles, true>(a, stream) : launch_m16<kFormat, kMTiles, false>(a, stream);
}

cudaError_t launch_decode_m16(const DecodeArgs& args, cudaStream_t stream) {
  if (args.h_q == 2 * kMmaM) {
    return args.format == kFormatV32 ? launch_m16_schedule<kFormatV32, 2>(args, stream) : launch_m16_schedule<kFormatV4, 2>(args, stream);
  }
  return args.format == kFormatV32 ? launch_m16_schedule<kFormatV32, 1>(args, stream) : launch_m16_schedule<kFormatV4, 1>(args, stream);
}

}  // namespace dsa_decode
