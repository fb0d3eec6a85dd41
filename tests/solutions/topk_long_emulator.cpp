// Host emulation of the long-row top-k kernels, on the SIMT layer of topk_emulator.cpp (every CUDA
// thread a fiber):
// - topk_long.cuh (a histogram pass and three level passes): blocks run one after another, and the
//   four kernels one grid after another, as their grid dependencies order them on a GPU;
// - topk_cluster.cuh (one thread-block cluster per row), with `cluster` as the third argument: a
//   cluster's blocks run together as fibers of one scheduler, each block with its own dynamic shared
//   memory, so the remote atomics, the gathers through cluster_peer and the cluster barriers run as
//   written; clusters (rows) run one after another.
//
// Build:  g++ -O2 -std=c++17 -DDSA_TOPK_HOST_EMULATION -Isolutions/triton/indexer/csrc topk_long_emulator.cpp -o topk_long_emulator
// Run:    topk_long_emulator INPUT OUTPUT [cluster]
// INPUT: simt::RowsInput; its sixth header field is blocks_per_row for the multi-pass kernels (the
//   grid's width; 0: one block per chunk, as small calls get on a GPU), the cluster's size (2, 4, 8
//   or 16, as the launcher picks it from max_len) for the cluster kernel.
// OUTPUT: int32 out[batch * topk]; for the multi-pass kernels then the int32 scratch
//   [batch * kLongScratchInts] after the call (the kernels must leave it zero).
#define DSA_TOPK_EMULATOR_NO_DRIVER 1
#include "topk_emulator.cpp"
#include "topk_cluster.cuh"

namespace {

// Runs `kernel` over every block of `grid` with `threads` threads.
template <typename Kernel>
void run_grid(Kernel kernel, unsigned grid_x, unsigned grid_y, int threads, const dsa_topk::LongTopkArgs& args) {
  simt::grid_dim() = simt::Dim3{grid_x, grid_y, 1};
  for (unsigned y = 0; y < grid_y; ++y) {
    for (unsigned x = 0; x < grid_x; ++x) simt::run_block(simt::Dim3{x, y, 0}, threads, [&] { kernel(args); });
  }
}

// The four multi-pass kernels; appends the scratch they leave to `out`.
void run_multi_pass(dsa_topk::LongTopkArgs args, int blocks_per_row, std::vector<int32_t>& out) {
  using namespace dsa_topk;
  std::vector<int4> scratch(static_cast<size_t>(args.batch) * kLongScratchInts / 4, int4{0, 0, 0, 0});
  std::vector<uint2> candidates(static_cast<size_t>(args.batch) * 2 * args.max_len, uint2{0xdeadbeefu, 0xdeadbeefu});
  args.scratch = reinterpret_cast<int32_t*>(scratch.data());
  args.candidates = reinterpret_cast<uint32_t*>(candidates.data());
  const unsigned chunks = static_cast<unsigned>((args.max_len + kLongChunk - 1) / kLongChunk);
  const unsigned width = blocks_per_row > 0 && static_cast<unsigned>(blocks_per_row) < chunks ? static_cast<unsigned>(blocks_per_row) : chunks;
  run_grid(long_histogram_kernel<kLongThreads>, width, args.batch, kLongThreads, args);
  run_grid(long_level_kernel<0, kLongThreads>, width, args.batch, kLongThreads, args);
  run_grid(long_level_kernel<1, kLongThreads>, width, args.batch, kLongThreads, args);
  run_grid(long_level_kernel<2, kLongThreads>, width, args.batch, kLongThreads, args);
  const int32_t* words = reinterpret_cast<const int32_t*>(scratch.data());
  out.insert(out.end(), words, words + scratch.size() * 4);
}

template <int kBlocks>
void run_clusters(const dsa_topk::LongTopkArgs& args) {
  simt::grid_dim() = simt::Dim3{kBlocks, static_cast<unsigned>(args.batch), 1};
  for (int row = 0; row < args.batch; ++row) {
    simt::run_cluster(simt::Dim3{0, static_cast<unsigned>(row), 0}, kBlocks, dsa_topk::kClusterThreads, sizeof(dsa_topk::ClusterShared),
                      [&] { dsa_topk::cluster_topk_kernel<kBlocks>(args); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool cluster = argc == 4 && std::strcmp(argv[3], "cluster") == 0;
  if (argc != 3 && !cluster) {
    std::fprintf(stderr, "usage: %s INPUT OUTPUT [cluster]\n", argv[0]);
    return 2;
  }
  simt::RowsInput in = simt::read_rows(argv[1]);
  std::vector<int32_t> out(static_cast<size_t>(in.batch) * in.topk, INT32_MIN);
  dsa_topk::LongTopkArgs args{};
  args.scores = in.scores.data();
  args.score_stride = in.score_stride;
  args.seq_lens = in.seq_lens.data();
  args.block_table = in.table.data();
  args.bt_stride = in.bt_stride;
  args.out = out.data();
  args.out_stride = in.topk;
  args.batch = in.batch;
  args.max_len = in.max_len;
  args.topk = in.topk;
  if (!cluster) {
    run_multi_pass(args, in.extra, out);
  } else {
    switch (in.extra) {
      case 2: run_clusters<2>(args); break;
      case 4: run_clusters<4>(args); break;
      case 8: run_clusters<8>(args); break;
      case 16: run_clusters<16>(args); break;
      default: std::fprintf(stderr, "emulator: the cluster's size must be 2, 4, 8 or 16\n"); return 2;
    }
  }
  return simt::write_all(argv[2], out) ? 0 : 2;
}
