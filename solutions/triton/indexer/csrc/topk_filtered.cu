// Host launcher of the filtered radix top-k. Pure CUDA (no torch headers); nvcc links it with
// topk_capi.cpp, the C ABI, into one shared library (common/cuda_build.py).
#include "topk_filtered.cuh"

namespace dsa_topk {
namespace {

constexpr int kMaxDevices = 64;

size_t candidate_bytes(int capacity) { return 2 * static_cast<size_t>(capacity) * sizeof(uint2); }

// Largest candidate capacity that fits the device's opt-in shared memory next to the kernel's
// static shared memory; on first use per device it also opts the kernel in to that much dynamic
// shared memory (needed as soon as static + dynamic exceed 48 KiB). Cached per device and block size.
template <int kThreads, int kVectors>
cudaError_t capacity_limit(int device, int* limit) {
  static int cached[kMaxDevices] = {0};
  if (device >= 0 && device < kMaxDevices && cached[device] > 0) {
    *limit = cached[device];
    return cudaSuccess;
  }
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attributes;
  err = cudaFuncGetAttributes(&attributes, filtered_topk_kernel<kThreads, kVectors>);
  if (err != cudaSuccess) return err;
  const long long spare = static_cast<long long>(optin) - static_cast<long long>(attributes.sharedSizeBytes);
  if (spare > 0) {
    err = cudaFuncSetAttribute(filtered_topk_kernel<kThreads, kVectors>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(spare));
    if (err != cudaSuccess) return err;
  }
  const long long fit = spare > 0 ? spare / static_cast<long long>(candidate_bytes(1)) : 0;
  *limit = static_cast<int>(fit < kMaxCandidates ? fit : kMaxCandidates);
  if (device >= 0 && device < kMaxDevices) cached[device] = *limit;
  return cudaSuccess;
}

template <int kThreads, int kVectors>
cudaError_t launch(TopkArgs args, cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int limit = 0;
  err = capacity_limit<kThreads, kVectors>(device, &limit);
  if (err != cudaSuccess) return err;
  const int wanted = args.candidate_capacity < 0 ? default_candidate_capacity(args.max_len) : args.candidate_capacity;
  // A smaller buffer only moves rows with many candidates to the (correct, slower) filter path.
  args.candidate_capacity = wanted < limit ? wanted : limit;
  if (args.fast_candidates < 0 || args.fast_candidates > kFastCandidates) args.fast_candidates = kFastCandidates;
  const size_t smem = candidate_bytes(args.candidate_capacity);
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.batch));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = args.dependent_launch ? 1 : 0;
  err = cudaLaunchKernelEx(&config, filtered_topk_kernel<kThreads, kVectors>, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_filtered_topk(const TopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  if (args.max_len <= kSmallRowMaxLen) return launch<kSmallRowThreads, kCachedVectors>(args, stream);
  if (args.max_len <= kMidRowMaxLen) return launch<kSmallRowThreads, kMidRowCachedVectors>(args, stream);
  if (args.max_len <= kLongRowMaxLen) return launch<kSmallRowThreads, kLongRowCachedVectors>(args, stream);
  return launch<kLargeRowThreads, kCachedVectors>(args, stream);
}

}  // namespace dsa_topk
