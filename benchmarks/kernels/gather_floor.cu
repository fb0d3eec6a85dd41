// Gather-only kernels for gather_floor.py: how fast can the H200 bring a sparse-attention
// call's selected rows (ckv 1024 B + kpe 128 B per valid slot) into the SMs, without any math?
//
// Program (s, t) takes the slots s, s + S, s + 2S, ... of token t (the strided split of the
// attention kernel) and fetches each valid slot's rows:
//   bulk  one bulk (TMA) copy per row into shared memory, every row of the program at once, all
//         completing on one mbarrier
//   rows  the same copies, each row completing on its own mbarrier, and the block polling them
//         (a non-blocking test per row, then a block-wide count) until every row has landed, as
//         the landing-order experiment did (benchmarks/README.md); rows_sleep pauses between polls
//   ldg   16-byte loads through L2 (ld.global.cg) by every thread into registers, 8 in flight
//         per thread, folded into a checksum so the loads are kept
// The checksum / first shared word goes to `sink` so nothing is optimised away. In bulk mode
// each program can also stamp its SM, entry and landing (`landing`; gather_floor.py --per-sm).
//
// Built by torch.utils.cpp_extension (which defines TORCH_EXTENSION_NAME) with its binding;
// without it only the kernels compile (`nvcc -arch=sm_90a -c benchmarks/kernels/gather_floor.cu`, the CPU
// tests' check).
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

namespace gather_floor {

namespace ptx = cuda::ptx;

constexpr int kTopK = 2048;
constexpr int kPageSize = 64;
constexpr int kCkvBytes = 1024;
constexpr int kKpeBytes = 128;
constexpr int kRowBytes = kCkvBytes + kKpeBytes;
constexpr int kThreads = 256;
constexpr int kLoadsInFlight = 8;
constexpr unsigned kPollPauseNs = 100;

// One slot's rows, bulk-copied to `dst`, completing their bytes on `bar`.
__device__ __forceinline__ void copy_rows(uint8_t* dst, const uint8_t* ckv, const uint8_t* kpe, int id, bool with_kpe, uint64_t* bar) {
  const int64_t row = static_cast<int64_t>(id / kPageSize) * kPageSize + id % kPageSize;
  ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst, ckv + row * kCkvBytes, kCkvBytes, bar);
  if (with_kpe) ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, dst + kCkvBytes, kpe + row * kKpeBytes, kKpeBytes, bar);
}

// Per program, when `landing` is set (bulk mode): kLandingSlots int64, see LandingSlot.
enum LandingSlot : int { kLandingSm = 0, kLandingEntryNs, kLandingEntryCycles, kLandingLandedCycles, kLandingLandedNs, kLandingSlots };

__device__ __forceinline__ int64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return static_cast<int64_t>(ns);
}

__device__ __forceinline__ int sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return static_cast<int>(id);
}

__global__ void __launch_bounds__(kThreads) bulk_gather(const uint8_t* ckv, const uint8_t* kpe, const int32_t* indices, int splits, bool with_kpe,
                                                        int32_t* sink, int64_t* landing) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int s = blockIdx.x, t = blockIdx.y;
  int64_t* stamp = landing == nullptr ? nullptr : landing + (static_cast<int64_t>(t) * splits + s) * kLandingSlots;
  if (stamp != nullptr && threadIdx.x == 0) {
    stamp[kLandingSm] = sm_id();
    stamp[kLandingEntryNs] = global_ns();
    stamp[kLandingEntryCycles] = clock64();
  }
  const int rows = kTopK / splits;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + rows * kRowBytes);
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(bar, kThreads);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    const int id = indices[t * kTopK + r * splits + s];
    if (id < 0) continue;
    ptx::mbarrier_expect_tx(ptx::sem_relaxed, ptx::scope_cta, ptx::space_shared, bar, with_kpe ? kRowBytes : kCkvBytes);
    copy_rows(smem + r * kRowBytes, ckv, kpe, id, with_kpe, bar);
  }
  ptx::mbarrier_arrive(bar);
  while (!ptx::mbarrier_try_wait_parity(bar, 0)) {
  }
  if (threadIdx.x == 0) sink[t * splits + s] = *reinterpret_cast<const int32_t*>(smem);
  if (stamp != nullptr && threadIdx.x == 0) {
    stamp[kLandingLandedCycles] = clock64();
    stamp[kLandingLandedNs] = global_ns();
  }
}

__global__ void __launch_bounds__(kThreads) rows_gather(const uint8_t* ckv, const uint8_t* kpe, const int32_t* indices, int splits, bool with_kpe,
                                                        bool pause, int32_t* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int s = blockIdx.x, t = blockIdx.y;
  const int rows = kTopK / splits;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + rows * kRowBytes);
  if (threadIdx.x == 0) {
    for (int r = 0; r < rows; ++r) ptx::mbarrier_init(bars + r, 1);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  __syncthreads();
  bool pending = false;
  const int r = threadIdx.x;  // one row per thread (rows <= kThreads)
  if (r < rows) {
    const int id = indices[t * kTopK + r * splits + s];
    if (id >= 0) {
      pending = true;
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bars + r, with_kpe ? kRowBytes : kCkvBytes);
      copy_rows(smem + r * kRowBytes, ckv, kpe, id, with_kpe, bars + r);
    }
  }
  while (__syncthreads_count(pending && !ptx::mbarrier_test_wait_parity(bars + r, 0)) > 0) {
    if (pause) __nanosleep(kPollPauseNs);
  }
  if (threadIdx.x == 0) sink[t * splits + s] = *reinterpret_cast<const int32_t*>(smem);
}

