// Sparse MLA attention for Hopper, hand-written: split-K over the 2048 selected slots, the
// combine in the same launch. Pure CUDA (no torch); nvcc links it with attention_capi.cpp, the
// C ABI, into one shared library (common/cuda_build.py).
//
// Grid (S splits, T tokens), 8 warps per program. Program (s, t) owns the slots s, s + S,
// s + 2S, ... of token t (strided: valid slots cluster at the front of a row) and walks them in
// tiles of kGatherTileSlots (64) slots:
//   gather  bulk copies (TMA) bring each slot's ckv row (1024 B) and kpe row (128 B) into one
//           shared row, completing on the stage's mbarrier; padding slots are zeroed without a
//           read. kGatherStages stages: a tile is requested once the one before it has landed or
//           `gather_lag` cycles after that one was requested (0: all at once).
//   logits  each warp scores one 8-slot n-tile of the tile against the 16 heads with mma.sync
//           m16n8k16 (bf16 in, fp32 accumulate): q_nope.ckv and q_pe.kpe in separate
//           accumulators (32-slot tiles: two warps per n-tile, each over half the k-steps), and
//           writes the logits to shared memory. One block barrier per tile, here.
//   softmax every warp reads the logits at its P fragments' positions and computes the tile's
//           online softmax step itself (log2 domain, scale pre-multiplied by log2 e): row maxima
//           and sums are quad shuffles, so every warp holds the same running (m, l) per head and
//           P stays in registers.
//   P.V     P (bf16, registers) times the tile's ckv rows; warp w owns value columns
//           64w..64w+63 (8 accumulator tiles), so the 16 x 512 output is spread over the block.
// Then the program writes its partial (output / l in bf16, lse = m + log2 l), and program s
// combines its 1/S share of the token's 16 x 512 outputs from all S partials, in one of three ways:
//   split_kernel, fused    partials in global memory, then a per-token ticket barrier; needs every
//                          program of the grid resident at once (the host checks with the occupancy
//                          calculator)
//   split_kernel + combine_kernel   the same partials, the combine in a second launch
//   cluster_kernel         the token's S <= 16 programs form one thread-block cluster: partials are
//                          bulk-copied into their owners' shared memory and combined there (see
//                          "cluster combine" in combine.cuh).
//
// The sources by role: attention_sm90.h (the constants and arguments shared with the C ABI),
// config.cuh (the tiling and the shared-memory layout), instructions.cuh (PTX
// instructions and small helpers), producer.cuh (the gather), consumer.cuh (logits, softmax, P.V
// and a program's loop over its tiles), combine.cuh (the partials and their combine);
// this file holds the three kernels and their launcher, attention_capi.cpp the C ABI.
#include "attention_sm90.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>

#include <cstdint>

#include "../../common/csrc/fast_math.cuh"
#include "../../common/csrc/sm90_sync.cuh"
#include "combine.cuh"
#include "config.cuh"
#include "consumer.cuh"
#include "instructions.cuh"
#include "producer.cuh"

namespace dsa_attention {
namespace {

__global__ void __launch_bounds__(kThreads, 1) split_kernel(AttentionArgs a, bool fused) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int s = blockIdx.x;
  const int t = blockIdx.y;
  unsigned* ticket_word = reinterpret_cast<unsigned*>(a.sync) + static_cast<int64_t>(t) * kSyncStride;
  stamp(a, t, s, kPhaseEntryNs);
  stamp(a, t, s, kPhaseEntryCycles);
  // Ticket barrier per token: one word that only grows (modulo 2^32), never reset. Every call
  // advances it by kTicketsPerCall in all, each of its S programs by kTicketsPerCall / S, so a
  // call starts on a multiple of kTicketsPerCall whatever the split counts of earlier calls,
  // and its episode ends at the next multiple. Read here, before this program's arrival, the
  // word holds the call's start plus fewer than kTicketsPerCall arrivals, so rounding it down
  // gives the start. The word is copied into shared memory with Q's copies (cp.async, through
  // L2) and read only at the barrier: no thread waits for this cold load before its gathers
  // (a register load's first use was scheduled right after it, stalling warp 0 for a round trip).
  // kTicketsPerCall divides 2^32, so wrapping around keeps episodes aligned; calls on a stream
  // run one after another, so episodes never interleave.
  if (fused && threadIdx.x == 0) cp_async16(sh.ticket, ticket_word, 16);  // joins Q's copy group (attend_split waits for it)

  RowState st;
  float o[kColTiles][4];
  attend_split(sh, a, t, s, st, o, false);
  store_partial(GlobalSink(a, t, s), st, o);
  stamp(a, t, s, kPhasePartialCycles);
  if (!fused) {
    stamp(a, t, s, kPhaseExitNs);
    return;
  }

