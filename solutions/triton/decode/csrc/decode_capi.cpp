// C ABI of the hand-written SM90 sparse MLA decode, loaded by decode/cuda.py through ctypes.
//
// Plain C++ over the CUDA runtime (no torch, no pybind11). It takes device pointers, strides in
// elements, the record geometry in bytes, the caller's stream and device, and returns 0, a
// cudaError_t value (> 0), or one of the argument errors below (< 0); dsa_decode_error_string
// names any of them. decode/cuda.py checks every argument before the call; the checks here only
// guard what this file hands on to the launcher.
#include <cstdint>
#include <limits>

#include <cuda_runtime_api.h>

#include "decode_sm90.h"
#include "../../common/csrc/capi.h"

namespace {

enum ArgumentError : int {
  kBadFormat = -1,
  kBadHeads = -2,
  kBadSplits = -3,
  kTooLarge = -4,
  kMisaligned = -5,
  kNullPointer = -6,
  kBadWholeTokens = -7,
  kBadTickets = -8,
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// Constants of decode_sm90.h, which decode/cuda.py compares with its own (and with the record
// geometry of dsa_bench.definitions.kv_records) on load.
DSA_EXPORT const int64_t dsa_decode_HEADS_PER_PROGRAM = dsa_decode::kHeadsPerProgram;
DSA_EXPORT const int64_t dsa_decode_TILE_TOKENS = dsa_decode::kTileTokens;
DSA_EXPORT const int64_t dsa_decode_D_V = dsa_decode::kDv;
DSA_EXPORT const int64_t dsa_decode_STAGES = dsa_decode::kStages;
DSA_EXPORT const int64_t dsa_decode_MAX_SPLITS = dsa_decode::kMaxSplits;
DSA_EXPORT const int64_t dsa_decode_PARTIAL_SCALES = dsa_decode::kPartialScales;
DSA_EXPORT const int64_t dsa_decode_SMALL_PARTIAL_SCALES_PER_16 = dsa_decode::kSmallPartialScalesPer16;
DSA_EXPORT const int64_t dsa_decode_TICKET_STRIDE = dsa_decode::kTicketStride;
DSA_EXPORT const int64_t dsa_decode_TICKETS_PER_CALL = dsa_decode::kTicketsPerCall;
DSA_EXPORT const int64_t dsa_decode_V32_D_QK = dsa_decode::kV32Dims.d_qk;
DSA_EXPORT const int64_t dsa_decode_V32_QUANT_DIMS = dsa_decode::kV32Dims.quant_dims;
DSA_EXPORT const int64_t dsa_decode_V32_SCALE_TILE = dsa_decode::kV32Dims.scale_tile;
DSA_EXPORT const int64_t dsa_decode_V4_D_QK = dsa_decode::kV4Dims.d_qk;
DSA_EXPORT const int64_t dsa_decode_V4_QUANT_DIMS = dsa_decode::kV4Dims.quant_dims;
DSA_EXPORT const int64_t dsa_decode_V4_SCALE_TILE = dsa_decode::kV4Dims.scale_tile;

DSA_EXPORT const char* dsa_decode_error_string(int code) {
  switch (code) {
    case kBadFormat: return "format must be 0 (V3.2) or 1 (V4)";
    case kBadHeads: return "h_q must be 16, 32 or a positive multiple of HEADS_PER_PROGRAM";
    case kBadSplits: return "splits must be in [1, MAX_SPLITS]";
    case kTooLarge: return "problem too large for the grid or 32-bit indexing";
    case kMisaligned: return "q, the cache, its page stride and the record rows must be 16-byte aligned, the scales 8-byte";
    case kNullPointer: return "null tensor pointer";
    case kBadWholeTokens: return "whole_tokens must be in [0, batch * s_q]";
    case kBadTickets: return "the in-launch combine (tickets) needs splits dividing TICKETS_PER_CALL";
    default: return code >= 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown argument error";
  }
}

// Shapes: decode_sm90.h (DecodeArgs). q and out are bf16 as their bits. topk_length and sink may
// be null, and the partials' scratch (part_out fp16, part_scale, part_lse) when no token is split
// (splits == 1 or whole_tokens == batch * s_q). tickets: null for the combine kernel, else the
// in-launch combine's ticket words (DecodeArgs; a grid of more programs than SMs is refused with
// cudaErrorInvalidConfiguration).
DSA_EXPORT int dsa_decode_launch(int device, void* stream, int format,
                                 const void* q, int64_t q_stride_b, int64_t q_stride_s, int64_t q_stride_h,
                                 const void* cache, int64_t page_stride, int64_t block_size,
                                 int64_t data_slot_bytes, int64_t scale_base, int64_t scale_slot_bytes, int64_t rope_offset,
                                 const int32_t* indices, int64_t idx_stride_b, int64_t idx_stride_s,
                                 const int32_t* topk_length, const float* sink,
                                 void* out, int64_t out_stride_b, int64_t out_stride_s, int64_t out_stride_h,
                                 float* lse, int64_t lse_stride_b, int64_t lse_stride_s, int64_t lse_stride_h,
                                 void* part_out, float* part_scale, float* part_lse, unsigned* tickets,
                                 int64_t batch, int64_t s_q, int64_t h_q, int64_t topk, int64_t splits, int64_t whole_tokens,
                                 double scale_log2) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  constexpr int64_t kGridMax = 65535;
  if (format != dsa_decode::kFormatV32 && format != dsa_decode::kFormatV4) return kBadFormat;
  const bool small_heads = h_q == dsa_decode::kSmallHeads[0] || h_q == dsa_decode::kSmallHeads[1];
  if (!small_heads && (h_q <= 0 || h_q % dsa_decode::kHeadsPerProgram != 0 || h_q / dsa_decode::kHeadsPerProgram > kGridMax)) return kBadHeads;
  if (splits < 1 || splits > dsa_decode::kMaxSplits) return kBadSplits;
  if (whole_tokens < 0 || whole_tokens > batch * s_q) return kBadWholeTokens;
  if (tickets != nullptr && dsa_decode::kTicketsPerCall % splits != 0) return kBadTickets;
  const bool any_split = splits > 1 && whole_tokens < batch * s_q;
  if (batch < 0 || s_q < 0 || topk < 0 || topk > kIntMax || whole_tokens + (batch * s_q - whole_tokens) * splits > kGridMax || block_size < 1 || block_size > kIntMax ||
      data_slot_bytes > kIntMax || scale_base > kIntMax || scale_slot_bytes > kIntMax || rope_offset > kIntMax)
    return kTooLarge;
  if (batch * s_q == 0) return 0;
  if (q == nullptr || cache == nullptr || indices == nullptr) return kNullPointer;
  if (out == nullptr || lse == nullptr || (any_split && (part_out == nullptr || part_scale == nullptr || part_lse == nullptr))) return kNullPointer;
  if (!aligned16(q) || !aligned16(cache) || page_stride % 16 != 0 || data_slot_bytes % 16 != 0 || rope_offset % 16 != 0 ||
      scale_base % 8 != 0 || scale_slot_bytes % 8 != 0)
    return kMisaligned;

