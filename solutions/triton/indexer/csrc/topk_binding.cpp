// Thin torch binding of the filtered radix top-k. The CUDA side (kernel and launcher) lives in
// topk_filtered.cu / topk_filtered.cuh and knows nothing of torch.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <limits>

#include "topk_filtered.h"

namespace {

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dims, const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but scores are on ", device);
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dims, name, " must have ", dims, " dimensions, got ", t.dim());
  TORCH_CHECK(t.stride(dims - 1) == 1, name, " must be contiguous in its last dimension");
}

}  // namespace

// scores [B, W] fp32 (W >= max_num_pages * 64, rows 16-byte aligned), seq_lens [B] int32,
// block_table [B, max_num_pages] int32, topk_indices [B, 2048] int32 (written in full).
// candidate_capacity < 0 picks the default shared-memory candidate buffer; 0 or a small value
// forces rows onto the filter-the-row path (a test hook). fast_candidates < 0 picks the fast
// path's default; 0 turns the fast path off (a test hook for the radix select).
void filtered_topk(const at::Tensor& scores, const at::Tensor& seq_lens, const at::Tensor& block_table, at::Tensor& topk_indices,
                   int64_t candidate_capacity, int64_t fast_candidates) {
  const at::Device device = scores.device();
  check_tensor(scores, "scores", at::kFloat, 2, device);
  check_tensor(seq_lens, "seq_lens", at::kInt, 1, device);
  check_tensor(block_table, "block_table", at::kInt, 2, device);
  check_tensor(topk_indices, "topk_indices", at::kInt, 2, device);
  const int64_t batch = scores.size(0);
  const int64_t max_len = block_table.size(1) * dsa_topk::kPageSize;
  TORCH_CHECK(seq_lens.size(0) == batch && block_table.size(0) == batch && topk_indices.size(0) == batch,
              "scores, seq_lens, block_table and topk_indices must agree on the batch size");
  TORCH_CHECK(topk_indices.size(1) == dsa_topk::kTopK, "topk_indices must have ", dsa_topk::kTopK, " columns");
  TORCH_CHECK(scores.size(1) >= max_len, "scores must have max_num_pages * ", dsa_topk::kPageSize, " = ", max_len,
              " columns, got ", scores.size(1));
  TORCH_CHECK(scores.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(scores.data_ptr()) % 16 == 0,
              "score rows must be 16-byte aligned (the kernel reads them as float4)");
  TORCH_CHECK(batch <= std::numeric_limits<int>::max() && max_len <= std::numeric_limits<int>::max(), "problem too large");
  TORCH_CHECK(candidate_capacity >= -1 && candidate_capacity <= std::numeric_limits<int>::max(), "bad candidate_capacity");
  TORCH_CHECK(fast_candidates >= -1 && fast_candidates <= dsa_topk::kFastCandidates, "fast_candidates must be -1 or 0..", dsa_topk::kFastCandidates);
  if (batch == 0) return;

  const c10::cuda::CUDAGuard guard(device);
  dsa_topk::TopkArgs args{};
  args.scores = scores.data_ptr<float>();
  args.score_stride = scores.stride(0);
  args.seq_lens = seq_lens.data_ptr<int32_t>();
  args.block_table = block_table.data_ptr<int32_t>();
  args.bt_stride = block_table.stride(0);
  args.out = topk_indices.data_ptr<int32_t>();
  args.out_stride = topk_indices.stride(0);
  args.batch = static_cast<int>(batch);
  args.max_len = static_cast<int>(max_len);
  args.candidate_capacity = static_cast<int>(candidate_capacity);
  args.fast_candidates = static_cast<int>(fast_candidates);
  const cudaError_t err = dsa_topk::launch_filtered_topk(args, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  TORCH_CHECK(err == cudaSuccess, "filtered top-k launch failed: ", cudaGetErrorString(err));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("filtered_topk", &filtered_topk, "Top-2048 physical ids per row (filtered radix select, page-table emit)",
        pybind11::arg("scores"), pybind11::arg("seq_lens"), pybind11::arg("block_table"), pybind11::arg("topk_indices"),
        pybind11::arg("candidate_capacity") = -1, pybind11::arg("fast_candidates") = -1);
  m.attr("TOPK") = dsa_topk::kTopK;
  m.attr("PAGE_SIZE") = dsa_topk::kPageSize;
  m.attr("MAX_CANDIDATES") = dsa_topk::kMaxCandidates;
  m.attr("FAST_CANDIDATES") = dsa_topk::kFastCandidates;
}