  // Arrival: a release reduction (no reply to wait for), then loads until the episode ends. The
  // block barrier orders every thread's partial stores before thread 0's release, which makes
  // them visible before its arrival; the acquire load that sees the episode end, then the block
  // barrier, order the combine's loads after everyone's arrival.
  __syncthreads();
  if (threadIdx.x == 0) {
    add_release(ticket_word, kTicketsPerCall / static_cast<unsigned>(a.splits));
    const unsigned episode_end = (sh.ticket[0] / kTicketsPerCall + 1u) * kTicketsPerCall;
    while (static_cast<int>(load_acquire(ticket_word) - episode_end) < 0) {
    }
  }
  __syncthreads();
  combine_share(a, t, s, GlobalSource(a, t));
  stamp(a, t, s, kPhaseExitNs);
}

__global__ void __launch_bounds__(kThreads) combine_kernel(AttentionArgs a) { combine_share(a, blockIdx.y, blockIdx.x, GlobalSource(a, blockIdx.y)); }

// Grid (S, T) in clusters of (S, 1): cluster t is token t, its rank s the split.
__global__ void __launch_bounds__(kThreads, 1) cluster_kernel(AttentionArgs a) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int s = blockIdx.x;
  const int t = blockIdx.y;
  const int splits = a.splits;
  stamp(a, t, s, kPhaseEntryNs);
  stamp(a, t, s, kPhaseEntryCycles);
  const Slices inbox(sh.inbox, splits);
  if (threadIdx.x == 0) {  // the inbox completes when all S slices have landed
    mbarrier_init(&sh.inbox_full, 1);
    mbarrier_arrive_expect_tx(&sh.inbox_full, splits * inbox.slice_units() * sizeof(uint2));
    fence_mbarrier_init();
  }
  // Peers may copy into this program only once it runs and its inbox barrier is initialised:
  // the cluster barrier's phase says so (arrived now, waited for inside attend_split, behind
  // the first tiles' round trip).
  cluster_arrive_relaxed();
  RowState st;
  float o[kColTiles][4];
  attend_split(sh, a, t, s, st, o, true);

  // The gather buffers are free once every warp has folded its last tile: the outgoing slices go there.
  __syncthreads();
  uint2* staging = reinterpret_cast<uint2*>(&sh.kv[0][0][0]);
  const Slices out(staging, splits);
  store_partial(StagingSink(staging, splits), st, o);
  fence_proxy_async();  // the slices' generic writes, before the bulk copies read them
  __syncthreads();
  if (threadIdx.x < splits) {
    const int owner = threadIdx.x;
    bulk_copy_to_peer(inbox.slice(s), out.slice(owner), out.slice_units() * sizeof(uint2), &sh.inbox_full, owner);
    bulk_commit();
  }
  stamp(a, t, s, kPhasePartialCycles);
  const ClusterInbox source{inbox, &sh.inbox_full};
  if (splits == 8) {
    combine_share<8>(a, t, s, source);
  } else {
    combine_share<16>(a, t, s, source);
  }
  static_assert(kMaxClusterSplits == 16, "the cluster split counts dispatched above");
  if (threadIdx.x < splits) bulk_wait_read();  // the slices stay until the copies have read them
  stamp(a, t, s, kPhaseExitNs);
}

constexpr int kMaxDevices = 64;

// Opts the kernels in to their dynamic shared memory and the cluster kernel to clusters of 16
// (beyond the portable 8), once per device.
cudaError_t prepare(int device) {
  static bool done[kMaxDevices] = {false};
  if (device >= 0 && device < kMaxDevices && done[device]) return cudaSuccess;
  const int bytes = static_cast<int>(sizeof(Shared));
  cudaError_t err = cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess && device >= 0 && device < kMaxDevices) done[device] = true;
  return err;
}

cudaError_t current_device_prepared(int* device) {
  cudaError_t err = cudaGetDevice(device);
  return err == cudaSuccess ? prepare(*device) : err;
}

// Launch configuration of the cluster kernel (`attribute` must outlive `config`).
cudaLaunchConfig_t cluster_config(int splits, int tokens, cudaStream_t stream, cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = static_cast<unsigned>(splits);
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(splits, tokens);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = sizeof(Shared);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

bool valid_splits(int splits, int most) { return splits >= kMinSplits && splits <= most && (splits & (splits - 1)) == 0; }

}  // namespace

cudaError_t resident_programs(int* programs) {
  int device = 0;
  cudaError_t err = current_device_prepared(&device);
  if (err != cudaSuccess) return err;
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  int per_sm = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel, kThreads, sizeof(Shared));
  if (err != cudaSuccess) return err;
  *programs = per_sm * sms;
  return cudaSuccess;
}

cudaError_t resident_clusters(int splits, int* clusters) {
  if (!valid_splits(splits, kMaxClusterSplits)) return cudaErrorInvalidValue;
  int device = 0;
  const cudaError_t err = current_device_prepared(&device);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_config(splits, 1, nullptr, &attribute);
  return cudaOccupancyMaxActiveClusters(clusters, cluster_kernel, &config);
}

cudaError_t launch_sparse_attention(const AttentionArgs& args, Combine combine, cudaStream_t stream, Launch* used) {
  const int most = combine == Combine::kCluster ? kMaxClusterSplits : kMaxSplits;
  if (!valid_splits(args.splits, most) || args.gather_lag < 0) return cudaErrorInvalidValue;
  if (args.tokens <= 0) return cudaSuccess;
  if (combine == Combine::kCluster) {
    int device = 0;
    const cudaError_t err = current_device_prepared(&device);
    if (err != cudaSuccess) return err;
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = cluster_config(args.splits, args.tokens, stream, &attribute);
    *used = Launch::kCluster;
    return cudaLaunchKernelEx(&config, cluster_kernel, args);
  }
  int resident = 0;
  const cudaError_t err = resident_programs(&resident);
  if (err != cudaSuccess) return err;
  const bool fused = combine == Combine::kBarrier && static_cast<long long>(args.tokens) * args.splits <= resident;
  const dim3 grid(args.splits, args.tokens);
  split_kernel<<<grid, kThreads, sizeof(Shared), stream>>>(args, fused);
  if (!fused) combine_kernel<<<grid, kThreads, 0, stream>>>(args);
  *used = fused ? Launch::kFused : Launch::kTwoLaunch;
  return cudaGetLastError();
}

}  // namespace dsa_attention