__global__ void __launch_bounds__(kThreads) ldg_gather(const uint8_t* ckv, const uint8_t* kpe, const int32_t* indices, int splits, bool with_kpe,
                                                       int32_t* sink) {
  __shared__ int32_t ids[kTopK];
  const int s = blockIdx.x, t = blockIdx.y;
  const int rows = kTopK / splits;
  for (int r = threadIdx.x; r < rows; r += kThreads) ids[r] = indices[t * kTopK + r * splits + s];
  __syncthreads();
  const int chunks_per_row = (with_kpe ? kRowBytes : kCkvBytes) / 16;
  const int chunks = rows * chunks_per_row;
  uint32_t sum = 0;
  for (int c0 = threadIdx.x; c0 < chunks; c0 += kThreads * kLoadsInFlight) {
    uint4 v[kLoadsInFlight];
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) {
      const int c = c0 + k * kThreads;
      v[k] = make_uint4(0, 0, 0, 0);
      if (c >= chunks) continue;
      const int r = c / chunks_per_row, part = c % chunks_per_row;
      const int id = ids[r];
      if (id < 0) continue;
      const uint8_t* src = part < kCkvBytes / 16 ? ckv + static_cast<int64_t>(id) * kCkvBytes + part * 16
                                                 : kpe + static_cast<int64_t>(id) * kKpeBytes + (part - kCkvBytes / 16) * 16;
      v[k] = __ldcg(reinterpret_cast<const uint4*>(src));
    }
#pragma unroll
    for (int k = 0; k < kLoadsInFlight; ++k) sum ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (sum == 0x9e3779b9u) sink[t * splits + s] = sum;  // practically never: keeps the loads
}

}  // namespace gather_floor

#ifdef TORCH_EXTENSION_NAME
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>

namespace {

using namespace gather_floor;

constexpr int kMaxSharedBytes = 227 * 1024;  // dynamic shared memory one block may opt in to on sm_90

void gather(torch::Tensor ckv, torch::Tensor kpe, torch::Tensor indices, int64_t splits, const std::string& mode, bool with_kpe,
            torch::Tensor sink, std::optional<torch::Tensor> landing) {
  TORCH_CHECK(indices.dim() == 2 && indices.size(1) == kTopK && indices.is_contiguous() && indices.scalar_type() == at::kInt,
              "indices: [T, 2048] contiguous int32");
  TORCH_CHECK(kTopK % splits == 0 && splits >= 1, "splits must divide 2048");
  TORCH_CHECK(sink.numel() >= indices.size(0) * splits, "sink too small");
  TORCH_CHECK(!landing || mode == "bulk", "landing stamps are taken in bulk mode only");
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(indices.size(0)));
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto* ckv_bytes = reinterpret_cast<const uint8_t*>(ckv.data_ptr());
  const auto* kpe_bytes = reinterpret_cast<const uint8_t*>(kpe.data_ptr());
  if (mode == "rows" || mode == "rows_sleep") {
    const int rows = static_cast<int>(kTopK / splits);
    const int smem = rows * (kRowBytes + static_cast<int>(sizeof(uint64_t)));  // the rows, then their mbarriers
    TORCH_CHECK(rows <= kThreads && smem <= kMaxSharedBytes, "rows mode: ", rows, " rows do not fit");
    cudaFuncSetAttribute(rows_gather, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    rows_gather<<<grid, kThreads, smem, stream>>>(ckv_bytes, kpe_bytes, indices.data_ptr<int32_t>(), static_cast<int>(splits), with_kpe,
                                                  mode == "rows_sleep", sink.data_ptr<int32_t>());
  } else if (mode == "bulk") {
    TORCH_CHECK(!landing || (landing->is_cuda() && landing->scalar_type() == at::kLong && landing->is_contiguous() &&
                             landing->numel() >= indices.size(0) * splits * kLandingSlots),
                "landing: contiguous int64 CUDA tensor of T * splits * ", static_cast<int>(kLandingSlots), " stamps");
    const int smem = static_cast<int>(kTopK / splits) * kRowBytes + static_cast<int>(sizeof(uint64_t));  // the rows, then the mbarrier
    TORCH_CHECK(smem <= kMaxSharedBytes, "bulk mode: ", kTopK / splits, " rows do not fit in shared memory");
    cudaFuncSetAttribute(bulk_gather, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    bulk_gather<<<grid, kThreads, smem, stream>>>(ckv_bytes, kpe_bytes, indices.data_ptr<int32_t>(), static_cast<int>(splits), with_kpe,
                                                  sink.data_ptr<int32_t>(), landing ? landing->data_ptr<int64_t>() : nullptr);
  } else if (mode == "ldg") {
    ldg_gather<<<grid, kThreads, 0, stream>>>(ckv_bytes, kpe_bytes, indices.data_ptr<int32_t>(), static_cast<int>(splits), with_kpe,
                                              sink.data_ptr<int32_t>());
  } else {
    TORCH_CHECK(false, "mode must be bulk, rows, rows_sleep or ldg, got ", mode);
  }
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, "gather launch: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gather", &gather, "gather-only kernel (see benchmarks/kernels/gather_floor.cu)", pybind11::arg("ckv"), pybind11::arg("kpe"), pybind11::arg("indices"),
        pybind11::arg("splits"), pybind11::arg("mode"), pybind11::arg("with_kpe"), pybind11::arg("sink"), pybind11::arg("landing") = pybind11::none());
  m.attr("LANDING_SLOTS") = static_cast<int>(kLandingSlots);
}
#endif  // TORCH_EXTENSION_NAME
