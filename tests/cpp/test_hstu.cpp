// HSTU and FuXi-alpha attention kernels (hstu/kernels/hstu_attention.h, on the fp32 precision
// policy) on small jagged batches against scalar loops in double written here from
// docs/ops.md sections 3-5:
// causal and two-sided masks, with and without the relative time + position bias, forward and
// backward (dQ, dK, dV and the bias tables' gradients), on two chunks per sequence; and the block
// loop they share (block_schedule.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/hstu/kernels/bf16_operands.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fp32_products.h"
#include "recops/hstu/kernels/hstu_attention.h"
#include "test_util.h"

namespace recops::attention::kernels {
namespace {

using test::expect_near_all;
using test::sum_parts;

std::vector<double> random_values(int64_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// floor(ln(max(|dt|, 1)) / divisor) clamped to [0, num_buckets] (docs/ops.md section 3).
int64_t reference_bucket(double dt, double divisor, int64_t num_buckets) {
  const double q = std::floor(std::log(std::max(std::abs(dt), 1.0)) / divisor);
  return std::min<int64_t>(static_cast<int64_t>(q), num_buckets);
}

// A jagged batch: three sequences in rows [begin, begin + length) of [rows, H, D] tensors.
struct Batch {
  std::vector<int64_t> row_begin = {0, 70, 75}, length = {70, 5, 90};
  int64_t rows = 165, max_len = 96, heads = 2, dqk = 8, dv = 6;
  std::vector<double> key_time, query_time;  // per row
  int64_t num_buckets = 12;
  double divisor = 0.6;

  Batch() {
    std::mt19937 rng(99);
    key_time.resize(rows);
    for (size_t b = 0; b < length.size(); ++b) {
      double t = 1000;
      for (int64_t i = 0; i < length[b]; ++i) {
        t += std::uniform_int_distribution<int>(0, 400)(rng);
        key_time[row_begin[b] + i] = t;
      }
    }
    query_time = key_time;  // the next item's time, the last its own
    for (size_t b = 0; b < length.size(); ++b) {
      for (int64_t i = 0; i + 1 < length[b]; ++i) {
        query_time[row_begin[b] + i] = key_time[row_begin[b] + i + 1];
      }
    }
  }
  Sequences sequences() const {
    return Sequences::same_rows(static_cast<int64_t>(length.size()), row_begin.data(),
                                length.data(), max_len);
  }
  bool visible(bool causal, int64_t i, int64_t j) const { return !causal || j <= i; }
  // The relative bias ts_w[bucket] + pos_w[N - 1 + j - i] of (query row i, key j) of sequence b;
  // either table may be empty.
  double bias(const std::vector<double>& ts_w, const std::vector<double>& pos_w, int64_t b,
              int64_t i, int64_t j) const {
    double x = 0;
    if (!ts_w.empty()) x += ts_w[bucket(b, i, j)];
    if (!pos_w.empty()) x += pos_w[max_len - 1 + j - i];
    return x;
  }
  // The kernels' relative bias source of the tables ts_w and pos_w on this batch's times.
  template <typename T>
  BiasSource<T> relative_bias(const std::vector<T>& ts_w, const std::vector<T>& pos_w,
                              const LogBucketizer& bucketizer) const {
    BiasSource<T> bias;
    bias.kind = BiasKind::kRelative;
    bias.key_time = key_time.data();
    bias.query_time = query_time.data();
    bias.ts_w = ts_w.data();
    bias.pos_w = pos_w.data();
    bias.buckets = bucketizer.view();
    return bias;
  }
  int64_t bucket(int64_t b, int64_t i, int64_t j) const {
    return reference_bucket(query_time[row_begin[b] + i] - key_time[row_begin[b] + j], divisor,
                            num_buckets);
  }
};

struct Case {
  bool causal, relative_bias;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.causal ? "Causal" : "TwoSided") +
         (info.param.relative_bias ? "RelativeBias" : "NoBias");
}

TEST(HstuInputs, QueryTimesTakeTheNextItemsTime) {
  const Batch batch;
  std::vector<double> shifted(batch.rows, -1.0), unshifted(batch.rows, -1.0);
  query_times(batch.sequences(), batch.key_time.data(), true, shifted.data());
  query_times(batch.sequences(), batch.key_time.data(), false, unshifted.data());
  EXPECT_EQ(shifted, batch.query_time);
  EXPECT_EQ(unshifted, batch.key_time);
}

// The one block loop of the HSTU-family kernels (block_schedule.h): every query row of every
// sequence falls in exactly one block (of the sequences' block rows, starting at a multiple of
// them), which meets the keys its mask lets it see (causal with a window of 40: the 40 keys
// before the block's first row up to its last row) and runs between its item's begin_item and
// end_item; end_item gets the item's dK, dV partial at the sequence's rows.
TEST(HstuBlockSchedule, VisitsEveryQueryRowOnceInsideItsItem) {
  const std::vector<int64_t> row_begin = {0, 70, 75, 75}, length = {70, 5, 0, 150};
  const Sequences seqs = Sequences::same_rows(4, row_begin.data(), length.data(), 150);
  // Queries on their own rows take the short blocks (batch.h); queries over cached keys do not.
  EXPECT_EQ(seqs.query_block, kOwnRowsQueryBlock);
  EXPECT_EQ(Sequences::with_keys(4, row_begin.data(), length.data(),
                                 {row_begin.data(), length.data()}, 150)
                .query_block,
            kQueryBlock);
  const int64_t rows = 225, heads = 2, dqk = 3, dv = 4, chunks = 2, window = 40;
  MaskSource<float> mask;
  mask.max_attn_len = window;
  std::vector<float> dk(chunks * rows * heads * dqk), dv_partials(chunks * rows * heads * dv);
  const QkvGrads<float> qkv{nullptr, dk.data(), dv_partials.data(), rows, heads, dqk, dv};

  std::vector<std::atomic<int>> visits(rows);
  std::atomic<int> errors{0};
  std::vector<std::vector<std::pair<const float*, const float*>>> ended(max_threads());
  struct Recorder {  // stands in for the kernels' gradient accumulators
    std::atomic<int>* errors;
    std::vector<std::pair<const float*, const float*>>* ended;
    int64_t length = -1;  // of the item under way; -1 between items
    void begin_item(int64_t n) {
      if (length != -1) ++*errors;
      length = n;
    }
    bool finished = false;  // finish_item ran, after the item's blocks, before its end_item
    void finish_item(int64_t n) {
      if (n != length || finished) ++*errors;
      finished = true;
    }
    void end_item(int64_t key0, int64_t n, float* item_dk, float* item_dv, bool accumulate) {
      if (key0 != 0 || n != length || !accumulate || !finished) ++*errors;
      finished = false;
      ended->emplace_back(item_dk, item_dv);
      length = -1;
    }
  };
  struct Scratch {
    Recorder grads;
  };
  for_each_backward_block(
      seqs, mask, chunks, qkv,
      [&](int64_t slot) {
        return Scratch{{&errors, &ended[slot]}};
      },
      [&](Scratch& scratch, const Block& blk) {
        const int64_t key0 = std::max<int64_t>(0, blk.row0 - window);
        if (scratch.grads.length != blk.length || scratch.grads.finished || blk.key0 != key0 ||
            blk.keys != blk.row0 + blk.rows - key0 || blk.rows > seqs.query_block ||
            blk.row0 % seqs.query_block != 0) {
          ++errors;
        }
        for (int64_t r = 0; r < blk.rows; ++r) ++visits[row_begin[blk.b] + blk.row0 + r];
      });

  EXPECT_EQ(errors.load(), 0);
  for (int64_t row = 0; row < rows; ++row) EXPECT_EQ(visits[row].load(), 1) << "row " << row;
  std::vector<std::pair<const float*, const float*>> got, expected;
  for (const auto& slot : ended) got.insert(got.end(), slot.begin(), slot.end());
  for (const WorkItem& item :
       make_work_items(length.data(), seqs.count, chunks, seqs.query_block)) {
    const int64_t first = row_begin[item.sequence];
    expected.emplace_back(qkv.dk_partial(item.chunk) + first * heads * dqk,
                          qkv.dv_partial(item.chunk) + first * heads * dv);
  }
  std::sort(got.begin(), got.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(got, expected);
}

// The rows of dK, dV no backward item writes with one chunk: the rows outside every sequence
// with queries (here a sequence without rows, and gaps before, between and after); none when two
// such sequences share a key row.
TEST(HstuBlockSchedule, FindsTheKeyRowsNoItemWrites) {
  using Gaps = std::vector<std::pair<int64_t, int64_t>>;
  const std::vector<int64_t> row_begin = {2, 10, 40}, length = {5, 0, 20};
  const Sequences apart = Sequences::same_rows(3, row_begin.data(), length.data(), 20);
  EXPECT_EQ(unwritten_key_rows(apart, 70), (Gaps{{0, 2}, {7, 40}, {60, 70}}));
  EXPECT_EQ(unwritten_key_rows(apart, 60), (Gaps{{0, 2}, {7, 40}}));
  const std::vector<int64_t> shared_begin = {0, 3}, shared_length = {5, 5};
  const Sequences shared = Sequences::same_rows(2, shared_begin.data(), shared_length.data(), 5);
  EXPECT_FALSE(unwritten_key_rows(shared, 8).has_value());
  const std::vector<int64_t> touching_begin = {0, 5}, touching_length = {5, 3};
  const Sequences touching =
      Sequences::same_rows(2, touching_begin.data(), touching_length.data(), 5);
  EXPECT_EQ(unwritten_key_rows(touching, 8), Gaps{});
}

// The rows of an output or dQ no block writes: the rows outside every sequence's query rows (here
// the last 3 and 5 rows of two sequences' keys, a sequence without queries, and rows before,
// between and after); none when two sequences share a query row.
TEST(HstuBlockSchedule, FindsTheQueryRowsNoBlockWrites) {
  using Gaps = std::vector<std::pair<int64_t, int64_t>>;
  const std::vector<int64_t> q_begin = {4, 20, 30}, q_length = {3, 0, 5};
  const std::vector<int64_t> key_begin = {0, 12, 30}, key_length = {10, 4, 8};
  KeyRows keys;
  keys.row_begin = key_begin.data();
  keys.length = key_length.data();
  const Sequences apart = Sequences::with_keys(3, q_begin.data(), q_length.data(), keys, 10);
  EXPECT_EQ(unwritten_query_rows(apart, 40), (Gaps{{0, 4}, {7, 30}, {35, 40}}));
  EXPECT_EQ(unwritten_query_rows(apart, 35), (Gaps{{0, 4}, {7, 30}}));
  const std::vector<int64_t> shared_begin = {0, 2}, shared_length = {3, 3};
  const Sequences shared =
      Sequences::with_keys(2, shared_begin.data(), shared_length.data(), keys, 10);
  EXPECT_FALSE(unwritten_query_rows(shared, 8).has_value());
}

// The forward's key split (forward_key_parts, for_each_block_in_parallel with parts): with fewer
// query blocks than threads, each block's keys are cut in parts that cover them exactly once, a
// part past the first starting at a multiple of kKeyPartGranule; otherwise no split.
TEST(HstuBlockSchedule, SplitsTheKeysOfFewBlocksBetweenThreads) {
  const std::vector<int64_t> q_begin = {0, 3}, q_length = {3, 1}, length = {1300, 700};
  const KeyRows keys{q_begin.data(), length.data()};
  const Sequences two = Sequences::with_keys(2, q_begin.data(), q_length.data(), keys, 1400);
  const Sequences one = Sequences::with_keys(1, q_begin.data(), q_length.data(), keys, 1400);
  EXPECT_EQ(forward_key_parts(one), std::min<int64_t>(max_threads(), 2));  // 1300 / 512 keys
  const std::vector<int64_t> many_rows = {64 * 64};  // 64 query blocks: enough for any thread
  const Sequences many = Sequences::with_keys(1, q_begin.data(), many_rows.data(),
                                              {q_begin.data(), many_rows.data()}, 64 * 64);
  EXPECT_EQ(forward_key_parts(many), 1);

  for (const int64_t window : {int64_t{0}, int64_t{1000}}) {  // a window: the first key past 0
    MaskSource<float> mask;
    mask.max_attn_len = window;
    const int64_t parts = 3;
    std::vector<std::atomic<int>> seen(2 * 1300);  // (sequence, key)
    std::atomic<int> errors{0};
    for_each_block_in_parallel(
        two, mask, 1, parts, [](int64_t) { return 0; },
        [&](int&, const Block& blk, int64_t part) {
          const Block whole = mask.block(blk.b, length[blk.b], blk.row0, blk.rows);
          const bool starts_right =
              part == 0 ? blk.key0 == whole.key0 : blk.key0 % kKeyPartGranule == 0;
          if (!starts_right || blk.key0 < whole.key0 ||
              blk.key0 + blk.keys > whole.key0 + whole.keys) {
            ++errors;
          }
          for (int64_t j = 0; j < blk.keys; ++j) ++seen[blk.b * 1300 + blk.key0 + j];
        });
    EXPECT_EQ(errors.load(), 0) << "window " << window;
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t last_row = length[b] - 1;  // the block of the last q_length[b] rows
      const Block whole = mask.block(b, length[b], length[b] - q_length[b], q_length[b]);
      for (int64_t j = 0; j <= last_row; ++j) {
        const int expected = j >= whole.key0 && j < whole.key0 + whole.keys ? 1 : 0;
        EXPECT_EQ(seen[b * 1300 + j].load(), expected) << "sequence " << b << ", key " << j;
      }
    }
  }
}

// The bf16 forward's visible runs and the fused forward's visibility bits say what the mask
// tile's rows say: ones inside, zeros outside, for every structured mask option, on blocks whose
// key range starts past key 0 (windows) and on padded blocks (key0 rounded down).
// The closed form of first_with_id_at_least against a scan of the ids, for every id bound around
// the ids' range, with and without contextual tokens and targets, and for lengths the contextual
// tokens and targets overrun (top() < 0).
TEST(HstuMasks, FirstWithIdAtLeastMatchesAScan) {
  for (const int64_t length : {0, 1, 2, 7, 40}) {
    for (const int64_t contextual_len : {0, 1, 3, 9}) {
      for (const int64_t num_targets : {0, 1, 5}) {
        StructuredMask mask;
        mask.length = length;
        mask.contextual_len = contextual_len;
        mask.num_targets = num_targets;
        for (int64_t x = -3 - length; x <= length + 3; ++x) {
          int64_t want = length;
          for (int64_t p = length - 1; p >= 0; --p) {
            if (mask.id(p) >= x) want = p;
          }
          ASSERT_EQ(mask.first_with_id_at_least(x), want)
              << "length " << length << " contextual " << contextual_len << " targets "
              << num_targets << " x " << x;
        }
      }
    }
  }
}

TEST(HstuMasks, VisibleRunsMatchTheMaskTile) {
  const int64_t length = 150;
  const int64_t num_targets[] = {7};
  struct Options {
    MaskKind kind;
    int64_t contextual_len, target_group_size, max_attn_len;
    bool targets;
  };
  const Options cases[] = {
      {MaskKind::kCausal, 0, 1, 0, false}, {MaskKind::kCausal, 0, 1, 9, false},
      {MaskKind::kCausal, 5, 1, 20, true}, {MaskKind::kCausal, 40, 3, 30, true},
      {MaskKind::kNone, 0, 1, 0, false},   {MaskKind::kNone, 0, 1, 11, false},
      {MaskKind::kNone, 6, 4, 25, true},
  };
  for (const Options& o : cases) {
    MaskSource<float> mask;
    mask.kind = o.kind;
    mask.contextual_len = o.contextual_len;
    mask.target_group_size = o.target_group_size;
    mask.max_attn_len = o.max_attn_len;
    mask.num_targets = o.targets ? num_targets : nullptr;
    const StructuredMask structured = mask.structured(0, length);
    for (int64_t row0 = 0; row0 < length; row0 += 37) {
      for (const int64_t pad : {int64_t{0}, int64_t{5}}) {
        Block blk = mask.block(0, length, row0, std::min<int64_t>(37, length - row0));
        const int64_t shift = std::min(pad, blk.key0);  // a padded block starts earlier
        blk.key0 -= shift;
        blk.keys += shift;
        std::vector<float> tile(blk.rows * blk.keys, -1.0f);
        build_mask_tile(mask, blk, 0, tile.data());
        for (int64_t r = 0; r < blk.rows; ++r) {
          std::vector<float> from_runs(blk.keys, 0.0f);
          int64_t begin[4], end[4];
          const int runs = visible_runs(structured, blk, r, begin, end);
          for (int k = 0; k < runs; ++k) {
            ASSERT_LT(begin[k], end[k]);
            if (k > 0) {
              ASSERT_GT(begin[k], end[k - 1]) << "runs sorted and disjoint";
            }
            std::fill(from_runs.begin() + begin[k], from_runs.begin() + end[k], 1.0f);
          }
          const std::vector<float> want(tile.begin() + r * blk.keys,
                                        tile.begin() + (r + 1) * blk.keys);
          ASSERT_EQ(from_runs, want) << "row " << row0 + r << " mask kind "
                                     << static_cast<int>(o.kind) << " window " << o.max_attn_len;
        }
        // The fused forward's visibility bits say the same (tile rows of ld, a multiple of 32,
        // and two padded query rows that see nothing).
        blk.ld = (blk.keys + 31) / 32 * 32;
        const int64_t words = blk.ld / 32, rows_pad = blk.rows + 2;
        std::vector<uint32_t> bits(rows_pad * words, ~0u);
        fill_visibility(mask, blk, rows_pad, bits.data());
        for (int64_t r = 0; r < rows_pad; ++r) {
          for (int64_t j = 0; j < blk.ld; ++j) {
            const bool seen = (bits[r * words + j / 32] >> (j % 32)) & 1u;
            const bool want = r < blk.rows && j < blk.keys && tile[r * blk.keys + j] != 0.0f;
            ASSERT_EQ(seen, want) << "row " << row0 + r << " key " << blk.key0 + j;
          }
        }
      }
    }
  }
  // A custom mask's tile gives the multipliers: every key of the block is visible.
  MaskSource<float> custom;
  custom.kind = MaskKind::kCustom;
  Block blk = custom.block(0, 40, 0, 20);
  blk.ld = 64;
  std::vector<uint32_t> bits(32 * 2, ~0u);
  fill_visibility(custom, blk, 32, bits.data());
  for (int64_t r = 0; r < 32; ++r) {
    EXPECT_EQ(bits[2 * r], r < 20 ? ~0u : 0u) << "row " << r;
    EXPECT_EQ(bits[2 * r + 1], r < 20 ? 0xffu : 0u) << "row " << r;
  }
}

// bf16 K^T stored in blocks of 32 keys (the fused forward's layout) holds what the one-block
// layout holds: per sequence and head K^T in VNNI pairs, zero past the sequence and past Dqk (odd
// here), read from k_t() at each block's first key.
TEST(HstuBf16Operands, BlockedKeyTransposeMatchesOneBlock) {
  const Batch batch;
  const int64_t H = batch.heads, dqk = 7, dv = 6, granule = 32;
  std::vector<uint16_t> k(batch.rows * H * dqk), v(batch.rows * H * dv);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint16_t>(i * 7 + 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 3 + 1);
  const Sequences seqs = batch.sequences();
  const Rows<uint16_t> k_rows{k.data(), H * dqk}, v_rows{v.data(), H * dv};
  const PackedOperands::Which k_t_only{true, false, false, false};
  const PackedOperands one(seqs, H, dqk, dv, k_rows, v_rows, k_t_only, granule);
  const PackedOperands blocked(seqs, H, dqk, dv, k_rows, v_rows, k_t_only, granule, granule);
  ASSERT_EQ(one.k_t_ld(), one.n_pad());
  ASSERT_EQ(blocked.k_t_ld(), granule);
  for (int64_t b = 0; b < seqs.count; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t key = 0; key < one.n_pad(); ++key) {
        const int64_t key0 = key / granule * granule;
        for (int64_t d = 0; d < one.dqk_pad(); ++d) {
          const uint16_t want = key < seqs.keys.length[b] && d < dqk
                                    ? k[(seqs.keys.row(b, key) * H + h) * dqk + d]
                                    : uint16_t{0};
          // Element (d, j) of a VNNI [Dqk, ld] K^T is at ((d / 2) * ld + j) * 2 + d % 2.
          ASSERT_EQ(one.k_t(b, h, 0)[((d / 2) * one.k_t_ld() + key) * 2 + d % 2], want);
          ASSERT_EQ(blocked.k_t(b, h, key0)[((d / 2) * granule + key - key0) * 2 + d % 2], want)
              << "sequence " << b << " head " << h << " key " << key << " dim " << d;
        }
      }
    }
  }
}

