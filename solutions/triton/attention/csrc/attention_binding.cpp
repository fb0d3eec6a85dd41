// Thin torch binding of the hand-written sparse MLA attention. The CUDA side (kernels and
// launcher) lives in attention_sm90.cu and knows nothing of torch. attention/cuda.py checks every
// argument before it gets here; the checks below only guard the pointers this file hands on.
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "attention_sm90.h"

namespace {

void check(const at::Tensor& t, const char* name, at::ScalarType dtype, const at::Device& device) {
  TORCH_CHECK(t.is_cuda() && t.device() == device, name, " must be on ", device);
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.stride(t.dim() - 1) == 1, name, " must be contiguous in its last dimension");
}

template <typename T>
T* pointer(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

}  // namespace

// Shapes: see attention_sm90.h. `combine` is a dsa_attention::Combine; returns the
// dsa_attention::Launch used (0 fused, 1 two launches, 2 cluster).
int64_t sparse_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& ckv, const at::Tensor& kpe,
                         const at::Tensor& indices, double sm_scale, at::Tensor& out, at::Tensor& lse, at::Tensor& part_out,
                         at::Tensor& part_lse, at::Tensor& sync, int64_t splits, int64_t combine, int64_t gather_lag,
                         at::Tensor& phase_clocks) {
  const at::Device device = q_nope.device();
  check(q_nope, "q_nope", at::kBFloat16, device);
  check(q_pe, "q_pe", at::kBFloat16, device);
  check(ckv, "ckv_cache", at::kBFloat16, device);
  check(kpe, "kpe_cache", at::kBFloat16, device);
  check(out, "output", at::kBFloat16, device);
  check(part_out, "part_out", at::kBFloat16, device);
  check(indices, "sparse_indices", at::kInt, device);
  check(lse, "lse", at::kFloat, device);
  check(part_lse, "part_lse", at::kFloat, device);
  check(sync, "sync", at::kInt, device);
  const int64_t tokens = q_nope.size(0);
  TORCH_CHECK(combine >= 0 && combine <= static_cast<int64_t>(dsa_attention::Combine::kCluster), "unknown combine ", combine);
  const auto how = static_cast<dsa_attention::Combine>(combine);
  TORCH_CHECK(gather_lag >= 0 && gather_lag <= dsa_attention::kGatherLagOnLanding, "gather_lag out of range");
  if (how != dsa_attention::Combine::kCluster) {  // the cluster combine needs no global scratch
    TORCH_CHECK(part_out.numel() >= tokens * splits * dsa_attention::kHeads * dsa_attention::kDCkv, "part_out too small");
    TORCH_CHECK(part_lse.numel() >= tokens * splits * dsa_attention::kHeads, "part_lse too small");
    TORCH_CHECK(sync.numel() >= tokens * dsa_attention::kSyncStride, "sync too small");
  }
  const bool timed = phase_clocks.numel() > 0;  // empty: no profiling stamps
  if (timed) {
    check(phase_clocks, "phase_clocks", at::kLong, device);
    TORCH_CHECK(phase_clocks.numel() >= tokens * splits * dsa_attention::kPhaseSlots, "phase_clocks too small");
  }
  if (tokens == 0) return 0;

  const c10::cuda::CUDAGuard guard(device);
  dsa_attention::AttentionArgs a{};
  a.q_nope = pointer<const uint16_t>(q_nope);
  a.q_pe = pointer<const uint16_t>(q_pe);
  a.ckv = pointer<const uint16_t>(ckv);
  a.kpe = pointer<const uint16_t>(kpe);
  a.indices = pointer<const int32_t>(indices);
  a.out = pointer<uint16_t>(out);
  a.lse = pointer<float>(lse);
  a.part_out = pointer<uint16_t>(part_out);
  a.part_lse = pointer<float>(part_lse);
  a.sync = pointer<int32_t>(sync);
  a.q_nope_t = q_nope.stride(0);
  a.q_nope_h = q_nope.stride(1);
  a.q_pe_t = q_pe.stride(0);
  a.q_pe_h = q_pe.stride(1);
  a.ckv_page = ckv.stride(0);
  a.ckv_slot = ckv.stride(1);
  a.kpe_page = kpe.stride(0);
  a.kpe_slot = kpe.stride(1);
  a.indices_t = indices.stride(0);
  a.out_t = out.stride(0);
  a.out_h = out.stride(1);
  a.lse_t = lse.stride(0);
  a.phase_clocks = timed ? phase_clocks.data_ptr<int64_t>() : nullptr;
  a.qk_scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  a.tokens = static_cast<int>(tokens);
  a.splits = static_cast<int>(splits);
  a.gather_lag = static_cast<int>(gather_lag);
  dsa_attention::Launch used = dsa_attention::Launch::kFused;
  const cudaError_t err = dsa_attention::launch_sparse_attention(a, how, c10::cuda::getCurrentCUDAStream(device.index()).stream(), &used);
  TORCH_CHECK(err == cudaSuccess, "sparse attention launch failed: ", cudaGetErrorString(err));
  return static_cast<int64_t>(used);
}

int64_t resident_programs() {
  int programs = 0;
  const cudaError_t err = dsa_attention::resident_programs(&programs);
  TORCH_CHECK(err == cudaSuccess, "occupancy query failed: ", cudaGetErrorString(err));
  return programs;
}

int64_t resident_clusters(int64_t splits) {
  int clusters = 0;
  const cudaError_t err = dsa_attention::resident_clusters(static_cast<int>(splits), &clusters);
  TORCH_CHECK(err == cudaSuccess, "cluster occupancy query failed: ", cudaGetErrorString(err));
  return clusters;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sparse_attention", &sparse_attention, "Sparse MLA attention: split-K, then the combine (barrier, second launch or cluster)");
  m.def("resident_programs", &resident_programs, "Programs of the split kernel resident at once on the current device");
  m.def("resident_clusters", &resident_clusters, "Clusters of `splits` programs resident at once on the current device");
  m.attr("HEADS") = dsa_attention::kHeads;
  m.attr("D_CKV") = dsa_attention::kDCkv;
  m.attr("D_KPE") = dsa_attention::kDKpe;
  m.attr("TOPK") = dsa_attention::kTopK;
  m.attr("PAGE_SIZE") = dsa_attention::kPageSize;
  m.attr("SYNC_STRIDE") = dsa_attention::kSyncStride;
  m.attr("TICKETS_PER_CALL") = static_cast<int64_t>(dsa_attention::kTicketsPerCall);
  m.attr("MIN_SPLITS") = dsa_attention::kMinSplits;
  m.attr("MAX_SPLITS") = dsa_attention::kMaxSplits;
  m.attr("MAX_CLUSTER_SPLITS") = dsa_attention::kMaxClusterSplits;
  m.attr("TILE_SLOTS") = dsa_attention::kGatherTileSlots;
  m.attr("STAGES") = dsa_attention::kGatherStages;
  m.attr("GATHER_LAG_ON_LANDING") = dsa_attention::kGatherLagOnLanding;
  m.attr("PHASE_SLOTS") = static_cast<int>(dsa_attention::kPhaseSlots);
}
