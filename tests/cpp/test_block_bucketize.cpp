// block_bucketize (csrc/recops/sparse/kernels/block_bucketize.h) against a serial scalar loop that
// appends every id to its (bucket, bag) list: uniform blocks, total_num_blocks, explicit bounds
// (with and without a block size), kept ids, variable batch sizes, negative ids, empty bags and
// batches, on 1 and 4 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "recops/sparse/kernels/block_bucketize.h"
#include "test_util.h"

namespace recops::sparse::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

struct Bucketized {
  std::vector<int64_t> lengths, ids, pos, unbucketize, buckets;
  std::vector<float> weights;
};

// The rule written out per id, bucket lists filled in input order.
template <typename index_t>
Bucketized scalar_bucketize(const std::vector<FeatureBuckets<index_t>>& features,
                            const std::vector<int64_t>& lengths, const std::vector<index_t>& ids,
                            const std::vector<float>& weights, int64_t my_size) {
  using uindex_t = std::make_unsigned_t<index_t>;
  const int64_t bags = static_cast<int64_t>(lengths.size());
  struct Entry {
    int64_t id, input, pos;
  };
  std::vector<std::vector<Entry>> lists(my_size * bags);
  int64_t i = 0;
  for (const FeatureBuckets<index_t>& f : features) {
    for (int64_t j = f.first_bag; j < f.first_bag + f.num_bags; ++j) {
      for (int64_t k = 0; k < lengths[j]; ++k, ++i) {
        const uindex_t u = static_cast<uindex_t>(ids[i]);
        uindex_t bucket, id;
        if (f.bounds != nullptr) {
          const uindex_t g = f.global_blocks;
          const uindex_t probe =
              f.block_size == 0 ? static_cast<uindex_t>(
                                      (u % g) * static_cast<uindex_t>(f.bounds[f.num_bounds - 1])) /
                                      g
                                : u;
          int64_t lb = -1;
          for (int64_t b = 0; b < f.num_bounds; ++b) {
            if (static_cast<uindex_t>(f.bounds[b]) <= probe) lb = b;
          }
          bucket = lb < my_size ? lb : u % my_size;
          id = f.keep_ids          ? u
               : f.block_size == 0 ? u / g
               : lb < my_size      ? u - f.bounds[lb]
                                   : u / my_size;
        } else {
          const uindex_t block = f.block_size, g = f.global_blocks, l = f.local_blocks;
          const bool inside = u < block * g;
          bucket = inside ? u / (block * l) : (u % g) / l;
          id = f.keep_ids ? u : inside ? u % (block * l) : u / g;
        }
        lists[bucket * bags + j].push_back({static_cast<index_t>(id), i, k});
      }
    }
  }
  Bucketized out;
  out.unbucketize.resize(ids.size());
  out.buckets.resize(ids.size());
  for (size_t l = 0; l < lists.size(); ++l) {
    const auto& list = lists[l];
    out.lengths.push_back(static_cast<int64_t>(list.size()));
    for (const Entry& e : list) {
      out.buckets[e.input] = static_cast<int64_t>(l) / bags;
      out.unbucketize[e.input] = static_cast<int64_t>(out.ids.size());
      out.ids.push_back(e.id);
      out.pos.push_back(e.pos);
      if (!weights.empty()) out.weights.push_back(weights[e.input]);
    }
  }
  return out;
}

template <typename index_t>
void check(const std::vector<FeatureBuckets<index_t>>& features,
           const std::vector<int64_t>& lengths, const std::vector<index_t>& ids, int64_t my_size,
           bool with_weights, int threads) {
  const int64_t bags = static_cast<int64_t>(lengths.size()), n = static_cast<int64_t>(ids.size());
  std::vector<float> weights = with_weights ? test::random_floats(n) : std::vector<float>{};
  const Bucketized want = scalar_bucketize(features, lengths, ids, weights, my_size);

  std::vector<int64_t> new_lengths(my_size * bags, 0), bag_offsets(bags + 1),
      cursors(my_size * bags);
  std::vector<index_t> new_ids(n, -7), new_pos(n, -7), unbucketize(n, -7), mapping(n, -7);
  std::vector<float> new_weights(n);
  BucketizeArgs<int64_t, index_t, float> a;
  a.num_bags = bags;
  a.num_features = static_cast<int64_t>(features.size());
  a.my_size = my_size;
  a.features = features.data();
  a.lengths = lengths.data();
  a.ids = ids.data();
  a.weights = with_weights ? weights.data() : nullptr;
  a.new_lengths = new_lengths.data();
  a.new_ids = new_ids.data();
  a.new_weights = with_weights ? new_weights.data() : nullptr;
  a.new_pos = new_pos.data();
  a.unbucketize = unbucketize.data();
  a.bucket_mapping = mapping.data();
  a.bag_offsets = bag_offsets.data();
  a.cursors = cursors.data();
  {
    ScopedThreads scope(threads);
    block_bucketize(a);
  }
  EXPECT_EQ(new_lengths, want.lengths);
  EXPECT_EQ(std::vector<int64_t>(new_ids.begin(), new_ids.end()), want.ids);
  EXPECT_EQ(std::vector<int64_t>(new_pos.begin(), new_pos.end()), want.pos);
  EXPECT_EQ(std::vector<int64_t>(unbucketize.begin(), unbucketize.end()), want.unbucketize);
  EXPECT_EQ(std::vector<int64_t>(mapping.begin(), mapping.end()), want.buckets);
  if (with_weights) {
    EXPECT_EQ(new_weights, want.weights);
  }
}