class HstuKernel : public ::testing::TestWithParam<Case> {};

TEST_P(HstuKernel, ForwardAndBackwardMatchScalarLoops) {
  const Case c = GetParam();
  const Batch batch;
  const int64_t H = batch.heads, dqk = batch.dqk, dv = batch.dv, N = batch.max_len;
  const double alpha = 0.4, scale = 1.0 / N;
  const auto q = random_values(batch.rows * H * dqk, 1), k = random_values(batch.rows * H * dqk, 2);
  const auto v = random_values(batch.rows * H * dv, 3), go = random_values(batch.rows * H * dv, 4);
  const auto ts_w = random_values(batch.num_buckets + 1, 5), pos_w = random_values(2 * N - 1, 6);
  const std::vector<double> no_table;
  const auto& ts = c.relative_bias ? ts_w : no_table;
  const auto& pos = c.relative_bias ? pos_w : no_table;

  // Reference forward and backward, sequence by sequence, head by head.
  std::vector<double> out(batch.rows * H * dv, 0.0), dq(batch.rows * H * dqk, 0.0),
      dk(dq.size(), 0.0), dv_ref(out.size(), 0.0), dts(ts_w.size(), 0.0), dpos(pos_w.size(), 0.0);
  for (size_t b = 0; b < batch.length.size(); ++b) {
    const int64_t first = batch.row_begin[b], len = batch.length[b];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const double* qi = &q[((first + i) * H + h) * dqk];
        const double* goi = &go[((first + i) * H + h) * dv];
        for (int64_t j = 0; j < len; ++j) {
          if (!batch.visible(c.causal, i, j)) continue;
          const double* kj = &k[((first + j) * H + h) * dqk];
          const double* vj = &v[((first + j) * H + h) * dv];
          double s = 0, da = 0;
          for (int64_t d = 0; d < dqk; ++d) s += qi[d] * kj[d];
          for (int64_t d = 0; d < dv; ++d) da += goi[d] * vj[d];
          const double x = alpha * s + batch.bias(ts, pos, b, i, j);
          const double a = silu(x) * scale;
          const double dx = da * scale * sigmoid(x) * (1 + x * (1 - sigmoid(x)));
          for (int64_t d = 0; d < dv; ++d) {
            out[((first + i) * H + h) * dv + d] += a * vj[d];
            dv_ref[((first + j) * H + h) * dv + d] += a * goi[d];
          }
          for (int64_t d = 0; d < dqk; ++d) {
            dq[((first + i) * H + h) * dqk + d] += alpha * dx * kj[d];
            dk[((first + j) * H + h) * dqk + d] += alpha * dx * qi[d];
          }
          if (c.relative_bias) {
            dts[batch.bucket(b, i, j)] += dx;
            dpos[N - 1 + j - i] += dx;
          }
        }
      }
    }
  }

  // The kernel, in float64 on two chunks per sequence.
  const int64_t chunks = 2, threads = max_threads();
  const Sequences seqs = batch.sequences();
  const HstuShape<double> shape{H, dqk, dv, alpha, scale};
  const HstuTensors<double> in{{q.data(), H * dqk}, {k.data(), H * dqk}, {v.data(), H * dv}};
  MaskSource<double> mask;
  mask.kind = c.causal ? MaskKind::kCausal : MaskKind::kNone;
  const LogBucketizer bucketizer(batch.divisor, static_cast<int32_t>(batch.num_buckets));
  const BiasSource<double> bias =
      c.relative_bias ? batch.relative_bias(ts_w, pos_w, bucketizer) : BiasSource<double>{};
  std::vector<double> got(out.size(), 0.0);
  const ChannelLayout layout = ChannelLayout::heads(H, dv);
  hstu_forward(Fp32Precision<double>(seqs, shape, in, false), mask, {bias}, chunks, layout,
               got.data());
  expect_near_all(got, out, 1e-10, "out");

  std::vector<double> gdq(dq.size(), 0.0), gdk(chunks * dk.size(), 0.0),
      gdv(chunks * dv_ref.size(), 0.0), gts(threads * ts_w.size(), 0.0),
      gpos(threads * pos_w.size(), 0.0);
  HstuGrads<double> grads;
  grads.qkv = {gdq.data(), gdk.data(), gdv.data(), batch.rows, H, dqk, dv};
  if (c.relative_bias) {
    grads.bias[kSemantic].ts_w = gts.data();
    grads.bias[kSemantic].ts_thread_stride = static_cast<int64_t>(ts_w.size());
    grads.bias[kSemantic].pos_w = gpos.data();
    grads.bias[kSemantic].pos_thread_stride = static_cast<int64_t>(pos_w.size());
  }
  hstu_backward(Fp32Precision<double>(seqs, shape, in, true), go.data(), mask, {bias}, chunks,
                layout, grads);
  expect_near_all(gdq, dq, 1e-10, "dq");
  expect_near_all(sum_parts(gdk, dk.size()), dk, 1e-10, "dk");
  expect_near_all(sum_parts(gdv, dv_ref.size()), dv_ref, 1e-10, "dv");
  if (c.relative_bias) {
    expect_near_all(sum_parts(gts, ts_w.size()), dts, 1e-10, "d ts_w");
    expect_near_all(sum_parts(gpos, pos_w.size()), dpos, 1e-10, "d pos_w");
  }

  // fp32 (the run-time ISA variant's tiles) within fp32 rounding of the same reference.
  const auto to_float = [](const std::vector<double>& x) {
    return std::vector<float>(x.begin(), x.end());
  };
  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), tsf = to_float(ts_w),
             posf = to_float(pos_w);
  MaskSource<float> mask_f;
  mask_f.kind = mask.kind;
  const BiasSource<float> bias_f =
      c.relative_bias ? batch.relative_bias(tsf, posf, bucketizer) : BiasSource<float>{};
  std::vector<float> got_f(out.size(), 0.0f);
  const HstuTensors<float> in_f{{qf.data(), H * dqk}, {kf.data(), H * dqk}, {vf.data(), H * dv}};
  hstu_forward(Fp32Precision<float>(seqs, HstuShape<float>{H, dqk, dv, float(alpha), float(scale)},
                                    in_f, false),
               mask_f, {bias_f}, chunks, layout, got_f.data());
  expect_near_all(std::vector<double>(got_f.begin(), got_f.end()), out, 2e-5, "fp32 out");
}

