// Host emulation of topk_filtered.cuh, for testing the CUDA top-k on machines without a GPU.
//
// The kernel source is compiled unchanged as C++ (DSA_TOPK_HOST_EMULATION) over a tiny SIMT
// layer: every CUDA thread of a block is a fiber (ucontext) on one OS thread; __syncthreads,
// cluster barriers and the warp intrinsics are barriers between fibers, so the kernel's block- and warp-collective
// logic (ballots, shuffles, match_any, shared-memory atomics, the all-lanes-call rules) runs as
// written. Shared memory is process-wide storage reused block after block. It checks logic, not
// GPU timing or the memory model.
//
// Build:  g++ -O2 -std=c++17 -DDSA_TOPK_HOST_EMULATION -Isolutions/triton/indexer/csrc topk_emulator.cpp -o topk_emulator
// Run:    topk_emulator INPUT OUTPUT
// INPUT (little-endian): int32 batch, score_stride, bt_stride, max_len, candidate_capacity,
//   threads (256, 512 or 1024), fast_candidates, topk, split_len (0: whole rows; else the split
//   top-k's two stages, their blocks picked as launch_split_topk does); float32 scores[batch *
//   score_stride]; int32 seq_lens[batch]; int32 block_table[batch * bt_stride].
//   OUTPUT: int32 out[batch * topk].
#define DSA_TOPK_HOST_EMULATION 1

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

// ---------------------------------------------------------------- the SIMT layer

namespace simt {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

constexpr int kWarp = 32;
constexpr size_t kFiberStack = 64 * 1024;

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  bool done = false;
};

// The fibers of one block, or of a cluster of blocks that run together (run_cluster): fiber f is
// thread f % threads of block f / threads (its rank in the cluster).
struct Block {
  int threads = 0;  // per block
  int blocks = 1;   // in the cluster
  Dim3 index;       // of the cluster's first block
  int current = 0;  // fiber running now
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<long> block_generation;  // per block of the cluster
  std::vector<int> block_arrived;
  long cluster_generation = 0;
  int cluster_arrived = 0;
  std::vector<long> warp_generation;
  std::vector<int> warp_arrived;
  std::vector<uint64_t> warp_slots;  // one exchange slot per lane
  size_t shared_slice = 0;           // bytes of dynamic shared memory per block (0: one region for all)
  std::function<void()> body;
};

inline Block& block() {
  static Block b;
  return b;
}

inline std::vector<unsigned char>& dynamic_storage() {
  static std::vector<unsigned char> storage;
  return storage;
}

inline int cluster_rank() { return block().current / block().threads; }

inline unsigned char* dynamic_shared_memory(int rank) { return dynamic_storage().data() + rank * block().shared_slice; }
inline unsigned char* dynamic_shared_memory() { return dynamic_shared_memory(cluster_rank()); }

// `local` (in this block's dynamic shared memory) as the same place in block `rank`'s.
template <typename T>
inline T* cluster_peer(T* local, int rank) {
  const auto offset = reinterpret_cast<unsigned char*>(local) - dynamic_shared_memory();
  if (offset < 0 || (block().shared_slice != 0 && static_cast<size_t>(offset) >= block().shared_slice) || rank < 0 ||
      rank >= block().blocks) {
    std::fprintf(stderr, "emulator: cluster_peer outside the dynamic shared memory or the cluster\n");
    std::abort();
  }
  return reinterpret_cast<T*>(dynamic_shared_memory(rank) + offset);
}

inline Dim3 thread_index() { return Dim3{static_cast<unsigned>(block().current % block().threads), 0, 0}; }
inline Dim3 block_index() {
  const Block& b = block();
  return Dim3{b.index.x + static_cast<unsigned>(cluster_rank()), b.index.y, b.index.z};
}

inline void yield() {
  Block& b = block();
  swapcontext(&b.fibers[b.current].context, &b.scheduler);
}

// Waits until `arrived` reaches `count` (the last arrival starts the next generation).
inline void barrier(long& generation_now, int& arrived, int count) {
  const long generation = generation_now;
  if (++arrived == count) {
    arrived = 0;
    ++generation_now;
    return;
  }
  while (generation_now == generation) yield();
}

inline void sync_block() {
  Block& b = block();
  const int rank = cluster_rank();
  barrier(b.block_generation[rank], b.block_arrived[rank], b.threads);
}

inline void sync_cluster() {
  Block& b = block();
  barrier(b.cluster_generation, b.cluster_arrived, b.threads * b.blocks);
}

