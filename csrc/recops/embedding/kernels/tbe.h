// Torch-free interface of the table-batched embedding (TBE) kernels (docs/ops.md section 7): plain
// structs of raw pointers and sizes, and one table of entry points per instruction-set variant.
// The variants (variant_baseline.cpp, variant_avx2.cpp, variant_avx512.cpp) compile the same
// templates of kernels/variant.h for each instruction set; tbe_kernels() picks the one to call.
//
// This header also includes every external header the variants use, so that a variant includes
// them all before switching the instruction set (see common/cpu_isa.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "recops/common/cpu_isa.h"
#include "recops/common/half_bits.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/common/prefetch.h"
#include "recops/common/streaming.h"
#include "recops/embedding/kernels/optimizer_table.h"
#include "recops/embedding/kernels/quantized_tables.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>
#endif

namespace recops::embedding::kernels {

enum class Pooling : int64_t { kSum = 0, kMean = 1, kNone = 2 };  // FBGEMM's PoolingMode values
// FBGEMM's WeightDecayMode values; 3 is its CounterWeightDecayMode ADAGRADW, which only the counter
// optimizer reads (its weight_decay_mode is CounterWeightDecayMode, whose 0-2 are these).
enum class WeightDecay : int64_t { kNone = 0, kL2 = 1, kDecouple = 2, kAdagradW = 3 };
// FBGEMM's WeightDecayMode of the counter optimizer's regularization.
enum class CounterRegularization : int64_t { kCounter = 3, kCowClip = 4 };
// FBGEMM's INT8 rows ("fused 8-bit rowwise"): D uint8 codes, then a float32 scale and a float32
// bias (kInt8RowTail bytes), element d being scale * code[d] + bias. Looked up only: FBGEMM's CPU
// module has no INT8 backward either.
struct Int8Rowwise {
  uint8_t code;
};
constexpr int64_t kInt8RowTail = 2 * sizeof(float);

// Elements of one stored row of dim D.
template <typename weight_t>
constexpr int64_t stored_row_size(int64_t D) {
  return std::is_same_v<weight_t, Int8Rowwise> ? D + kInt8RowTail : D;
}

// Features (FBGEMM's T) and where each one's table lives. Features sharing a table have equal
// weights_offsets (and equal D, rows and optimizer-state offsets).
//
// Every feature has batch_size bags and the pooled output is [B, total_D], unless the batch size
// varies by feature (FBGEMM's variable batch size, "VBE"): then feature t has the bags
// [bag_offsets[t], bag_offsets[t + 1]), batch_size is the largest feature's count, and the pooled
// output is flat, bag k's row starting at element output_offsets[k].
struct FeatureLayout {
  int64_t num_features = 0;  // T
  int64_t batch_size = 0;    // B
  int64_t total_D = 0;       // width of the pooled output
  int64_t max_D = 0;
  const int32_t* D_offsets = nullptr;  // [T + 1]: feature t owns columns [D_offsets[t], [t+1])
  const int64_t* weights_offsets = nullptr;  // [T]: first element of feature t's table
  const int64_t* rows = nullptr;             // [T]: rows of feature t's table
  const int64_t* bag_offsets = nullptr;      // [T + 1] with a variable batch size, else null
  const int64_t* output_offsets = nullptr;   // [bags] with a variable batch size, else null