// Queries described apart from their keys (Sequences: the last q_length positions, in rows of
// their own), as a step over cached keys has them: the outputs equal the full sequences' last
// rows, with the relative bias, on the same schedule and tiles; and the same keys read through
// a page table give the same outputs.
TEST_P(HstuKernel, QueriesAfterCachedKeysMatchTheFullSequences) {
  const Case c = GetParam();
  const Batch batch;
  const int64_t H = batch.heads, dqk = batch.dqk, dv = batch.dv, N = batch.max_len;
  const auto q = random_values(batch.rows * H * dqk, 21),
             k = random_values(batch.rows * H * dqk, 22);
  const auto v = random_values(batch.rows * H * dv, 23);
  const auto ts_w = random_values(batch.num_buckets + 1, 24), pos_w = random_values(2 * N - 1, 25);
  const HstuShape<double> shape{H, dqk, dv, 0.4, 1.0 / N};
  MaskSource<double> mask;
  mask.kind = c.causal ? MaskKind::kCausal : MaskKind::kNone;
  const LogBucketizer bucketizer(batch.divisor, static_cast<int32_t>(batch.num_buckets));
  const BiasSource<double> bias =
      c.relative_bias ? batch.relative_bias(ts_w, pos_w, bucketizer) : BiasSource<double>{};
  const HstuTensors<double> in{{q.data(), H * dqk}, {k.data(), H * dqk}, {v.data(), H * dv}};
  std::vector<double> full(batch.rows * H * dv, 0.0);
  const ChannelLayout layout = ChannelLayout::heads(H, dv);
  hstu_forward(Fp32Precision<double>(batch.sequences(), shape, in, false), mask, {bias}, 1, layout,
               full.data());

  const auto expect_delta_matches = [&](const std::vector<int64_t>& q_length) {
    std::vector<int64_t> q_row_begin(3);
    std::vector<double> q_new, q_time;
    for (int64_t b = 0, row = 0; b < 3; row += q_length[b], ++b) {
      q_row_begin[b] = row;
      const int64_t first = batch.row_begin[b] + batch.length[b] - q_length[b];
      q_new.insert(q_new.end(), q.begin() + first * H * dqk,
                   q.begin() + (first + q_length[b]) * H * dqk);
      q_time.insert(q_time.end(), batch.query_time.begin() + first,
                    batch.query_time.begin() + first + q_length[b]);
    }
    Sequences delta = batch.sequences();
    delta.q_row_begin = q_row_begin.data();
    delta.q_length = q_length.data();
    BiasSource<double> delta_bias = bias;
    delta_bias.query_time = q_time.data();
    const HstuTensors<double> in_new{{q_new.data(), H * dqk}, in.k, in.v};
    std::vector<double> got(q_new.size() / dqk * dv, 0.0);
    hstu_forward(Fp32Precision<double>(delta, shape, in_new, false), mask, {delta_bias}, 2, layout,
                 got.data());
    std::vector<double> want;
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t first = batch.row_begin[b] + batch.length[b] - q_length[b];
      want.insert(want.end(), full.begin() + first * H * dv,
                  full.begin() + (first + q_length[b]) * H * dv);
    }
    expect_near_all(got, want, 1e-12, "delta out");

    // The same keys in pages of 4 rows, in reverse order of pages (KeyRows' paged runs): the
    // same outputs exactly.
    const int64_t page_rows = 4, width = (N + page_rows - 1) / page_rows;
    int64_t pages = 0;
    for (int64_t b = 0; b < 3; ++b) pages += (batch.length[b] + page_rows - 1) / page_rows;
    std::vector<int64_t> table(3 * width, -1);
    std::vector<double> k_pages(pages * page_rows * H * dqk), v_pages(pages * page_rows * H * dv),
        t_pages(pages * page_rows);
    for (int64_t b = 0, next = pages - 1; b < 3; ++b) {
      for (int64_t key = 0; key < batch.length[b]; ++key) {
        if (key % page_rows == 0) table[b * width + key / page_rows] = next--;
        const int64_t slot = table[b * width + key / page_rows] * page_rows + key % page_rows;
        const int64_t row = batch.row_begin[b] + key;
        std::copy_n(k.begin() + row * H * dqk, H * dqk, k_pages.begin() + slot * H * dqk);
        std::copy_n(v.begin() + row * H * dv, H * dv, v_pages.begin() + slot * H * dv);
        t_pages[slot] = batch.key_time[row];
      }
    }
    Sequences paged = delta;
    paged.keys = KeyRows{nullptr, batch.length.data(), table.data(), width, page_rows};
    BiasSource<double> paged_bias = delta_bias;
    if (c.relative_bias) paged_bias.key_time = t_pages.data();
    const HstuTensors<double> in_pages{
        {q_new.data(), H * dqk}, {k_pages.data(), H * dqk}, {v_pages.data(), H * dv}};
    std::vector<double> from_pages(got.size(), 0.0);
    hstu_forward(Fp32Precision<double>(paged, shape, in_pages, false), mask, {paged_bias}, 2,
                 layout, from_pages.data());
    expect_near_all(from_pages, got, 1e-12, "paged delta out");
  };
  // The last 1, 5 (all) and 67 (or 64: one query block per sequence, K read in place) positions of
  // the three sequences, packed in rows of their own, with their query times.
  for (const std::vector<int64_t>& q_length :
       {std::vector<int64_t>{1, 5, 67}, std::vector<int64_t>{1, 5, kQueryBlock}}) {
    expect_delta_matches(q_length);
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, HstuKernel,
                         ::testing::Values(Case{true, false}, Case{true, true}, Case{false, false},
                                           Case{false, true}),
                         case_name);

