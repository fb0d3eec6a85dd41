// Host launcher of the filtered radix top-k. Pure CUDA (no torch headers); nvcc links it with
// topk_capi.cpp, the C ABI, into one shared library (common/cuda_build.py).
#include "topk_filtered.cuh"

namespace dsa_topk {
namespace {

constexpr int kMaxDevices = 64;

size_t candidate_bytes(int capacity) { return 2 * static_cast<size_t>(capacity) * sizeof(uint2); }

// Dynamic shared memory the kernel may use on `device`: the device's opt-in shared memory less the
// kernel's static shared memory; on first use per device it also opts the kernel in to that much
// (needed as soon as static + dynamic exceed 48 KiB). Cached per device and kernel.
template <int kThreads, int kVectors, bool kSharedRow, int kKind>
cudaError_t dynamic_limit(int device, long long* bytes) {
  static long long cached[kMaxDevices] = {0};
  if (device >= 0 && device < kMaxDevices && cached[device] > 0) {
    *bytes = cached[device];
    return cudaSuccess;
  }
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attributes;
  err = cudaFuncGetAttributes(&attributes, filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind>);
  if (err != cudaSuccess) return err;
  const long long spare = static_cast<long long>(optin) - static_cast<long long>(attributes.sharedSizeBytes);
  if (spare > 0) {
    err = cudaFuncSetAttribute(filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(spare));
    if (err != cudaSuccess) return err;
  }
  *bytes = spare > 0 ? spare : 0;
  if (device >= 0 && device < kMaxDevices) cached[device] = *bytes;
  return cudaSuccess;
}

// Dynamic shared memory filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind> may use on the current device.
template <int kThreads, int kVectors, bool kSharedRow, int kKind>
cudaError_t current_dynamic_limit(long long* bytes) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return dynamic_limit<kThreads, kVectors, kSharedRow, kKind>(device, bytes);
}

// Launches filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind>, one block per batch row (per
// chunk with kChunkRows). Its dynamic shared memory holds the radix select's candidate buffers (as
// many entries as fit, at most the request; `longest` entries of a block suffice) and, with
// kSharedRow, the row's keys (the same memory: SharedRow), which the caller has checked fit.
template <int kThreads, int kVectors, bool kSharedRow = false, int kKind = kWholeRows>
cudaError_t launch(TopkArgs args, int longest, cudaStream_t stream) {
  long long spare = 0;
  cudaError_t err = current_dynamic_limit<kThreads, kVectors, kSharedRow, kKind>(&spare);
  if (err != cudaSuccess) return err;
  constexpr size_t kRowBytes = kSharedRow ? SharedRow<kThreads, kVectors>::kBytes : 0;
  const long long fit = spare / static_cast<long long>(candidate_bytes(1));
  const int limit = static_cast<int>(fit < kMaxCandidates ? fit : kMaxCandidates);
  const int wanted = args.candidate_capacity < 0 ? default_candidate_capacity(longest) : args.candidate_capacity;
  // A smaller buffer only moves rows with many candidates to the (correct, slower) filter path.
  args.candidate_capacity = wanted < limit ? wanted : limit;
  if (args.fast_candidates < 0 || args.fast_candidates > kFastCandidates) args.fast_candidates = kFastCandidates;
  const size_t candidates = candidate_bytes(args.candidate_capacity);
  const size_t smem = candidates > kRowBytes ? candidates : kRowBytes;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(kKind == kChunkRows ? args.batch * args.split_chunks : args.batch));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = args.dependent_launch ? 1 : 0;
  err = cudaLaunchKernelEx(&config, filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind>, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

// A 1024-thread block with the row's keys in shared memory (kVectors float4 a thread) where the
// device has room for them, else the 1024-thread register block, whose rows past 8192 take the radix select.
template <int kVectors, int kKind = kWholeRows>
cudaError_t launch_shared_row(const TopkArgs& args, int longest, cudaStream_t stream) {
  long long spare = 0;
  const cudaError_t err = current_dynamic_limit<kLargeRowThreads, kVectors, true, kKind>(&spare);
  if (err != cudaSuccess) return err;
  if (SharedRow<kLargeRowThreads, kVectors>::kBytes > spare) return launch<kLargeRowThreads, kCachedVectors, false, kKind>(args, longest, stream);
  return launch<kLargeRowThreads, kVectors, true, kKind>(args, longest, stream);
}

// A stage of the split top-k whose blocks hold at most `longest` entries (<= kSplitMaxChunkLen and
// kSplitMaxCandidates): the register block of 8192, or a shared row of 16384 or 32768.
template <int kKind>
cudaError_t launch_split_stage(const TopkArgs& args, int longest, cudaStream_t stream) {
  static_assert(kSplitMaxChunkLen <= kSharedRowMaxLen && kSplitMaxCandidates <= kSharedRowMaxLen, "a stage's block holds its entries");
  if (longest <= kLongRowMaxLen) return launch<kSmallRowThreads, kLongRowCachedVectors, false, kKind>(args, longest, stream);
  if (longest <= kHalfSharedRowMaxLen) return launch_shared_row<kHalfSharedRowVectors, kKind>(args, longest, stream);
  return launch_shared_row<kSharedRowVectors, kKind>(args, longest, stream);
}

}  // namespace

cudaError_t launch_filtered_topk(const TopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  const int longest = args.max_len;
  if (longest <= kSmallRowMaxLen) return launch<kSmallRowThreads, kCachedVectors>(args, longest, stream);
  if (longest <= kMidRowMaxLen) return launch<kSmallRowThreads, kMidRowCachedVectors>(args, longest, stream);
  if (longest <= kLongRowMaxLen) return launch<kSmallRowThreads, kLongRowCachedVectors>(args, longest, stream);
  if (longest <= kHalfSharedRowMaxLen) return launch_shared_row<kHalfSharedRowVectors>(args, longest, stream);
  if (longest <= kSharedRowMaxLen) return launch_shared_row<kSharedRowVectors>(args, longest, stream);
  if (longest <= kMtpSharedRowMaxLen) return launch_shared_row<kMtpSharedRowVectors>(args, longest, stream);
  return launch<kLargeRowThreads, kCachedVectors>(args, longest, stream);
}

cudaError_t launch_split_topk(const TopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  const cudaError_t err = launch_split_stage<kChunkRows>(args, args.split_len, stream);
  if (err != cudaSuccess) return err;
  TopkArgs merge = args;
  merge.dependent_launch = 1;  // stage 2 waits for stage 1's `partial`; its launch overlaps stage 1's tail
  return launch_split_stage<kMergedChunks>(merge, args.split_chunks * args.topk, stream);
}

}  // namespace dsa_topk
