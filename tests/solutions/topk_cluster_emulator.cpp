// Host emulation of topk_cluster.cuh (the cluster top-k: one thread-block cluster per row), on the
// SIMT layer of topk_emulator.cpp: a cluster's blocks run together as fibers of one scheduler, each
// block with its own dynamic shared memory, so the remote atomics, the gathers through
// cluster_peer and the cluster barriers run as written. Clusters (rows) run one after another.
//
// Build:  g++ -O2 -std=c++17 -DDSA_TOPK_HOST_EMULATION -Isolutions/triton/indexer/csrc topk_cluster_emulator.cpp -o topk_cluster_emulator
// Run:    topk_cluster_emulator INPUT OUTPUT
// INPUT (little-endian): int32 batch, score_stride, bt_stride, max_len, topk, blocks (the cluster's
//   size, as the launcher picks it from max_len); float32 scores[batch * score_stride];
//   int32 seq_lens[batch]; int32 block_table[batch * bt_stride].
// OUTPUT: int32 out[batch * topk].
#define DSA_TOPK_EMULATOR_NO_DRIVER 1
#include "topk_emulator.cpp"

inline void __threadfence() {}  // fibers share one address space and never interleave inside an access

namespace simt {
inline Dim3& grid_dim() {
  static Dim3 dims;
  return dims;
}
}  // namespace simt
#define gridDim (simt::grid_dim())

#include "topk_cluster.cuh"

namespace {

template <typename T>
void read_all(std::FILE* f, T* data, size_t count) {
  if (std::fread(data, sizeof(T), count, f) != count) {
    std::fprintf(stderr, "emulator: input file too short\n");
    std::exit(2);
  }
}

template <int kBlocks>
void run_rows(const dsa_topk::ClusterTopkArgs& args) {
  simt::grid_dim() = simt::Dim3{kBlocks, static_cast<unsigned>(args.batch), 1};
  for (int row = 0; row < args.batch; ++row) {
    simt::run_cluster(simt::Dim3{0, static_cast<unsigned>(row), 0}, kBlocks, dsa_topk::kClusterThreads, sizeof(dsa_topk::ClusterShared),
                      [&] { dsa_topk::cluster_topk_kernel<kBlocks>(args); });
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dsa_topk;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 2;
  int32_t header[6];
  read_all(in, header, 6);
  const int batch = header[0], score_stride = header[1], bt_stride = header[2], max_len = header[3], topk = header[4], blocks = header[5];
  std::vector<float> scores(static_cast<size_t>(batch) * score_stride);
  std::vector<int32_t> seq_lens(batch), table(static_cast<size_t>(batch) * bt_stride);
  read_all(in, scores.data(), scores.size());
  read_all(in, seq_lens.data(), seq_lens.size());
  read_all(in, table.data(), table.size());
  std::fclose(in);

  std::vector<int32_t> out(static_cast<size_t>(batch) * topk, INT32_MIN);
  ClusterTopkArgs args{};
  args.scores = scores.data();
  args.score_stride = score_stride;
  args.seq_lens = seq_lens.data();
  args.block_table = table.data();
  args.bt_stride = bt_stride;
  args.out = out.data();
  args.out_stride = topk;
  args.batch = batch;
  args.max_len = max_len;
  args.topk = topk;
  switch (blocks) {
    case 2: run_rows<2>(args); break;
    case 4: run_rows<4>(args); break;
    case 8: run_rows<8>(args); break;
    case 16: run_rows<16>(args); break;
    default: std::fprintf(stderr, "emulator: blocks must be 2, 4, 8 or 16\n"); return 2;
  }
  std::FILE* o = std::fopen(argv[2], "wb");
  if (!o) return 2;
  std::fwrite(out.data(), sizeof(int32_t), out.size(), o);
  std::fclose(o);
  return 0;
}
