// Host launcher of the long-row top-k (topk_long.cuh). Pure CUDA (no torch headers); nvcc links
// it with topk_long_capi.cpp, the C ABI, into one shared library (common/cuda_build.py).
#include "topk_long.cuh"

namespace dsa_topk {
namespace {

// Launches `kernel` on `grid` x `threads`; `dependent`: as a programmatic dependent of the
// stream's previous kernel (its blocks may start before that kernel ends and wait for it with
// griddepcontrol.wait before they read what it wrote).
template <typename Kernel>
cudaError_t launch(Kernel kernel, dim3 grid, int threads, bool dependent, const LongTopkArgs& args, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_long_topk(const LongTopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  const unsigned chunks = static_cast<unsigned>((args.max_len + kLongChunk - 1) / kLongChunk);
  const dim3 grid(chunks > 0 ? chunks : 1u, static_cast<unsigned>(args.batch));
  cudaError_t err = launch(long_histogram_kernel<kLongThreads>, grid, kLongThreads, args.dependent_launch != 0, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<0, kLongThreads>, grid, kLongThreads, true, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<1, kLongThreads>, grid, kLongThreads, true, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<2, kLongThreads>, grid, kLongThreads, true, args, stream);
  return err;
}

}  // namespace dsa_topk
