// fp32 operands of the HSTU-family tile products, laid out once per call. gemm_nn (oneDNN's
// brgemm micro-kernel, common/blas.h) multiplies untransposed row-major operands only, while the
// kernels multiply by K^T and V^T (scores Q K^T, dO V^T): KeyValueTransposes holds, per sequence,
// K^T [H, Dqk, ld] and (for backward) V^T [H, Dv, ld], built once per call in parallel: about one
// extra copy of K (and V). The leading dimension, the maximum length N (one granule more where
// rows N apart would share the cache's sets: common/blas.h's unaliased_ld), stays the same from
// batch to batch, as gemm_nn's kernel cache wants.
#pragma once

#include <cstdint>
#include <memory>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"

namespace recops::attention::kernels {

// dst [B, cols, ld] = per sequence b, its key rows of src (rows of `cols` values) transposed by
// the tile passes' transpose (columns past the length are left as they are), sequences split
// between threads.
template <typename T>
void transpose_sequences(const Sequences& seqs, int64_t cols, const Rows<T>& src,
                         const TileOps<T>& passes, T* dst, int64_t ld) {
  parallel_for(0, seqs.count, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      seqs.keys.for_each_run(b, 0, seqs.keys.length[b], [&](int64_t row, int64_t key, int64_t n) {
        passes.transpose(src.at(row, 0, 0), n, cols, src.stride, dst + b * cols * ld + key, ld);
      });
    }
  });
}

template <typename T>
class KeyValueTransposes {
 public:
  // v.data null: no V^T; with_k_t false: no K^T.
  KeyValueTransposes(const Sequences& seqs, int64_t heads, int64_t dqk, int64_t dv,
                     const Rows<T>& k, const Rows<T>& v, const TileOps<T>& passes,
                     bool with_k_t = true)
      : heads_(heads),
        dqk_(dqk),
        dv_(dv),
        ld_(unaliased_ld(seqs.longest)),
        k_t_(with_k_t ? new T[seqs.count * heads * dqk * ld_] : nullptr),
        v_t_(v.data != nullptr ? new T[seqs.count * heads * dv * ld_] : nullptr) {
    if (with_k_t) transpose_sequences(seqs, heads * dqk, k, passes, k_t_.get(), ld_);
    if (v.data != nullptr) transpose_sequences(seqs, heads * dv, v, passes, v_t_.get(), ld_);
  }

  // Column key0 (a key of sequence b) of head h's K^T / V^T (leading dimension ld()). Columns
  // past a sequence's length are never written (nor read).
  const T* k_t(int64_t b, int64_t h, int64_t key0) const {
    return k_t_.get() + ((b * heads_ + h) * dqk_) * ld_ + key0;
  }
  const T* v_t(int64_t b, int64_t h, int64_t key0) const {
    return v_t_.get() + ((b * heads_ + h) * dv_) * ld_ + key0;
  }
  int64_t ld() const { return ld_; }
  bool has_k_t() const { return k_t_ != nullptr; }

 private:
  int64_t heads_, dqk_, dv_, ld_;
  std::unique_ptr<T[]> k_t_, v_t_;  // uninitialised: a zero fill would be a wasted pass
};

}  // namespace recops::attention::kernels
