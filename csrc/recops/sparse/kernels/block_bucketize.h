// Block bucketization of sparse features (FBGEMM's block_bucketize_sparse_features): every id of
// bag j of feature t goes to bucket p (the rank owning its row under torchrec's row-wise
// sharding), and the output holds, bucket after bucket, every bag's ids of that bucket, in input
// order: new_lengths[p * num_bags + j] counts them.
//
// Feature t's rows are cut into my_size blocks of block_size rows (or total_num_blocks blocks, a
// multiple of my_size, of which each bucket owns a run), or at explicit bounds
// (block_bucketize_pos; a zero block size first spreads ids over the bounds' range in
// total_num_blocks steps, which need not be a multiple of my_size); ids beyond the blocks go to
// bucket id % my_size. An id is re-based into
// its bucket unless the feature keeps original ids. Ids are read unsigned, as FBGEMM does, so a
// negative id is a huge one.
//
// Two passes over the bags, each in parallel (bags write disjoint counters and output ranges):
// count ids per (bucket, bag), then, from the counts' exclusive prefix sum, place every id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "recops/common/parallel.h"
#include "recops/common/prefix_sum.h"

namespace recops::sparse::kernels {

// How feature t's ids are bucketized, and where its bags are in the flat lengths.
template <typename index_t>
struct FeatureBuckets {
  int64_t first_bag = 0, num_bags = 0;
  index_t block_size = 0;
  // Blocks of the whole table and of one bucket: total_num_blocks[t] and its my_size-th part, or
  // my_size and 1 without total_num_blocks.
  index_t global_blocks = 1, local_blocks = 1;
  // Explicit bucket bounds (non-decreasing, from 0), or null for uniform blocks.
  const index_t* bounds = nullptr;
  int64_t num_bounds = 0;
  bool keep_ids = false;
};

template <typename offset_t, typename index_t, typename weight_t>
struct BucketizeArgs {
  int64_t num_bags = 0, num_features = 0, my_size = 1;
  const FeatureBuckets<index_t>* features = nullptr;
  const offset_t* lengths = nullptr;
  const index_t* ids = nullptr;
  const weight_t* weights = nullptr;  // null: no weights
  // Outputs: new_lengths [my_size * num_bags] zero-filled; new_ids, new_weights (if weights),
  // new_pos (id's position in its bag, or null), unbucketize (each input id's output position,
  // or null), bucket_mapping (each input id's bucket, or null) of one entry per id.
  offset_t* new_lengths = nullptr;
  index_t* new_ids = nullptr;
  weight_t* new_weights = nullptr;
  index_t* new_pos = nullptr;
  index_t* unbucketize = nullptr;
  index_t* bucket_mapping = nullptr;
  // Scratch: bag offsets [num_bags + 1] and one output cursor per (bucket, bag).
  int64_t* bag_offsets = nullptr;
  int64_t* cursors = nullptr;
};

// Bucket and re-based id of one id.
template <typename index_t>
struct Placement {
  std::make_unsigned_t<index_t> bucket, id;
};

template <typename index_t>
Placement<index_t> place_id(index_t raw, const FeatureBuckets<index_t>& f, int64_t my_size) {
  using uindex_t = std::make_unsigned_t<index_t>;
  const uindex_t id = static_cast<uindex_t>(raw);
  const uindex_t buckets = static_cast<uindex_t>(my_size);
  if (f.bounds != nullptr) {
    const uindex_t global = static_cast<uindex_t>(f.global_blocks);
    const uindex_t last = static_cast<uindex_t>(f.bounds[f.num_bounds - 1]);
    // Without a block size the id is first spread over the bounds' range.
    const uindex_t probe = f.block_size == 0 ? (id % global) * last / global : id;
    const int64_t bound =
        std::upper_bound(f.bounds, f.bounds + f.num_bounds, probe,
                         [](uindex_t v, index_t b) { return v < static_cast<uindex_t>(b); }) -
        f.bounds - 1;
    const bool inside = bound < my_size;
    const uindex_t bucket = inside ? static_cast<uindex_t>(bound) : id % buckets;
    if (f.keep_ids) return {bucket, id};
    if (f.block_size == 0) return {bucket, id / global};
    return {bucket, inside ? id - static_cast<uindex_t>(f.bounds[bound]) : id / buckets};
  }
  const uindex_t global = static_cast<uindex_t>(f.global_blocks);
  const uindex_t local = static_cast<uindex_t>(f.local_blocks);
  const uindex_t block = static_cast<uindex_t>(f.block_size);
  const uindex_t in_blocks = block * global, per_bucket = block * local;
  const bool inside = id < in_blocks;
  const uindex_t bucket = inside ? id / per_bucket : (id % global) / local;
  if (f.keep_ids) return {bucket, id};
  return {bucket, inside ? id % per_bucket : id / global};
}

// Calls fn(feature, bag) for the bags [begin, end), which may span features.
template <typename index_t, typename Fn>
void for_each_bag(const FeatureBuckets<index_t>* features, int64_t num_features, int64_t begin,
                  int64_t end, const Fn& fn) {
  int64_t t = std::upper_bound(
                  features, features + num_features, begin,
                  [](int64_t bag, const FeatureBuckets<index_t>& f) { return bag < f.first_bag; }) -
              features - 1;
  for (int64_t j = begin; j < end; ++j) {
    while (j >= features[t].first_bag + features[t].num_bags) ++t;
    fn(features[t], j);
  }
}

template <typename offset_t, typename index_t, typename weight_t>
void block_bucketize(const BucketizeArgs<offset_t, index_t, weight_t>& a) {
  const int64_t bags = a.num_bags;
  if (bags == 0) return;
  prefix_sum</*kInclusive=*/true, int64_t>(a.lengths, a.bag_offsets + 1, bags);
  a.bag_offsets[0] = 0;
  const int64_t ids_per_bag = std::max<int64_t>(1, a.bag_offsets[bags] / bags);
  const int64_t grain = grain_for_bytes(ids_per_bag * 2 * static_cast<int64_t>(sizeof(index_t)));

  parallel_for(0, bags, grain, [&](int64_t begin, int64_t end) {
    for_each_bag(a.features, a.num_features, begin, end,
                 [&](const FeatureBuckets<index_t>& f, int64_t j) {
                   for (int64_t i = a.bag_offsets[j]; i < a.bag_offsets[j + 1]; ++i) {
                     const auto bucket = place_id(a.ids[i], f, a.my_size).bucket;
                     ++a.new_lengths[static_cast<int64_t>(bucket) * bags + j];
                   }
                 });
  });

  prefix_sum</*kInclusive=*/false, int64_t>(a.new_lengths, a.cursors, a.my_size * bags);

  parallel_for(0, bags, grain, [&](int64_t begin, int64_t end) {
    for_each_bag(a.features, a.num_features, begin, end,
                 [&](const FeatureBuckets<index_t>& f, int64_t j) {
                   const int64_t start = a.bag_offsets[j];
                   for (int64_t i = start; i < a.bag_offsets[j + 1]; ++i) {
                     const Placement<index_t> to = place_id(a.ids[i], f, a.my_size);
                     const int64_t pos = a.cursors[static_cast<int64_t>(to.bucket) * bags + j]++;
                     a.new_ids[pos] = static_cast<index_t>(to.id);
                     if (a.weights != nullptr) a.new_weights[pos] = a.weights[i];
                     if (a.new_pos != nullptr) a.new_pos[pos] = static_cast<index_t>(i - start);
                     if (a.unbucketize != nullptr) a.unbucketize[i] = static_cast<index_t>(pos);
                     if (a.bucket_mapping != nullptr) {
                       a.bucket_mapping[i] = static_cast<index_t>(to.bucket);
                     }
                   }
                 });
  });
}

}  // namespace recops::sparse::kernels
