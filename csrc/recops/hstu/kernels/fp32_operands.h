// fp32 operands of the HSTU-family tile products, laid out per thread. gemm_nn (oneDNN's brgemm
// micro-kernel, common/blas.h) multiplies untransposed row-major operands only, while the kernels
// multiply by K^T and V^T (scores Q K^T, dO V^T): a thread keeps the transposed key rows of the
// sequence it works on (SequenceTransposes), laid out as its blocks first need them. A work item's
// query blocks run in order and a causal block sees the keys of the block before it and more, so
// each key is transposed once per item, into a copy that stays in the thread's cache for the
// item's blocks (laid out for the whole batch before the blocks ran, the copies of K and V went
// out to memory and came back: 7% of a training step's attention at N = 200). The leading
// dimension, the maximum length N (one granule more where rows N apart would share the cache's
// sets: common/blas.h's unaliased_ld), stays the same from batch to batch, as gemm_nn's kernel
// cache wants.
#pragma once

#include <cstdint>
#include <memory>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/batch.h"

namespace recops::attention::kernels {

// One sequence's rows of `src` ([rows, H, d], all heads), transposed: [H * d, ld], head h's first
// row at h * d * ld, column j the sequence's key j. Columns are laid out on demand (columns()), so
// that only the keys the thread's blocks read are moved.
template <typename T>
class SequenceTransposes {
 public:
  SequenceTransposes(const Sequences& seqs, const Rows<T>& src, int64_t heads, int64_t d,
                     const TileOps<T>& passes)
      : seqs_(seqs),
        src_(src),
        cols_(heads * d),
        d_(d),
        ld_(unaliased_ld(seqs.longest)),
        passes_(passes),
        data_(new T[cols_ * ld_]) {}

  // Column key0 of head h's rows for sequence b, with columns [key0, key0 + keys) laid out.
  const T* columns(int64_t b, int64_t h, int64_t key0, int64_t keys) {
    const int64_t end = key0 + keys;
    if (b != sequence_ || key0 < begin_ || key0 > end_) {
      // Another sequence, or keys apart from the ones laid out: start again from key0.
      sequence_ = b;
      begin_ = end_ = key0;
    }
    if (end > end_) {
      seqs_.keys.for_each_run(b, end_, end - end_, [&](int64_t row, int64_t key, int64_t n) {
        passes_.transpose(src_.at(row, 0, 0), n, cols_, src_.stride, data_.get() + key, ld_);
      });
      end_ = end;
    }
    return data_.get() + h * d_ * ld_ + key0;
  }
  int64_t ld() const { return ld_; }

 private:
  const Sequences& seqs_;
  Rows<T> src_;
  int64_t cols_, d_, ld_;
  const TileOps<T>& passes_;
  std::unique_ptr<T[]> data_;                    // uninitialised: only laid-out columns are read
  int64_t sequence_ = -1, begin_ = 0, end_ = 0;  // columns [begin_, end_) of sequence_ hold keys
};

}  // namespace recops::attention::kernels