// T features of `batch` bags each (first_bag laid out in order), with the given rule.
template <typename index_t>
std::vector<FeatureBuckets<index_t>> uniform_features(const std::vector<int64_t>& batch,
                                                      const std::vector<index_t>& block_sizes,
                                                      int64_t my_size, int64_t blocks_per_bucket,
                                                      bool keep) {
  std::vector<FeatureBuckets<index_t>> features(batch.size());
  int64_t first = 0;
  for (size_t t = 0; t < batch.size(); ++t) {
    features[t].first_bag = first;
    features[t].num_bags = batch[t];
    first += batch[t];
    features[t].block_size = block_sizes[t];
    features[t].global_blocks = static_cast<index_t>(my_size * blocks_per_bucket);
    features[t].local_blocks = static_cast<index_t>(blocks_per_bucket);
    features[t].keep_ids = keep && t % 2 == 0;
  }
  return features;
}

template <typename index_t>
void check_uniform(int64_t blocks_per_bucket, bool keep, int threads) {
  const int64_t my_size = 3;
  const std::vector<int64_t> batch = {40, 0, 25, 1};
  const int64_t bags = std::accumulate(batch.begin(), batch.end(), int64_t{0});
  const std::vector<int64_t> lengths = random_integers<int64_t>(bags, 0, 5, 3);
  const int64_t n = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  const std::vector<index_t> ids = random_integers<index_t>(n, -3, 60, 4);
  const auto features =
      uniform_features<index_t>(batch, {4, 5, 0, 7}, my_size, blocks_per_bucket, keep);
  check(features, lengths, ids, my_size, /*with_weights=*/true, threads);
}

TEST(BlockBucketize, UniformBlocksMatchScalarLoop) {
  for (int threads : {1, 4}) {
    for (bool keep : {false, true}) {
      check_uniform<int64_t>(1, keep, threads);
      check_uniform<int32_t>(1, keep, threads);
    }
  }
}

TEST(BlockBucketize, TotalNumBlocksMatchScalarLoop) {
  for (int threads : {1, 4}) {
    check_uniform<int64_t>(2, false, threads);
    check_uniform<int32_t>(3, true, threads);
  }
}

TEST(BlockBucketize, ExplicitBoundsMatchScalarLoop) {
  const int64_t my_size = 2;
  const std::vector<int64_t> bounds_a = {0, 7, 12}, bounds_b = {0, 0, 30};
  for (int threads : {1, 4}) {
    for (int64_t block : {int64_t{4}, int64_t{0}}) {
      auto features = uniform_features<int64_t>({30, 30}, {block, block}, my_size, 1, false);
      features[0].bounds = bounds_a.data();
      features[0].num_bounds = 3;
      features[1].bounds = bounds_b.data();
      features[1].num_bounds = 3;
      const std::vector<int64_t> lengths = random_integers<int64_t>(60, 0, 4, 5);
      const int64_t n = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
      check(features, lengths, random_integers<int64_t>(n, -2, 40, 6), my_size, false, threads);
    }
  }
}

// With bounds and no block size, ids are spread over the bounds' range in total_num_blocks steps,
// a count that need not be a multiple of my_size.
TEST(BlockBucketize, BoundsSpreadOverUnevenBlockCountsMatchScalarLoop) {
  const int64_t my_size = 3;
  const std::vector<int32_t> bounds_a = {0, 2, 5, 9}, bounds_b = {0, 3, 6, 20};
  for (int threads : {1, 4}) {
    for (int32_t global : {7, 5, 2, 1}) {
      auto features = uniform_features<int32_t>({20, 20}, {0, 0}, my_size, 1, false);
      features[0].bounds = bounds_a.data();
      features[1].bounds = bounds_b.data();
      for (auto& f : features) {
        f.num_bounds = 4;
        f.global_blocks = global;
      }
      const std::vector<int64_t> lengths = random_integers<int64_t>(40, 0, 4, 7);
      const int64_t n = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
      check(features, lengths, random_integers<int32_t>(n, -2, 40, 8), my_size, false, threads);
    }
  }
}

TEST(BlockBucketize, EmptyBatchAndEmptyBags) {
  const auto features = uniform_features<int64_t>({0, 0}, {4, 4}, 2, 1, false);
  check(features, {}, std::vector<int64_t>{}, 2, true, 1);
  const auto zero_bags = uniform_features<int64_t>({3, 2}, {4, 4}, 2, 1, false);
  check(zero_bags, std::vector<int64_t>(5, 0), std::vector<int64_t>{}, 2, false, 4);
}

}  // namespace
}  // namespace recops::sparse::kernels
