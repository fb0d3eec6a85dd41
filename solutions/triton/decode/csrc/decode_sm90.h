// Host-side interface of the hand-written SM90 sparse MLA decode over FP8 KV records (plain
// C++; no kernels, no torch). Shared by the kernels (config.cuh, launch_sm90.cu) and
// decode_capi.cpp (the C ABI that decode/cuda.py calls through ctypes).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsa_decode {

constexpr int kHeadsPerProgram = 64;  // query heads of one program: the M of every wgmma
constexpr int kTileTokens = 64;       // records gathered, dequantized and attended together
constexpr int kDv = 512;              // value and output width of every format
constexpr int kStages = 2;            // dequantized record tiles in shared memory
constexpr int kMaxSplits = 32;        // programs sharing one (query token, head block)
constexpr int kSmallHeads[] = {16, 32};  // the head counts of the 16/32-head kernel (mma.sync, M = 16)
constexpr int kSmallPartialScalesPer16 = 256;  // its part_scale entries per 16 heads: one per consumer thread
constexpr int kPartialScales = 256;   // part_scale entries per split partial: one per consumer thread
// The in-launch combine's ticket words (DecodeArgs::tickets): one per split unit, kTicketStride words
// apart (no two share a 128-byte line); a call advances each of its units' words by kTicketsPerCall in
// all, so the split count must divide it (the Triton kernel's words: the same constants).
constexpr int kTicketStride = 32;
constexpr unsigned kTicketsPerCall = 64;

// Record formats this kernel reads (the dims; the byte geometry comes from DecodeArgs).
enum Format : int { kFormatV32 = 0, kFormatV4 = 1 };

// Dims of a format's K row: quant_dims FP8 e4m3 dims with one scale per scale_tile dims
// (fp32 or UE8M0), then rope_dims bf16 dims; d_qk = quant_dims + rope_dims. V is the first kDv dims.
struct FormatDims {
  int d_qk, quant_dims, rope_dims, scale_tile, num_scales;
  bool fp32_scales;
};
constexpr FormatDims kV32Dims{512 + 64, 512, 64, 128, 4, true};
constexpr FormatDims kV4Dims{448 + 64, 448, 64, 64, 7, false};
static_assert(kV32Dims.d_qk == kV32Dims.quant_dims + kV32Dims.rope_dims && kV4Dims.d_qk == kV4Dims.quant_dims + kV4Dims.rope_dims,
              "a K row is its FP8 dims, then its RoPE dims");

struct DecodeArgs {
  const uint16_t* q;  // [b, s_q, h_q, d_qk] bf16 bits; strides in elements, rows 16-byte aligned
  int64_t q_stride_b, q_stride_s, q_stride_h;
  const uint8_t* cache;  // [num_blocks, block_size, 1, bytes_per_token]; page base and stride 16-byte aligned
  int64_t page_stride;   // bytes
  int block_size;
  // The page of a valid id n (0 <= n < 2^31) without a division: n / block_size ==
  // (n * block_magic) >> block_shift (a 64-bit product), block_magic_for() below.
  uint32_t block_magic;
  int block_shift;
  // Where a token's bytes are inside its page (decode/shapes.py, RecordGeometry):
  // data row = page + slot * data_slot_bytes, scales = page + scale_base + slot * scale_slot_bytes,
  // RoPE = data row + rope_offset.
  int data_slot_bytes, scale_base, scale_slot_bytes, rope_offset;
  const int32_t* indices;  // [b, s_q, topk] physical ids, -1 invalid; unit stride along topk
  int64_t idx_stride_b, idx_stride_s;
  const int32_t* topk_length;  // [b] or null
  const float* sink;           // [h_q] or null
  uint16_t* out;               // [b, s_q, h_q, kDv] bf16 bits
  int64_t out_stride_b, out_stride_s, out_stride_h;
  float* lse;  // [b, s_q, h_q] natural log
  int64_t lse_stride_b, lse_stride_s, lse_stride_h;
  // (h_q 16 and 32: one unit of h_q heads per query token, h_q / 16 * kSmallPartialScalesPer16 scales
  // per partial, in the 16/32-head consumers' fragment order: config.cuh, PartialsM16.)
  // The schedule: query tokens 0 .. whole_tokens - 1 take one program per head block (their whole
  // index rows); each later token t takes `splits` programs per head block (split s: positions
  // s, s + splits, ...). Grid (head_blocks, 1, whole_tokens + (b * s_q - whole_tokens) * splits),
  // the split tokens' programs last, so they fill the SMs the whole rows leave idle at the end.
  // splits > 1: partial (unit * splits + split) of split unit ((t - whole_tokens) * head_blocks + head block):
  // part_out [.., kHeadsPerProgram, kDv] fp16 bits in the consumers' fragment order = output / l
  // / part_scale, part_scale [.., kPartialScales] fp32 (per consumer thread: its largest |output / l| over
  // 2^14), part_lse [.., kHeadsPerProgram] = m + log2 l (-inf for a split without a valid id);
  // scratch the combine kernel reads. fp16 keeps 11 bits of every element (bf16 8: cancelling
  // partials then missed 1e-2), the scale its range.
  uint16_t* part_out;
  float* part_scale;
  float* part_lse;
  // Null: the combine kernel merges the partials in a second launch. Else the split programs merge
  // them themselves behind a ticket barrier (combine.cuh, arrive_and_combine): the split unit u's word
  // at tickets[u * kTicketStride], zeroed once and left to the calls (each leaves it on a multiple of
  // kTicketsPerCall); the whole grid must be resident at once (the launcher refuses a grid of more
  // programs than SMs) and splits must divide kTicketsPerCall.
  unsigned* tickets;
  int batch, s_q, h_q, topk, splits, whole_tokens;
  float scale_log2;  // sm_scale * log2(e)
  int format;        // a Format
};

// block_shift = 31 + ceil(log2 d) and block_magic = ceil(2^block_shift / d) (below 2^32) for a block
// size d >= 1: with e = block_magic * d - 2^block_shift < d <= 2^(block_shift - 31), every n < 2^31
// has n * e < 2^block_shift, so the product's floor is exactly floor(n / d).
inline void block_magic_for(int d, uint32_t* magic, int* shift) {
  int c = 0;
  while ((int64_t{1} << c) < d) ++c;
  *shift = 31 + c;
  const unsigned __int128 power = static_cast<unsigned __int128>(1) << *shift;
  *magic = static_cast<uint32_t>((power + static_cast<unsigned __int128>(d) - 1) / static_cast<unsigned __int128>(d));
}

// Launches the decode on `stream` (with splits > 1 and no tickets followed by its combine); returns
// the first launch error (cudaSuccess when fine; cudaErrorInvalidConfiguration for tickets with a grid
// of more programs than the device has SMs).
cudaError_t launch_decode(const DecodeArgs& args, cudaStream_t stream);
// The same for h_q 16 or 32 (kSmallHeads): the 16/32-head kernel (launch_m16.cu); launch_decode
// calls it for those head counts.
cudaError_t launch_decode_m16(const DecodeArgs& args, cudaStream_t stream);

}  // namespace dsa_decode