// FuXi-alpha: the semantic channel (silu attention without bias), the time channel (M * ts bias)
// and the position channel (M * pos bias), channel-major in the output.
class FuxiKernel : public ::testing::TestWithParam<bool> {};

TEST_P(FuxiKernel, ForwardAndBackwardMatchScalarLoops) {
  const bool causal = GetParam();
  const Batch batch;
  const int64_t H = batch.heads, dqk = batch.dqk, dv = batch.dv, N = batch.max_len;
  const double alpha = 0.3, scale = 0.05;
  const auto q = random_values(batch.rows * H * dqk, 11),
             k = random_values(batch.rows * H * dqk, 12);
  const auto v = random_values(batch.rows * H * dv, 13);
  const auto ts_w = random_values(batch.num_buckets + 1, 15), pos_w = random_values(2 * N - 1, 16);
  ChannelLayout layout;
  layout.row_stride = 3 * H * dv;
  layout.head_stride = dv;
  layout.channel_offset[0] = 0;
  layout.channel_offset[1] = H * dv;
  layout.channel_offset[2] = 2 * H * dv;
  const auto go = random_values(batch.rows * layout.row_stride, 14);
  const std::vector<double> none;

  std::vector<double> out(batch.rows * layout.row_stride, 0.0), dq(batch.rows * H * dqk, 0.0),
      dk(dq.size(), 0.0), dv_ref(batch.rows * H * dv, 0.0), dts(ts_w.size(), 0.0),
      dpos(pos_w.size(), 0.0);
  for (size_t b = 0; b < batch.length.size(); ++b) {
    const int64_t first = batch.row_begin[b], len = batch.length[b];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const double* qi = &q[((first + i) * H + h) * dqk];
        for (int64_t j = 0; j < len; ++j) {
          if (!batch.visible(causal, i, j)) continue;
          const double* kj = &k[((first + j) * H + h) * dqk];
          const double* vj = &v[((first + j) * H + h) * dv];
          double s = 0;
          for (int64_t d = 0; d < dqk; ++d) s += qi[d] * kj[d];
          const double x = alpha * s;
          const double weight[3] = {silu(x) * scale, batch.bias(ts_w, none, b, i, j),
                                    batch.bias(none, pos_w, b, i, j)};
          double dweight[3] = {0, 0, 0};
          for (int c = 0; c < 3; ++c) {
            const int64_t o = (first + i) * layout.row_stride + layout.channel_offset[c] + h * dv;
            for (int64_t d = 0; d < dv; ++d) {
              out[o + d] += weight[c] * vj[d];
              dv_ref[((first + j) * H + h) * dv + d] += weight[c] * go[o + d];
              dweight[c] += go[o + d] * vj[d];
            }
          }
          const double dx = dweight[0] * scale * sigmoid(x) * (1 + x * (1 - sigmoid(x)));
          for (int64_t d = 0; d < dqk; ++d) {
            dq[((first + i) * H + h) * dqk + d] += alpha * dx * kj[d];
            dk[((first + j) * H + h) * dqk + d] += alpha * dx * qi[d];
          }
          dts[batch.bucket(b, i, j)] += dweight[1];
          dpos[N - 1 + j - i] += dweight[2];
        }
      }
    }
  }

  const int64_t chunks = 2, threads = max_threads();
  const HstuShape<double> shape{H, dqk, dv, alpha, scale};
  const HstuTensors<double> in{{q.data(), H * dqk}, {k.data(), H * dqk}, {v.data(), H * dv}};
  MaskSource<double> mask;
  mask.kind = causal ? MaskKind::kCausal : MaskKind::kNone;
  const LogBucketizer bucketizer(batch.divisor, static_cast<int32_t>(batch.num_buckets));
  BiasSource<double> time, position;
  time.kind = position.kind = BiasKind::kRelative;
  time.key_time = batch.key_time.data();
  time.query_time = batch.query_time.data();
  time.ts_w = ts_w.data();
  time.buckets = bucketizer.view();
  position.pos_w = pos_w.data();
  std::vector<double> got(out.size(), 0.0);
  const Sequences seqs = batch.sequences();
  hstu_forward(Fp32Precision<double>(seqs, shape, in, false), mask, {{{}, time, position}}, chunks,
               layout, got.data());
  expect_near_all(got, out, 1e-10, "out");

  std::vector<double> gdq(dq.size(), 0.0), gdk(chunks * dk.size(), 0.0),
      gdv(chunks * dv_ref.size(), 0.0), gts(threads * ts_w.size(), 0.0),
      gpos(threads * pos_w.size(), 0.0);
  HstuGrads<double> grads;
  grads.qkv = {gdq.data(), gdk.data(), gdv.data(), batch.rows, H, dqk, dv};
  grads.bias[kTime].ts_w = gts.data();
  grads.bias[kTime].ts_thread_stride = static_cast<int64_t>(ts_w.size());
  grads.bias[kPosition].pos_w = gpos.data();
  grads.bias[kPosition].pos_thread_stride = static_cast<int64_t>(pos_w.size());
  hstu_backward(Fp32Precision<double>(seqs, shape, in, true), go.data(), mask,
                {{{}, time, position}}, chunks, layout, grads);
  expect_near_all(gdq, dq, 1e-10, "dq");
  expect_near_all(sum_parts(gdk, dk.size()), dk, 1e-10, "dk");
  expect_near_all(sum_parts(gdv, dv_ref.size()), dv_ref, 1e-10, "dv");
  expect_near_all(sum_parts(gts, ts_w.size()), dts, 1e-10, "d ts_w");
  expect_near_all(sum_parts(gpos, pos_w.size()), dpos, 1e-10, "d pos_w");
}

INSTANTIATE_TEST_SUITE_P(Masks, FuxiKernel, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Causal" : "TwoSided");
                         });

}  // namespace
}  // namespace recops::attention::kernels
