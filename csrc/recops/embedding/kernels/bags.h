// Parallel iteration over the bags of a batch: work items are (feature, chunk of its bags), with
// chunks sized so one item moves about kTargetBytesPerTask. Compiled per instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/convert.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// Indices read ahead of the current one, so that their rows are in cache when they are needed.
constexpr int64_t kPrefetchDistance = 16;

// A task's fp32 scratch rows, each starting on a 64-byte boundary, plus one row of zeros (all
// zero bits: 0 as fp32, fp16 and bf16 alike).
class ScratchRows {
 public:
  ScratchRows(int64_t num_rows, int64_t row_floats)
      : num_rows_(num_rows),
        stride_((std::max<int64_t>(1, row_floats) + kFloatsPerLine - 1) / kFloatsPerLine *
                kFloatsPerLine),
        storage_(new float[(num_rows + 1) * stride_ + kFloatsPerLine]) {
    std::fill(row(num_rows), row(num_rows) + stride_, 0.0f);
  }

  const float* zeros() { return row(num_rows_); }

  float* row(int64_t i) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.get());
    const uintptr_t aligned = (address + kLineBytes - 1) / kLineBytes * kLineBytes;
    return reinterpret_cast<float*>(aligned) + i * stride_;
  }

 private:
  static constexpr int64_t kLineBytes = 64;
  static constexpr int64_t kFloatsPerLine = kLineBytes / sizeof(float);
  int64_t num_rows_;
  int64_t stride_;
  std::unique_ptr<float[]> storage_;
};

template <typename index_t>
struct TypedBags {
  const index_t* indices;
  const index_t* offsets;
  const float* per_sample_weights;
  int64_t num_indices;
  Pooling pooling;

  explicit TypedBags(const Bags& bags)
      : indices(static_cast<const index_t*>(bags.indices)),
        offsets(static_cast<const index_t*>(bags.offsets)),
        per_sample_weights(bags.per_sample_weights),
        num_indices(bags.num_indices),
        pooling(bags.pooling) {}

  float sample_weight(int64_t p) const {
    return per_sample_weights != nullptr ? per_sample_weights[p] : 1.0f;
  }
  // 1/L for MEAN pooling of a non-empty bag of L indices, else 1.
  float pooling_scale(int64_t length) const {
    return pooling == Pooling::kMean && length > 0 ? 1.0f / static_cast<float>(length) : 1.0f;
  }
};

// Calls fn(scratch, t, b_begin, b_end, continued) -> int64_t (-1 or the first bad position it
// saw) for every work item in parallel, in order within a task; `scratch` holds two rows of max_D
// floats private to the task, `continued` tells that the task's previous item was the same
// feature's preceding chunk (so rows it prefetched ahead are this item's first rows). Returns the
// smallest bad position reported, or -1.
template <typename Fn>
int64_t for_each_bag_chunk(const FeatureLayout& layout, int64_t num_indices,
                           int64_t bytes_per_index, const Fn& fn) {
  const int64_t T = layout.num_features;
  const int64_t B = layout.batch_size;  // the most bags of a feature
  const int64_t bags = layout.num_bags();
  if (T == 0 || bags == 0) return -1;
  const int64_t bytes_per_bag = std::max<int64_t>(1, num_indices * bytes_per_index / bags);
  const int64_t bags_per_chunk = std::min(B, grain_for_bytes(bytes_per_bag));
  const int64_t chunks_per_feature = (B + bags_per_chunk - 1) / bags_per_chunk;
  const int64_t items = T * chunks_per_feature;
  std::vector<int64_t> first_bad(items, -1);
  parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    ScratchRows scratch(2, layout.max_D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / chunks_per_feature;
      const int64_t b_begin = (item % chunks_per_feature) * bags_per_chunk;
      const int64_t b_end = std::min(layout.bags_of(t), b_begin + bags_per_chunk);
      if (b_begin >= b_end) continue;  // past the bags of a feature with fewer (VBE)
      const bool continued = item > begin && b_begin > 0;
      first_bad[item] = fn(scratch, t, b_begin, b_end, continued);
    }
  });
  int64_t bad = -1;
  for (const int64_t p : first_bad) {
    if (p >= 0 && (bad < 0 || p < bad)) bad = p;
  }
  return bad;
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS
