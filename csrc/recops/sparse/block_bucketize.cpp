// block_bucketize_sparse_features and its _inference twin, which also returns each id's bucket
// (FBGEMM's schemas and semantics, docs/ops.md section 1): the input distribution of torchrec's
// row-wise sharding. Validates every argument before sizing anything from it (FBGEMM's CPU
// kernel would divide by zero, or write outside its outputs, on several of the inputs rejected
// here), then runs kernels/block_bucketize.h, one kernel for both ops.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <limits>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/sparse/kernels/block_bucketize.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {
namespace {

void check_index_tensor(const at::Tensor& t, const char* name, int64_t dim = 1) {
  check_cpu(t, name);
  check_dim(t, dim, name);
  check_index_dtype(t, name);
}

// Feature t's bags and bucketing rule, checked so that every bucket the kernel computes is below
// my_size and no division is by zero.
template <typename index_t>
std::vector<kernels::FeatureBuckets<index_t>> feature_buckets(
    int64_t num_bags, const at::Tensor& block_sizes, int64_t my_size,
    const std::optional<at::Tensor>& batch_size_per_feature, const std::vector<at::Tensor>& bounds,
    const std::optional<at::Tensor>& total_num_blocks, bool keep_orig_idx,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature) {
  const int64_t T = block_sizes.numel();
  std::vector<kernels::FeatureBuckets<index_t>> features(T);
  int64_t first_bag = 0;
  for (int64_t t = 0; t < T; ++t) {
    kernels::FeatureBuckets<index_t>& f = features[t];
    f.first_bag = first_bag;
    f.num_bags = batch_size_per_feature ? index_at(*batch_size_per_feature, t) : num_bags / T;
    TORCH_CHECK_VALUE(f.num_bags >= 0, "batch_size_per_feature must be >= 0, got ",
                      "batch_size_per_feature[", t, "] = ", f.num_bags);
    first_bag += f.num_bags;
    const int64_t block_size = index_at(block_sizes, t);
    TORCH_CHECK_VALUE(block_size >= 0, "block_sizes must be >= 0, got block_sizes[", t,
                      "] = ", block_size);
    f.block_size = static_cast<index_t>(block_size);
    // The uniform rule cuts the table into total_num_blocks blocks, each bucket owning a run of
    // them; explicit bounds use the block count only to spread ids when block_size is 0.
    const bool uniform = bounds.empty(), spread = !uniform && block_size == 0;
    int64_t global = my_size;
    if (total_num_blocks) {
      global = index_at(*total_num_blocks, t);
      if (uniform) {
        TORCH_CHECK_VALUE(global > 0 && global % my_size == 0,
                          "total_num_blocks must be positive multiples of my_size = ", my_size,
                          " (without block_bucketize_pos), got total_num_blocks[", t,
                          "] = ", global);
      } else if (spread) {
        TORCH_CHECK_VALUE(global > 0, "total_num_blocks must be > 0 where block_bucketize_pos[", t,
                          "] spreads ids over them (block_sizes[", t,
                          "] = 0), got total_num_blocks[", t, "] = ", global);
      }
    }
    const int64_t max_index = std::numeric_limits<index_t>::max();
    if (uniform || spread) {
      TORCH_CHECK_VALUE(
          global <= max_index && (block_size == 0 || global <= max_index / block_size),
          "block_sizes[", t, "] * ", global, " blocks overflows the indices' dtype");
      f.global_blocks = static_cast<index_t>(global);
      f.local_blocks = static_cast<index_t>(total_num_blocks ? global / my_size : 1);
    }
    if (!bounds.empty()) {
      const at::Tensor& b = bounds[t];
      f.bounds = b.const_data_ptr<index_t>();
      f.num_bounds = b.numel();
      TORCH_CHECK_VALUE(f.num_bounds >= 1 && f.bounds[0] == 0, "block_bucketize_pos[", t,
                        "] must start at 0, got ", b.sizes(), " entries starting at ",
                        f.num_bounds == 0 ? -1 : static_cast<int64_t>(f.bounds[0]));
      const int64_t bad = first_decrease(f.bounds, f.num_bounds);
      TORCH_CHECK_VALUE(bad < 0, "block_bucketize_pos[", t, "] must be non-decreasing, got [", bad,
                        "] = ", bad < 0 ? 0 : index_at(b, bad), " > [", bad + 1,
                        "] = ", bad < 0 ? 0 : index_at(b, bad + 1));
    }
    f.keep_ids = keep_orig_idx_per_feature ? keep_orig_idx_per_feature->const_data_ptr<bool>()[t]
                                           : keep_orig_idx;
  }
  TORCH_CHECK_VALUE(first_bag == num_bags,
                    "batch_size_per_feature must sum to lengths.numel() = ", num_bags, ", got ",
                    first_bag);
  return features;
}

// Both public forms: the inference one also returns each id's bucket when asked.
BucketizedSparseWithMapping bucketize(
    const at::Tensor& lengths, const at::Tensor& indices, bool bucketize_pos, bool sequence,
    const at::Tensor& block_sizes, int64_t my_size, const std::optional<at::Tensor>& weights,
    const std::optional<at::Tensor>& batch_size_per_feature,
    const std::optional<std::vector<at::Tensor>>& block_bucketize_pos, bool return_bucket_mapping,
    bool keep_orig_idx, const std::optional<at::Tensor>& total_num_blocks,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature) {
  check_index_tensor(lengths, "lengths");
  check_index_tensor(indices, "indices");
  check_index_tensor(block_sizes, "block_sizes");
  check_same_dtype(indices, "indices", block_sizes, "block_sizes");
  TORCH_CHECK_VALUE(my_size >= 1, "my_size must be >= 1, got ", my_size);
  const int64_t T = block_sizes.numel(), num_bags = lengths.numel(), num_ids = indices.numel();
  TORCH_CHECK_VALUE(T >= 1, "block_sizes must have one entry per feature, got none");
  TORCH_CHECK_VALUE(num_bags <= std::numeric_limits<int64_t>::max() / my_size,
                    "my_size * lengths.numel() overflows int64");
  const at::Tensor lengths_c = lengths.contiguous(), indices_c = indices.contiguous();
  const at::Tensor block_sizes_c = block_sizes.contiguous();
  check_lengths_non_negative(lengths_c, "lengths");
  const int64_t lengths_sum = dispatch_index_kind(index_kind(lengths.scalar_type()), [&](auto tag) {
    using offset_t = typename decltype(tag)::type;
    return sum_serial<int64_t>(lengths_c.const_data_ptr<offset_t>(), num_bags);
  });
  TORCH_CHECK_VALUE(lengths_sum == num_ids, "lengths must sum to indices.numel() = ", num_ids,
                    ", got ", lengths_sum);
  at::Tensor batch_sizes_c;
  if (batch_size_per_feature) {
    check_index_tensor(*batch_size_per_feature, "batch_size_per_feature");
    TORCH_CHECK_VALUE(batch_size_per_feature->numel() == T,
                      "batch_size_per_feature must have one entry per feature (", T, "), got ",
                      batch_size_per_feature->numel());
    batch_sizes_c = batch_size_per_feature->contiguous();
  } else {
    TORCH_CHECK_VALUE(num_bags % T == 0, "lengths.numel() = ", num_bags,
                      " must be a multiple of the number of features, ", T,
                      " (or pass batch_size_per_feature)");
  }
  std::vector<at::Tensor> bounds;
  if (block_bucketize_pos && !block_bucketize_pos->empty()) {
    TORCH_CHECK_VALUE(static_cast<int64_t>(block_bucketize_pos->size()) == T,
                      "block_bucketize_pos must hold one tensor per feature (", T, "), got ",
                      block_bucketize_pos->size());
    for (int64_t t = 0; t < T; ++t) {
      const at::Tensor& b = (*block_bucketize_pos)[t];
      TORCH_CHECK(b.device().is_cpu(), "block_bucketize_pos[", t, "] is on ", b.device(),
                  " but its op runs on cpu: every tensor must be a CPU tensor");
      TORCH_CHECK(b.dim() == 1 && b.scalar_type() == indices.scalar_type(), "block_bucketize_pos[",
                  t, "] must be 1-D with the indices' dtype (", indices.scalar_type(), "), got ",
                  b.scalar_type(), " of shape ", b.sizes());
      bounds.push_back(b.contiguous());
    }
  }
  at::Tensor total_blocks_c;
  if (total_num_blocks) {
    check_index_tensor(*total_num_blocks, "total_num_blocks");
    check_same_dtype(indices, "indices", *total_num_blocks, "total_num_blocks");
    TORCH_CHECK_VALUE(total_num_blocks->numel() == T, "total_num_blocks must have one entry per ",
                      "feature (", T, "), got ", total_num_blocks->numel());
    total_blocks_c = total_num_blocks->contiguous();
  }
  at::Tensor keep_per_feature_c;
  if (keep_orig_idx_per_feature) {
    check_cpu(*keep_orig_idx_per_feature, "keep_orig_idx_per_feature");
    TORCH_CHECK(keep_orig_idx_per_feature->scalar_type() == at::kBool &&
                    keep_orig_idx_per_feature->numel() == T,
                "keep_orig_idx_per_feature must be a bool tensor with one entry per feature (", T,
                "), got ", keep_orig_idx_per_feature->scalar_type(), " of ",
                keep_orig_idx_per_feature->numel());
    keep_per_feature_c = keep_orig_idx_per_feature->contiguous();
  }
  at::Tensor weights_c;
  if (weights) {
    check_cpu(*weights, "weights");
    check_dim(*weights, 1, "weights");
    TORCH_CHECK(weights->scalar_type() == at::kFloat || weights->scalar_type() == at::kDouble,
                "weights must be float32 or float64, got ", weights->scalar_type());
    TORCH_CHECK_VALUE(weights->numel() == num_ids, "weights must have one entry per index (",
                      num_ids, "), got ", weights->numel());
    weights_c = weights->contiguous();
  }

  at::Tensor new_lengths = at::zeros({my_size * num_bags}, lengths.options());
  at::Tensor new_indices = at::empty({num_ids}, indices.options());
  std::optional<at::Tensor> new_weights, new_pos, unbucketize_permute;
  if (weights) new_weights = at::empty({num_ids}, weights->options());
  if (bucketize_pos) new_pos = at::empty({num_ids}, indices.options());
  if (sequence) unbucketize_permute = at::empty({num_ids}, indices.options());
  std::optional<at::Tensor> bucket_mapping;
  if (return_bucket_mapping) bucket_mapping = at::empty({num_ids}, indices.options());
  at::Tensor bag_offsets = at::empty({num_bags + 1}, lengths.options().dtype(at::kLong));
  at::Tensor cursors = at::empty({my_size * num_bags}, lengths.options().dtype(at::kLong));

  dispatch_index_kind(index_kind(lengths.scalar_type()), [&](auto offset_tag) {
    using offset_t = typename decltype(offset_tag)::type;
    dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      const auto features = feature_buckets<index_t>(
          num_bags, block_sizes_c, my_size,
          batch_size_per_feature ? std::optional(batch_sizes_c) : std::nullopt, bounds,
          total_num_blocks ? std::optional(total_blocks_c) : std::nullopt, keep_orig_idx,
          keep_orig_idx_per_feature ? std::optional(keep_per_feature_c) : std::nullopt);
      const auto run = [&](auto weight_tag) {
        using weight_t = typename decltype(weight_tag)::type;
        kernels::BucketizeArgs<offset_t, index_t, weight_t> a;
        a.num_bags = num_bags;
        a.num_features = T;
        a.my_size = my_size;
        a.features = features.data();
        a.lengths = lengths_c.const_data_ptr<offset_t>();
        a.ids = indices_c.const_data_ptr<index_t>();
        a.new_lengths = new_lengths.mutable_data_ptr<offset_t>();
        a.new_ids = new_indices.mutable_data_ptr<index_t>();
        if (weights) {
          a.weights = weights_c.const_data_ptr<weight_t>();
          a.new_weights = new_weights->mutable_data_ptr<weight_t>();
        }
        if (bucketize_pos) a.new_pos = new_pos->mutable_data_ptr<index_t>();
        if (sequence) a.unbucketize = unbucketize_permute->mutable_data_ptr<index_t>();
        if (return_bucket_mapping) a.bucket_mapping = bucket_mapping->mutable_data_ptr<index_t>();
        a.bag_offsets = bag_offsets.mutable_data_ptr<int64_t>();
        a.cursors = cursors.mutable_data_ptr<int64_t>();
        kernels::block_bucketize(a);
      };
      if (weights && weights->scalar_type() == at::kDouble) {
        run(TypeTag<double>{});
      } else {
        run(TypeTag<float>{});
      }
    });
  });
  return {new_lengths, new_indices, new_weights, new_pos, unbucketize_permute, bucket_mapping};
}

}  // namespace