  // Bag b of feature t is bag first_bag(t) + b of the batch.
  int64_t first_bag(int64_t t) const {
    return bag_offsets != nullptr ? bag_offsets[t] : t * batch_size;
  }
  int64_t bags_of(int64_t t) const { return first_bag(t + 1) - first_bag(t); }
  int64_t num_bags() const { return first_bag(num_features); }
  // The element where bag b of feature t starts in the pooled output.
  int64_t output_offset(int64_t t, int64_t b) const {
    return output_offsets != nullptr ? output_offsets[first_bag(t) + b]
                                     : b * total_D + D_offsets[t];
  }
};

// One batch: bag k = first_bag(t) + b of feature t is indices[offsets[k], offsets[k + 1]).
// Offsets are validated (non-decreasing, within indices) before a kernel runs; indices are
// checked against their table's rows by the kernels themselves.
struct Bags {
  IndexKind index_kind = IndexKind::kInt64;
  const void* indices = nullptr;
  const void* offsets = nullptr;  // [bags + 1]
  int64_t num_indices = 0;
  const float* per_sample_weights = nullptr;  // [num_indices], or null
  Pooling pooling = Pooling::kSum;
};

struct ForwardArgs {
  FeatureLayout layout;
  Bags bags;
  FloatKind weights_kind = FloatKind::kFloat;
  bool int8_weights = false;  // Int8Rowwise rows (weights_kind unused)
  const void* weights = nullptr;
  FloatKind out_kind = FloatKind::kFloat;
  void* out = nullptr;  // pooled: see FeatureLayout; [num_indices, max_D] for Pooling::kNone
};

// FBGEMM's quantized inference lookup (int_nbit_split_embedding_codegen_lookup_function): the
// layout's weights_offsets are not read (tables.tables holds each feature's first row).
struct QuantizedForwardArgs {
  FeatureLayout layout;
  Bags bags;
  QuantizedTables tables;
  FloatKind out_kind = FloatKind::kFloat;
  void* out = nullptr;  // pooled: see FeatureLayout; [num_indices, max_D] for Pooling::kNone
};

// Gradient of the per-sample weights: grad[i] = <clip(grad_output row of i's bag), row of i>,
// divided by the bag length for MEAN pooling.
struct SampleWeightsGradArgs {
  FeatureLayout layout;
  Bags bags;
  FloatKind weights_kind = FloatKind::kFloat;
  const void* weights = nullptr;
  const float* grad_output = nullptr;              // fp32, the forward output's shape
  float max_gradient = 0;                          // clip bound; +inf for none
  const int32_t* feature_requires_grad = nullptr;  // [T] (0: gradient 0), or null for all
  float* grad = nullptr;                           // [num_indices]
};

struct OptimizerParams {
  float learning_rate = 0;
  float eps = 0;
  float weight_decay = 0;
  WeightDecay weight_decay_mode = WeightDecay::kNone;
  // The Adam family: the moments' decay rates and their bias corrections 1 - beta^iter.
  float beta1 = 0;
  float beta2 = 0;
  float bias_correction1 = 1;
  float bias_correction2 = 1;
  // Rowwise RMSprop-AR: the step being taken (stored in prev_iter, fp32 as FBGEMM keeps it), the
  // second moment's decay, and the staleness shrink's coefficient and floor.
  float iter = 1;
  float ema_beta = 0;
  float ar_alpha = 0;
  float min_shrinkage = 0;
  // Rowwise Adagrad with counter (FBGEMM's rowwise_adagrad_with_counter; the formulas are at its
  // Step<> in optimizers.h): the regularization, the counter's half-life, the step after which
  // adjustments start (<= 0: from the first), the learning-rate mode (FBGEMM's LearningRateMode,
  // -1 to 2) with its exponent adjustment_ub, the largest count max_counter, the count a row must
  // exceed for its learning rate to be adjusted, and CowClip's weight-norm coefficient and floor.
  struct Counter {
    CounterRegularization regularization = CounterRegularization::kCounter;
    float halflife = -1;
    float adjustment_iter = -1;
    float adjustment_ub = 1;
    int64_t learning_rate_mode = -1;
    float max_counter = 1;
    float tail_id_threshold = 0;
    float weight_norm_coefficient = 0;
    float lower_bound = 0;
  } counter;
};

// The fused backward: sums the gradient of every occurrence of each (table, row) over all bags
// and features, then applies one optimizer step per unique row, in place.
struct UpdateArgs {
  FeatureLayout layout;
  Bags bags;
  const float* grad_output = nullptr;  // fp32, the forward output's shape
  float max_gradient = 0;              // elementwise clip bound on grad_output; +inf for none
  FloatKind weights_kind = FloatKind::kFloat;
  void* weights = nullptr;
  // Optimizer-state buffers (the optimizer's row names them; null where it has none) and, for
  // each, [T]: the first element of feature t's table in it.
  float* state[kMaxStates] = {};
  const int64_t* state_offsets[kMaxStates] = {};
  Optimizer optimizer = Optimizer::kSgd;
  OptimizerParams params;
};

// Entry points of one instruction-set variant. Each returns -1, or the position of the first
// index outside its table (an index of -1 is not, for quantized_forward); then nothing was written
// to weights or state (forward and the sample-weight gradient leave that row out of their output).
struct TbeKernels {
  int64_t (*forward)(const ForwardArgs&);
  int64_t (*sample_weights_grad)(const SampleWeightsGradArgs&);
  int64_t (*exact_update)(const UpdateArgs&);
  int64_t (*quantized_forward)(const QuantizedForwardArgs&);
};

RECOPS_DECLARE_VARIANT_TABLE(TbeKernels, kTbeKernels)

inline const TbeKernels& tbe_kernels(CpuIsa isa) {
  return RECOPS_VARIANT_TABLE(isa, kTbeKernels);
}

}  // namespace recops::embedding::kernels
