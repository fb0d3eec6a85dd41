// Host launchers of the long-row top-k kernels: the multi-pass one (topk_long.cuh) and the cluster
// one (topk_cluster.cuh). Pure CUDA (no torch headers); nvcc links it with topk_long_capi.cpp, the
// C ABI, into one shared library (common/cuda_build.py).
#include "topk_cluster.cuh"

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

// The cluster kernel's blocks per row for rows of up to max_len tokens: the smallest power of two of
// kClusterChunk-score blocks that holds them (0: more than kClusterMaxLen).
int cluster_blocks_for(int max_len) {
  int blocks = kClusterMinBlocks;
  while (blocks * kClusterChunk < max_len) blocks *= 2;
  return blocks <= kClusterMaxBlocks ? blocks : 0;
}

template <int kBlocks>
cudaError_t cluster_config(cudaLaunchConfig_t& config, cudaLaunchAttribute (&attributes)[2], int batch, bool dependent, cudaStream_t stream) {
  // A 16-block cluster is past the portable size (8); the kernel must allow it explicitly.
  cudaError_t err = cudaFuncSetAttribute(cluster_topk_kernel<kBlocks>, cudaFuncAttributeNonPortableClusterSizeAllowed, kBlocks > 8 ? 1 : 0);
  if (err != cudaSuccess) return err;
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kBlocks;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config = cudaLaunchConfig_t{};
  config.gridDim = dim3(kBlocks, static_cast<unsigned>(batch));
  config.blockDim = dim3(kClusterThreads);
  config.dynamicSmemBytes = sizeof(ClusterShared);
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = dependent ? 2 : 1;
  return cudaSuccess;
}

template <int kBlocks>
cudaError_t launch_cluster(const LongTopkArgs& args, cudaStream_t stream) {
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attributes[2];
  cudaError_t err = cluster_config<kBlocks>(config, attributes, args.batch, args.dependent_launch != 0, stream);
  if (err != cudaSuccess) return err;
  err = cudaLaunchKernelEx(&config, cluster_topk_kernel<kBlocks>, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

template <int kBlocks>
cudaError_t active_clusters(int* count) {
  cudaLaunchConfig_t config;
  cudaLaunchAttribute attributes[2];
  const cudaError_t err = cluster_config<kBlocks>(config, attributes, 1, false, nullptr);
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveClusters(count, cluster_topk_kernel<kBlocks>, &config);
}

}  // namespace

cudaError_t launch_cluster_topk(const LongTopkArgs& args, cudaStream_t stream) {
  if (args.batch <= 0) return cudaSuccess;
  switch (cluster_blocks_for(args.max_len)) {
    case 2: return launch_cluster<2>(args, stream);
    case 4: return launch_cluster<4>(args, stream);
    case 8: return launch_cluster<8>(args, stream);
    case 16: return launch_cluster<16>(args, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t cluster_topk_capacity(int max_len, int* clusters) {
  *clusters = 0;
  switch (cluster_blocks_for(max_len)) {
    case 2: return active_clusters<2>(clusters);
    case 4: return active_clusters<4>(clusters);
    case 8: return active_clusters<8>(clusters);
    case 16: return active_clusters<16>(clusters);
    default: return cudaSuccess;
  }
}

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
