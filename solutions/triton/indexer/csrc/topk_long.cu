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

constexpr int kMaxDevices = 64;

// Streaming multiprocessors of the current device (cached per device).
cudaError_t multiprocessors(int* count) {
  static int cached[kMaxDevices] = {0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= 0 && device < kMaxDevices && cached[device] > 0) {
    *count = cached[device];
    return cudaSuccess;
  }
  err = cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess && device >= 0 && device < kMaxDevices) cached[device] = *count;
  return err;
}

}  // namespace

cudaError_t launch_long_topk(const LongTopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  int sms = 0;
  cudaError_t err = multiprocessors(&sms);
  if (err != cudaSuccess) return err;
  // A block per chunk of a row, unless the call has more chunks than about kLongWaves waves of
  // blocks: then each block loops over several chunks of its row (a block's fixed costs, its
  // dependent loads and scans, are then paid once per block, not per chunk).
  const int chunks = (args.max_len + kLongChunk - 1) / kLongChunk;
  const int per_row = (kLongWaves * kLongBlocksPerSm * sms + args.batch - 1) / args.batch;
  const int width = chunks < per_row ? chunks : per_row;
  const dim3 grid(static_cast<unsigned>(width > 0 ? width : 1), static_cast<unsigned>(args.batch));
  err = launch(long_histogram_kernel<kLongThreads>, grid, kLongThreads, args.dependent_launch != 0, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<0, kLongThreads>, grid, kLongThreads, true, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<1, kLongThreads>, grid, kLongThreads, true, args, stream);
  if (err == cudaSuccess) err = launch(long_level_kernel<2, kLongThreads>, grid, kLongThreads, true, args, stream);
  return err;
}

}  // namespace dsa_topk
