// What the solution's C ABIs (attention/csrc/attention_capi.cpp, indexer/csrc/topk_capi.cpp,
// decode/csrc/decode_capi.cpp) share: the export macro and a device guard. Plain C++ over the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

// Only the C ABI is exported from a library (it is built with -fvisibility=hidden).
#define DSA_EXPORT extern "C" __attribute__((visibility("default")))

namespace dsa_capi {

// The call's device current for its duration, the previous one restored after (what
// c10::cuda::CUDAGuard did in the torch bindings these files replaced).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) {
      status_ = cudaSetDevice(device);
      switched_ = status_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace dsa_capi