  const dsa_capi::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  dsa_decode::DecodeArgs a{};
  a.q = static_cast<const uint16_t*>(q);
  a.q_stride_b = q_stride_b;
  a.q_stride_s = q_stride_s;
  a.q_stride_h = q_stride_h;
  a.cache = static_cast<const uint8_t*>(cache);
  a.page_stride = page_stride;
  a.block_size = static_cast<int>(block_size);
  dsa_decode::block_magic_for(a.block_size, &a.block_magic, &a.block_shift);
  a.data_slot_bytes = static_cast<int>(data_slot_bytes);
  a.scale_base = static_cast<int>(scale_base);
  a.scale_slot_bytes = static_cast<int>(scale_slot_bytes);
  a.rope_offset = static_cast<int>(rope_offset);
  a.indices = indices;
  a.idx_stride_b = idx_stride_b;
  a.idx_stride_s = idx_stride_s;
  a.topk_length = topk_length;
  a.sink = sink;
  a.out = static_cast<uint16_t*>(out);
  a.out_stride_b = out_stride_b;
  a.out_stride_s = out_stride_s;
  a.out_stride_h = out_stride_h;
  a.lse = lse;
  a.lse_stride_b = lse_stride_b;
  a.lse_stride_s = lse_stride_s;
  a.lse_stride_h = lse_stride_h;
  a.part_out = static_cast<uint16_t*>(part_out);
  a.part_scale = part_scale;
  a.part_lse = part_lse;
  a.tickets = tickets;
  a.batch = static_cast<int>(batch);
  a.s_q = static_cast<int>(s_q);
  a.h_q = static_cast<int>(h_q);
  a.topk = static_cast<int>(topk);
  a.splits = static_cast<int>(splits);
  a.whole_tokens = static_cast<int>(whole_tokens);
  a.scale_log2 = static_cast<float>(scale_log2);
  a.format = format;
  return static_cast<int>(dsa_decode::launch_decode(a, static_cast<cudaStream_t>(stream)));
}