inline void sync_warp() {
  Block& b = block();
  const int warp = b.current / kWarp;
  barrier(b.warp_generation[warp], b.warp_arrived[warp], kWarp);
}

// Every lane publishes `value`, then `read` sees all 32 values of the warp.
template <typename Read>
inline uint64_t exchange(uint64_t value, unsigned mask, Read&& read) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "emulator: only full-warp masks are supported\n");
    std::abort();
  }
  Block& b = block();
  const int warp = b.current / kWarp;
  const int lane = b.current % kWarp;
  uint64_t* slots = &b.warp_slots[warp * kWarp];
  slots[lane] = value;
  sync_warp();  // all lanes have written
  const uint64_t result = read(slots, lane);
  sync_warp();  // all lanes have read before any writes again
  return result;
}

inline void fiber_entry() {
  Block& b = block();
  b.body();
  b.fibers[b.current].done = true;
  swapcontext(&b.fibers[b.current].context, &b.scheduler);
}

// Runs `body` as `threads` fibers of each of `blocks` blocks (a cluster: blocks index.x ..
// index.x + blocks - 1, each with its own `shared_slice` bytes of dynamic shared memory when
// that is nonzero) until all of them return.
inline void run_cluster(Dim3 index, int blocks, int threads, size_t shared_slice, const std::function<void()>& body) {
  Block& b = block();
  const int fibers = blocks * threads;
  b.threads = threads;
  b.blocks = blocks;
  b.index = index;
  b.body = body;
  b.shared_slice = shared_slice;
  if (shared_slice != 0) dynamic_storage().assign(shared_slice * blocks, 0);
  b.fibers.resize(fibers);
  b.block_generation.assign(blocks, 0);
  b.block_arrived.assign(blocks, 0);
  b.cluster_generation = 0;
  b.cluster_arrived = 0;
  b.warp_generation.assign((fibers + kWarp - 1) / kWarp, 0);
  b.warp_arrived.assign((fibers + kWarp - 1) / kWarp, 0);
  b.warp_slots.assign(fibers, 0);
  for (int t = 0; t < fibers; ++t) {
    Fiber& f = b.fibers[t];
    f.done = false;
    f.stack.resize(kFiberStack);
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.data();
    f.context.uc_stack.ss_size = f.stack.size();
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_entry, 0);
  }
  for (int remaining = fibers; remaining > 0;) {
    remaining = 0;
    for (int t = 0; t < fibers; ++t) {
      if (b.fibers[t].done) continue;
      b.current = t;
      swapcontext(&b.scheduler, &b.fibers[t].context);
      if (!b.fibers[t].done) ++remaining;
    }
  }
}

// Runs `body` as `threads` fibers of block `index` until all of them return.
inline void run_block(Dim3 index, int threads, const std::function<void()>& body) { run_cluster(index, 1, threads, 0, body); }

}  // namespace simt

// CUDA spellings the kernel uses, mapped onto the SIMT layer.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (simt::thread_index())
#define blockIdx (simt::block_index())

