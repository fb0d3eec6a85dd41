// Host emulation of topk_long.cuh (the long-row top-k: a histogram pass and three level passes), on
// the SIMT layer of topk_emulator.cpp (every CUDA thread a fiber; blocks run one after another, and
// the four kernels one grid after another, as their grid dependencies order them on a GPU).
//
// Build:  g++ -O2 -std=c++17 -DDSA_TOPK_HOST_EMULATION -Isolutions/triton/indexer/csrc topk_long_emulator.cpp -o topk_long_emulator
// Run:    topk_long_emulator INPUT OUTPUT
// INPUT (little-endian): int32 batch, score_stride, bt_stride, max_len, topk, blocks_per_row (the
//   grid's width; 0: one block per chunk, as small calls get on a GPU); float32 scores[batch * score_stride]; int32 seq_lens[batch];
//   int32 block_table[batch * bt_stride].
// OUTPUT: int32 out[batch * topk], then the int32 scratch [batch * kLongScratchInts] after the call
//   (the kernels must leave it zero).
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

#include "topk_long.cuh"

namespace {

template <typename T>
void read_all(std::FILE* f, T* data, size_t count) {
  if (std::fread(data, sizeof(T), count, f) != count) {
    std::fprintf(stderr, "emulator: input file too short\n");
    std::exit(2);
  }
}

// Runs `kernel` over every block of `grid` with `threads` threads.
template <typename Kernel>
void run_grid(Kernel kernel, unsigned grid_x, unsigned grid_y, int threads, const dsa_topk::LongTopkArgs& args) {
  simt::grid_dim() = simt::Dim3{grid_x, grid_y, 1};
  for (unsigned y = 0; y < grid_y; ++y) {
    for (unsigned x = 0; x < grid_x; ++x) simt::run_block(simt::Dim3{x, y, 0}, threads, [&] { kernel(args); });
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
  const int batch = header[0], score_stride = header[1], bt_stride = header[2], max_len = header[3], topk = header[4];
  std::vector<float> scores(static_cast<size_t>(batch) * score_stride);
  std::vector<int32_t> seq_lens(batch), table(static_cast<size_t>(batch) * bt_stride);
  read_all(in, scores.data(), scores.size());
  read_all(in, seq_lens.data(), seq_lens.size());
  read_all(in, table.data(), table.size());
  std::fclose(in);

  std::vector<int32_t> out(static_cast<size_t>(batch) * topk, INT32_MIN);
  std::vector<int4> scratch(static_cast<size_t>(batch) * kLongScratchInts / 4, int4{0, 0, 0, 0});
  std::vector<uint2> candidates(static_cast<size_t>(batch) * 2 * max_len, uint2{0xdeadbeefu, 0xdeadbeefu});
  LongTopkArgs args{};
  args.scores = scores.data();
  args.score_stride = score_stride;
  args.seq_lens = seq_lens.data();
  args.block_table = table.data();
  args.bt_stride = bt_stride;
  args.out = out.data();
  args.out_stride = topk;
  args.scratch = reinterpret_cast<int32_t*>(scratch.data());
  args.candidates = reinterpret_cast<uint32_t*>(candidates.data());
  args.batch = batch;
  args.max_len = max_len;
  args.topk = topk;
  const unsigned chunks = static_cast<unsigned>((max_len + kLongChunk - 1) / kLongChunk);
  const unsigned width = header[5] > 0 && static_cast<unsigned>(header[5]) < chunks ? static_cast<unsigned>(header[5]) : chunks;
  run_grid(long_histogram_kernel<kLongThreads>, width, batch, kLongThreads, args);
  run_grid(long_level_kernel<0, kLongThreads>, width, batch, kLongThreads, args);
  run_grid(long_level_kernel<1, kLongThreads>, width, batch, kLongThreads, args);
  run_grid(long_level_kernel<2, kLongThreads>, width, batch, kLongThreads, args);

  std::FILE* o = std::fopen(argv[2], "wb");
  if (!o) return 2;
  std::fwrite(out.data(), sizeof(int32_t), out.size(), o);
  std::fwrite(scratch.data(), sizeof(int4), scratch.size(), o);
  std::fclose(o);
  return 0;
}
