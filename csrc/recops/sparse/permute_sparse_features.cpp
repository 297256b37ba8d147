// permute_sparse_features (FBGEMM's schema and semantics, docs/ops.md section 1): the feature
// permutation of a [T, B] lengths matrix with its indices and weights, as permute_2D_sparse_data
// does it, for lengths and indices of one index dtype. Runs permute.cpp's permutation.
#include "recops/common/checks.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {

PermutedSparse permute_sparse_features(const at::Tensor& permute, const at::Tensor& lengths,
                                       const at::Tensor& indices,
                                       const std::optional<at::Tensor>& weights) {
  check_cpu(lengths, "lengths");
  check_cpu(indices, "indices");
  check_dim(lengths, 2, "lengths");
  check_index_dtype(lengths, "lengths");
  check_same_dtype(lengths, "lengths", indices, "indices");
  return permute_sparse_segments(permute, lengths.contiguous(), indices, weights, std::nullopt);
}

}  // namespace recops::sparse
