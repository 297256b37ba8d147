// Row-wise quantization kernels of FBGEMM's fused layouts, torch-free (docs/ops.md section 1):
//
// - 8-bit: each row is its bytes, one per column, then (or, with scale_bias_last = false, before
//   them) a float scale and a float bias (2 * 4 bytes), or two fp16 values where the padding is
//   2-byte; a value is scale * q + bias.
// - N-bit (bit_rate 1..8, 8 / bit_rate values per byte, the first in the low bits): each row is
//   its packed bytes, then an fp16 scale and an fp16 bias.
//
// The results are fbgemm-gpu-cpu's bit for bit: the row's min and max as std::min_element /
// max_element pick them, fp16 bias and scale for N-bit (the codes count from the fp16 minimum),
// codes rounded to nearest even and saturated to [0, 2^bit_rate - 1] (NaN gives 0), and
// dequantized values as the double scale * code + bias rounded to float.
//
// variant_baseline.cpp and variant_avx2.cpp compile the templates of rowwise_variant.h once per
// instruction set (common/cpu_isa.h); rowwise_kernels() picks the table to call. This header
// includes every external header the variants use, so that a variant includes them all before
// switching the instruction set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"

namespace recops::quantize::kernels {

// Bytes of scale and bias behind each row of the two layouts.
constexpr int64_t kScaleBias8Bit = 2 * sizeof(float);
constexpr int64_t kScaleBiasNBit = 2 * sizeof(uint16_t);

inline int64_t values_per_byte(int bit_rate) {
  return 8 / bit_rate;
}

// Quantizes rows x cols values (float or fp16, row-major) into rows x out_cols bytes.
struct QuantizeArgs {
  const void* input;
  FloatKind input_kind;  // kFloat or kHalf
  int64_t rows;
  int64_t cols;
  int bit_rate;  // the N-bit layout only
  uint8_t* output;
};

// Dequantizes rows x in_cols bytes into rows x out_cols values of output_kind (float, fp16 or
// bf16).
struct DequantizeArgs {
  const uint8_t* input;
  int64_t rows;
  int64_t in_cols;
  int bit_rate;           // the N-bit layout only
  bool scale_bias_last;   // the 8-bit layout only
  bool float_scale_bias;  // the 8-bit layout only: 4-byte (float) or 2-byte (fp16) padding
  void* output;
  FloatKind output_kind;
};

struct RowwiseKernels {
  void (*quantize_8bit)(const QuantizeArgs&);
  void (*quantize_nbit)(const QuantizeArgs&);
  void (*dequantize_8bit)(const DequantizeArgs&);
  void (*dequantize_nbit)(const DequantizeArgs&);
};

namespace baseline {
extern const RowwiseKernels kRowwiseKernels;
}
#if RECOPS_X86_VARIANTS
namespace avx2 {
extern const RowwiseKernels kRowwiseKernels;
}
#endif

inline const RowwiseKernels& rowwise_kernels(CpuIsa isa) {
#if RECOPS_X86_VARIANTS
  if (isa >= CpuIsa::kAvx2) return avx2::kRowwiseKernels;
#endif
  return baseline::kRowwiseKernels;
}

}  // namespace recops::quantize::kernels