BucketizedSparse block_bucketize_sparse_features(
    const at::Tensor& lengths, const at::Tensor& indices, bool bucketize_pos, bool sequence,
    const at::Tensor& block_sizes, int64_t my_size, const std::optional<at::Tensor>& weights,
    const std::optional<at::Tensor>& batch_size_per_feature, int64_t /*max_B: CUDA only*/,
    const std::optional<std::vector<at::Tensor>>& block_bucketize_pos, bool keep_orig_idx,
    const std::optional<at::Tensor>& total_num_blocks,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature) {
  auto [new_lengths, new_indices, new_weights, new_pos, unbucketize_permute, unused_mapping] =
      bucketize(lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights,
                batch_size_per_feature, block_bucketize_pos, /*return_bucket_mapping=*/false,
                keep_orig_idx, total_num_blocks, keep_orig_idx_per_feature);
  return {new_lengths, new_indices, new_weights, new_pos, unbucketize_permute};
}

BucketizedSparseWithMapping block_bucketize_sparse_features_inference(
    const at::Tensor& lengths, const at::Tensor& indices, bool bucketize_pos, bool sequence,
    const at::Tensor& block_sizes, int64_t my_size, const std::optional<at::Tensor>& weights,
    const std::optional<at::Tensor>& batch_size_per_feature, int64_t /*max_B: CUDA only*/,
    const std::optional<std::vector<at::Tensor>>& block_bucketize_pos, bool return_bucket_mapping,
    bool keep_orig_idx, const std::optional<at::Tensor>& total_num_blocks,
    const std::optional<at::Tensor>& keep_orig_idx_per_feature) {
  return bucketize(lengths, indices, bucketize_pos, sequence, block_sizes, my_size, weights,
                   batch_size_per_feature, block_bucketize_pos, return_bucket_mapping,
                   keep_orig_idx, total_num_blocks, keep_orig_idx_per_feature);
}

}  // namespace recops::sparse