struct uint2 {
  unsigned x, y;
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline void __syncthreads() { simt::sync_block(); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
inline int atomicAdd(int* address, int value) {  // fibers never interleave inside it
  const int old = *address;
  *address = old + value;
  return old;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline void __trap() { std::abort(); }
inline unsigned __ballot_sync(unsigned mask, bool predicate) {
  return static_cast<unsigned>(simt::exchange(predicate ? 1 : 0, mask, [](const uint64_t* slots, int) {
    uint64_t bits = 0;
    for (int l = 0; l < simt::kWarp; ++l) bits |= (slots[l] ? 1ull : 0ull) << l;
    return bits;
  }));
}
inline int __shfl_sync(unsigned mask, int value, int source) {
  return static_cast<int>(static_cast<uint32_t>(simt::exchange(static_cast<uint32_t>(value), mask, [source](const uint64_t* slots, int) { return slots[source]; })));
}
inline int __shfl_up_sync(unsigned mask, int value, unsigned delta) {
  return static_cast<int>(static_cast<uint32_t>(simt::exchange(static_cast<uint32_t>(value), mask, [delta](const uint64_t* slots, int lane) {
    return lane >= static_cast<int>(delta) ? slots[lane - delta] : slots[lane];
  })));
}
inline int __shfl_xor_sync(unsigned mask, int value, int lane_mask) {
  return static_cast<int>(static_cast<uint32_t>(simt::exchange(static_cast<uint32_t>(value), mask, [lane_mask](const uint64_t* slots, int lane) { return slots[lane ^ lane_mask]; })));
}
template <typename Op>
inline uint32_t warp_reduce_emulated(unsigned mask, uint32_t value, Op op) {
  return static_cast<uint32_t>(simt::exchange(value, mask, [op](const uint64_t* slots, int) {
    uint32_t r = static_cast<uint32_t>(slots[0]);
    for (int l = 1; l < simt::kWarp; ++l) r = op(r, static_cast<uint32_t>(slots[l]));
    return static_cast<uint64_t>(r);
  }));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned value) {
  return warp_reduce_emulated(mask, value, [](uint32_t a, uint32_t b) { return a < b ? a : b; });
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return warp_reduce_emulated(mask, value, [](uint32_t a, uint32_t b) { return a > b ? a : b; });
}
inline int __reduce_add_sync(unsigned mask, int value) {
  return static_cast<int>(warp_reduce_emulated(mask, static_cast<uint32_t>(value), [](uint32_t a, uint32_t b) { return a + b; }));
}
inline unsigned __match_any_sync(unsigned mask, int value) {
  return static_cast<unsigned>(simt::exchange(static_cast<uint32_t>(value), mask, [](const uint64_t* slots, int lane) {
    uint64_t bits = 0;
    for (int l = 0; l < simt::kWarp; ++l) bits |= (slots[l] == slots[lane] ? 1ull : 0ull) << l;
    return bits;
  }));
}

inline void __threadfence() {}  // fibers share one address space and never interleave inside an access

namespace simt {
inline Dim3& grid_dim() {
  static Dim3 dims;
  return dims;
}

// Reads `count` values of T from `f`, or exits with 2 (the drivers' input files).
template <typename T>
void read_into(std::FILE* f, T* data, size_t count) {
  if (std::fread(data, sizeof(T), count, f) != count) {
    std::fprintf(stderr, "emulator: input file too short\n");
    std::exit(2);
  }
}

// The input of the long-row driver (topk_long_emulator.cpp): int32
// batch, score_stride, bt_stride, max_len, topk and one driver-specific field; float32
// scores[batch * score_stride]; int32 seq_lens[batch]; int32 block_table[batch * bt_stride].
struct RowsInput {
  int32_t batch = 0, score_stride = 0, bt_stride = 0, max_len = 0, topk = 0, extra = 0;
  std::vector<float> scores;
  std::vector<int32_t> seq_lens, table;
};

// Reads a RowsInput from `path`, or exits with 2.
inline RowsInput read_rows(const char* path) {
  std::FILE* in = std::fopen(path, "rb");
  if (!in) std::exit(2);
  int32_t header[6];
  read_into(in, header, 6);
  RowsInput r;
  r.batch = header[0], r.score_stride = header[1], r.bt_stride = header[2], r.max_len = header[3], r.topk = header[4], r.extra = header[5];
  r.scores.resize(static_cast<size_t>(r.batch) * r.score_stride);
  r.seq_lens.resize(r.batch);
  r.table.resize(static_cast<size_t>(r.batch) * r.bt_stride);
  read_into(in, r.scores.data(), r.scores.size());
  read_into(in, r.seq_lens.data(), r.seq_lens.size());
  read_into(in, r.table.data(), r.table.size());
  std::fclose(in);
  return r;
}

// Writes the int32 `values` to `path`; false when it cannot.
inline bool write_all(const char* path, const std::vector<int32_t>& values) {
  std::FILE* o = std::fopen(path, "wb");
  if (!o) return false;
  std::fwrite(values.data(), sizeof(int32_t), values.size(), o);
  std::fclose(o);
  return true;
}
}  // namespace simt
#define gridDim (simt::grid_dim())

#include "topk_filtered.cuh"

// ---------------------------------------------------------------- driver
// (topk_long_emulator.cpp includes this file for its SIMT layer and brings its own driver)
#ifndef DSA_TOPK_EMULATOR_NO_DRIVER

namespace {

using simt::read_into;

template <int kThreads, int kVectors = dsa_topk::kCachedVectors, bool kSharedRow = false, int kKind = dsa_topk::kWholeRows>
void run(dsa_topk::TopkArgs args) {
  const int blocks = kKind == dsa_topk::kChunkRows ? args.batch * args.split_chunks : args.batch;
  for (int row = 0; row < blocks; ++row) {
    simt::run_block(simt::Dim3{static_cast<unsigned>(row), 0, 0}, kThreads,
                    [&] { dsa_topk::filtered_topk_kernel<kThreads, kVectors, kSharedRow, kKind>(args); });
  }
}

// One stage of the split top-k, on the block launch_split_stage picks for `longest` entries.
template <int kKind>
void run_split_stage(const dsa_topk::TopkArgs& args, int longest) {
  if (longest <= dsa_topk::kLongRowMaxLen) run<512, dsa_topk::kLongRowCachedVectors, false, kKind>(args);
  else if (longest <= dsa_topk::kHalfSharedRowMaxLen) run<1024, dsa_topk::kHalfSharedRowVectors, true, kKind>(args);
  else run<1024, dsa_topk::kSharedRowVectors, true, kKind>(args);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 2;
  int32_t header[9];
  read_into(in, header, 9);
  const int batch = header[0], score_stride = header[1], bt_stride = header[2], max_len = header[3];
  const int capacity = header[4], threads = header[5];
  const int fast = header[6] < 0 || header[6] > dsa_topk::kFastCandidates ? dsa_topk::kFastCandidates : header[6];
  std::vector<float> scores(static_cast<size_t>(batch) * score_stride);
  std::vector<int32_t> seq_lens(batch), table(static_cast<size_t>(batch) * bt_stride);
  const int topk = header[7];  // tokens kept per row (the definition's k), 1..kTopK
  if (topk < 1 || topk > dsa_topk::kTopK) {
    std::fprintf(stderr, "emulator: topk must be in 1..%d\n", dsa_topk::kTopK);
    return 2;
  }
  std::vector<int32_t> out(static_cast<size_t>(batch) * topk, INT32_MIN);
  read_into(in, scores.data(), scores.size());
  read_into(in, seq_lens.data(), seq_lens.size());
  read_into(in, table.data(), table.size());
  std::fclose(in);

  const int cap = capacity < 0 ? dsa_topk::default_candidate_capacity(max_len) : capacity;
  // The candidate buffers, or a shared row's keys (the same memory), whichever is larger.
  const size_t candidates = 2 * static_cast<size_t>(cap) * sizeof(uint2) + 16;
  const size_t shared_row = static_cast<size_t>(dsa_topk::kMtpSharedRowMaxLen) * sizeof(uint32_t);
  simt::dynamic_storage().assign(candidates > shared_row ? candidates : shared_row, 0);
  dsa_topk::TopkArgs args{scores.data(), score_stride, seq_lens.data(), table.data(), bt_stride, out.data(), topk, batch, max_len, cap, fast};
  args.topk = topk;
  const int split_len = header[8];
  if (split_len > 0) {  // the split top-k: stage 1 into `partial` (unwritten entries poisoned), then stage 2
    args.split_len = split_len;
    args.split_chunks = (max_len + split_len - 1) / split_len;
    if (split_len <= topk || split_len > dsa_topk::kSplitMaxChunkLen || args.split_chunks * topk > dsa_topk::kSplitMaxCandidates) {
      std::fprintf(stderr, "emulator: bad split_len %d for topk %d and max_len %d\n", split_len, topk, max_len);
      return 2;
    }
    std::vector<int32_t> partial(static_cast<size_t>(batch) * args.split_chunks * topk, INT32_MIN);
    args.partial = partial.data();
    run_split_stage<dsa_topk::kChunkRows>(args, split_len);
    run_split_stage<dsa_topk::kMergedChunks>(args, args.split_chunks * topk);
    return simt::write_all(argv[2], out) ? 0 : 2;
  }
  switch (threads) {
    case 256: run<256>(args); break;
    case 512:  // as the launcher: rows past kSmallRowMaxLen cache more keys per thread
      if (max_len <= dsa_topk::kSmallRowMaxLen) run<512>(args);
      else if (max_len <= dsa_topk::kMidRowMaxLen) run<512, dsa_topk::kMidRowCachedVectors>(args);
      else run<512, dsa_topk::kLongRowCachedVectors>(args);
      break;
    case 1024:  // as the launcher: rows past kLongRowMaxLen keep their keys in shared memory
      if (max_len <= dsa_topk::kLongRowMaxLen) run<1024>(args);
      else if (max_len <= dsa_topk::kHalfSharedRowMaxLen) run<1024, dsa_topk::kHalfSharedRowVectors, true>(args);
      else if (max_len <= dsa_topk::kSharedRowMaxLen) run<1024, dsa_topk::kSharedRowVectors, true>(args);
      else if (max_len <= dsa_topk::kMtpSharedRowMaxLen) run<1024, dsa_topk::kMtpSharedRowVectors, true>(args);
      else run<1024>(args);
      break;
    default: std::fprintf(stderr, "emulator: threads must be 256, 512 or 1024\n"); return 2;
  }
  return simt::write_all(argv[2], out) ? 0 : 2;
}
#endif  // DSA_TOPK_EMULATOR_NO_DRIVER
