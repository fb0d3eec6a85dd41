// Phase profile of the CUDA top-k: topk_phases.py writes an instrumented copy of the shipped
// kernel (thread 0 of every block stamps clock64 at each phase end into g_marks) and builds this
// driver against it. Per file of score rows (int32 B, int32 stride, int32 lens[B], float
// scores[B * stride]; identity block table) it launches the top-k 55 times, warm and after a
// 256 MiB flush, and prints each phase's cycles averaged over the long rows, those of the slowest
// row, and the CUDA-event span of a launch (host launch overhead included: not a kernel time).
// Without files it uses synthetic rows.
#include <cstdio>
#include <string>
#include <vector>
#include <random>
#include "topk_filtered.cu"  // the instrumented copy, in the build folder
using namespace dsa_topk;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
static void* flush; static const size_t flush_bytes = 256 << 20;
static void profile(const std::string& label, int B, int stride, const std::vector<int>& lens, const std::vector<float>& scores) {
  const int pages = stride / 64;
  std::vector<int> table(size_t(B) * pages);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int(i);
  float* d_s; int *d_l, *d_t, *d_o;
  CK(cudaMalloc(&d_s, scores.size() * 4)); CK(cudaMalloc(&d_l, B * 4)); CK(cudaMalloc(&d_t, table.size() * 4)); CK(cudaMalloc(&d_o, size_t(B) * kTopK * 4));
  CK(cudaMemcpy(d_s, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_l, lens.data(), B * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_t, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  TopkArgs a{d_s, stride, d_l, d_t, pages, d_o, kTopK, B, stride, -1, -1, 0};
  a.topk = kTopK;  // the V3.2 size (TopkArgs::topk)
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int n = 50; double sum_cold = 0, sum_warm = 0; long long inbin = 0; int subdiv = 0, rows = 0;
  std::vector<double> cold(16, 0.0), warm(16, 0.0), worst(16, 0.0);
  auto read_marks = [&](std::vector<double>& acc) {
    std::vector<long long> m(size_t(B) * 16); std::vector<int> info(size_t(B) * 4);
    CK(cudaMemcpyFromSymbol(m.data(), g_marks, m.size() * 8)); CK(cudaMemcpyFromSymbol(info.data(), g_info, info.size() * 4));
    int long_rows = 0; for (int b = 0; b < B; ++b) long_rows += lens[b] > kTopK;
    // cycles of phase i of row b (0 where the row never reached the stamp, e.g. the radix path)
    auto phase = [&](int b, int i) { return m[b * 16 + i] > 0 ? double(m[b * 16 + i] - m[b * 16 + i - 1]) : 0.0; };
    for (int b = 0; b < B; ++b) {
      if (lens[b] <= kTopK) continue;
      double total = 0;
      for (int i = 1; i <= 9; ++i) { acc[i] += phase(b, i) / long_rows / n; total += phase(b, i); }
      if (total > worst[0]) { worst[0] = total; for (int i = 1; i <= 9; ++i) worst[i] = phase(b, i); }
      inbin += info[b * 4]; subdiv += info[b * 4] > kFastDirectRank; rows++;
    }
  };
  for (int it = 0; it < n + 5; ++it) {
    float ms;
    cudaEventRecord(e0); CK(launch_filtered_topk(a, 0)); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
    cudaEventElapsedTime(&ms, e0, e1); if (it >= 5) { sum_warm += ms; read_marks(warm); }
    CK(cudaMemsetAsync(flush, it & 1, flush_bytes));
    cudaEventRecord(e0); CK(launch_filtered_topk(a, 0)); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
    cudaEventElapsedTime(&ms, e0, e1); if (it >= 5) { sum_cold += ms; read_marks(cold); }
  }
  printf("%s B=%2d stride=%5d  event span: cold-L2 %.2f us, warm %.2f us | mean in_bin %.1f, rows past the direct rank %.2f\n", label.c_str(), B, stride,
         1000 * sum_cold / n, 1000 * sum_warm / n, double(inbin) / rows, double(subdiv) / rows);
  const char* names[] = {"", "len load", "load+pass1 range", "pass2 hist", "threshold scan", "pass3 count scan", "pass4 emit", "level2", "rank", "copy out"};
  double tc = 0, tw = 0;
  for (int i = 1; i <= 9; ++i) { printf("   %-18s cold %7.0f  warm %7.0f  slowest row %7.0f cycles\n", names[i], cold[i], warm[i], worst[i]); tc += cold[i]; tw += warm[i]; }
  printf("   %-18s cold %7.0f  warm %7.0f  slowest row %7.0f cycles (%.2f / %.2f / %.2f us at 1.98 GHz)\n", "total in block", tc, tw, worst[0], tc / 1980, tw / 1980, worst[0] / 1980);
  cudaFree(d_s); cudaFree(d_l); cudaFree(d_t); cudaFree(d_o);
}
int main(int argc, char** argv) {
  CK(cudaMalloc(&flush, flush_bytes));
  if (argc > 1) {
    for (int f = 1; f < argc; ++f) {
      FILE* fp = fopen(argv[f], "rb"); int hdr[2]; if (!fp || fread(hdr, 4, 2, fp) != 2) { printf("bad %s\n", argv[f]); return 1; }
      std::vector<int> lens(hdr[0]); std::vector<float> scores(size_t(hdr[0]) * hdr[1]);
      if (fread(lens.data(), 4, lens.size(), fp) != lens.size() || fread(scores.data(), 4, scores.size(), fp) != scores.size()) { printf("short %s\n", argv[f]); return 1; }
      fclose(fp);
      std::string name = argv[f]; name = name.substr(name.find_last_of('/') + 1);
      profile(name, hdr[0], hdr[1], lens, scores);
    }
    return 0;
  }
  const int cases[][2] = {{1, 2112}, {31, 2112}, {1, 5824}, {31, 5824}};
  for (auto& c : cases) {
    const int B = c[0], L = c[1], stride = (L + 63) / 64 * 64;
    std::mt19937 rng(B * 7919 + L); std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> scores(size_t(B) * stride);
    for (auto& s : scores) { float v = 0; for (int h = 0; h < 4; ++h) { float x = nd(rng); v += x > 0 ? x : 0; } s = v; }
    profile("synthetic", B, stride, std::vector<int>(B, L), scores);
  }
  return 0;
}
