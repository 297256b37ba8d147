// FuXi-alpha's time channel, O_t = (M * ts_w[bucket(|tq_i - t_j|)]) V under a structured mask M,
// as sums over runs of keys instead of a tile product. The keys a query row sees fall in few runs
// of one bucket when the timestamps are chronological (a bucket spans a factor e^0.301 of time
// deltas; in the models' training batches a row saw 64 keys in 8 runs at ML-100K N = 200 and
// 392 keys in 15 runs at N = 1024), and a run's weights are equal, so the row is a sum over its
// runs of the weight times the run's sum of value rows: a difference of two running sums of V,
// kept per sequence in double so that the difference loses nothing to cancellation. The backward
// takes the table's gradient from the same run sums (dO_t . sum) and gives each key of a run the
// value gradient w dO_t as two differences (diffs[begin] += w dO_t, diffs[end] -= w dO_t), summed
// over the keys once per work item (KeyGradients). Any order of timestamps gives the right sums;
// unordered ones only make the runs shorter. A custom mask's multipliers vary inside a run, so
// under one the channel keeps its tile (mask_and_bias.h's build_bias_tile).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "recops/common/half_bits.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Whether a channel is the time table alone under a structured mask: the channel summed over runs.
template <typename T>
bool time_channel_by_runs(const BiasSource<T>& bias, const MaskSource<T>& mask) {
  return bias.kind == BiasKind::kRelative && bias.ts_w != nullptr && bias.pos_w == nullptr &&
         mask.kind != MaskKind::kCustom;
}

// Blocks whose queries see fewer keys keep the channel's tile: a row's runs cost a few tens of
// cycles each to find and add (a branch mispredicted where each ends, the bucket of the next),
// its tile product a few cycles a key. Measured with every block by runs (the whole FuXi-alpha
// attention, fp32 forward and backward, one head of 50, chronological times, 2 threads, against
// the tiles alone): sequences all of 128 keys (rows see 64 on average) 20-25% slower, of 256
// alike, of 512 7-8% faster, the synthetic N = 1024 batch (392) 5-15% faster. And blocks of a few
// query rows keep it too: the running sums of V cost about a row's tile product (a serving step
// of 1 or 4 new rows over 2048 cached keys, B = 16, H = 2, D = 64: 15-20% slower by runs, of 32
// rows 10-40% faster).
constexpr int64_t kTimeRunMinKeys = 192, kTimeRunMinRows = 8;

// Whether a block's time channel goes by runs (when time_channel_by_runs).
inline bool time_runs_pay(const Block& blk) {
  return blk.keys >= kTimeRunMinKeys && blk.rows >= kTimeRunMinRows;
}

// An input or output element as a double and back (bf16 as its bits).
inline double element_value(float x) {
  return x;
}
inline double element_value(double x) {
  return x;
}
inline double element_value(uint16_t bf16) {
  return float_from_bf16_bits(bf16);
}
template <typename E>
E element_of(double x) {
  if constexpr (std::is_same_v<E, uint16_t>) {
    return bf16_bits_from_float(static_cast<float>(x));
  } else {
    return static_cast<E>(x);
  }
}

// A thread's scratch for the time channel, sized on first use by the longest sequence: the
// running sums of one sequence's value rows, one query row's runs and a row of dv values.
class TimeRunScratch {
 public:
  // Makes value_sums() sequence b's, from its value rows v: built unless b was the last sequence.
  template <typename E>
  void use_sequence(const Sequences& seqs, const Rows<E>& v, int64_t heads, int64_t dv, int64_t b) {
    if (b == sequence_) return;
    if (runs_.empty()) {  // first use
      // Zero padding past the last row: time_runs_forward reads whole vectors of lanes.
      sums_.resize(heads * (seqs.longest + 1) * dv + kTimeRunVectors * kTimeRunLanes);
      runs_.resize(std::max<int64_t>(seqs.longest, 1));
      row_.resize(dv);
    }
    const int64_t length = seqs.keys.length[b];
    head_size_ = (length + 1) * dv;
    for (int64_t h = 0; h < heads; ++h) {
      double* sum = sums_.data() + h * head_size_;
      std::fill_n(sum, dv, 0.0);
      seqs.keys.for_each_run(b, 0, length, [&](int64_t row, int64_t key, int64_t n) {
        for (int64_t j = 0; j < n; ++j) {
          const E* x = v.at(row + j, h, dv);
          const double* before = sum + (key + j) * dv;
          double* after = sum + (key + j + 1) * dv;
          for (int64_t d = 0; d < dv; ++d) after[d] = before[d] + element_value(x[d]);
        }
      });
    }
    sequence_ = b;
  }

  // Head h's running sums: row j (of dv doubles) is the sum of the value rows of keys [0, j), for
  // j up to the sequence's length.
  const double* value_sums(int64_t h) const { return sums_.data() + h * head_size_; }
  TimeRun* runs() { return runs_.data(); }  // a query row's (at most one a key)
  double* row() { return row_.data(); }

 private:
  int64_t sequence_ = -1, head_size_ = 0;
  std::vector<double> sums_;
  std::vector<TimeRun> runs_;
  std::vector<double> row_;
};

// fn(r, count) for each query row r of a block, with the keys r sees (for_each_row_runs) cut into
// `count` runs of one time bucket in t.runs(), and t's value sums made sequence blk.b's (from v).
template <typename T, typename E, typename Fn>
void for_each_row_time_runs(const BiasSource<T>& src, const MaskSource<T>& mask,
                            const Sequences& seqs, const Rows<E>& v, int64_t heads, int64_t dv,
                            const Block& blk, TimeRunScratch& t, Fn&& fn) {
  t.use_sequence(seqs, v, heads, dv, blk.b);
  for_each_row_runs(mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int n) {
    const double query_time = src.query_time[seqs.query_row(blk.b, blk.row0 + r)];
    int64_t count = 0;
    for (int k = 0; k < n; ++k) {
      seqs.keys.for_each_run(blk.b, blk.key0 + begin[k], end[k] - begin[k],
                             [&](int64_t row, int64_t key, int64_t keys) {
                               count += src.passes->time_bucket_runs(src.key_time + row, keys, key,
                                                                     query_time, src.buckets,
                                                                     t.runs() + count);
                             });
    }
    fn(r, count);
  });
}

// The time channel's output rows of a block, every head: out is head 0's at the block's first
// query row, rows ld_out apart and heads head_stride apart; v the value rows.
template <typename T, typename E>
void time_channel_forward(const BiasSource<T>& src, const MaskSource<T>& mask,
                          const Sequences& seqs, const Rows<E>& v, int64_t heads, int64_t dv,
                          const Block& blk, TimeRunScratch& t, E* out, int64_t ld_out,
                          int64_t head_stride) {
  for_each_row_time_runs(src, mask, seqs, v, heads, dv, blk, t, [&](int64_t r, int64_t count) {
    for (int64_t h = 0; h < heads; ++h) {
      src.passes->time_runs_forward(t.runs(), count, src.ts_w, t.value_sums(h), dv, t.row());
      E* o = out + r * ld_out + h * head_stride;
      for (int64_t d = 0; d < dv; ++d) o[d] = element_of<E>(t.row()[d]);
    }
  });
}

// The time channel's backward over a block, every head: grad_out addressed as
// time_channel_forward's out; the table's gradient added to ts_grad (null: not wanted), the value
// rows' to the item's differences (grads.value_differences(h), KeyGradients).
template <typename T, typename E, typename Grads>
void time_channel_backward(const BiasSource<T>& src, const MaskSource<T>& mask,
                           const Sequences& seqs, const Rows<E>& v, int64_t heads, int64_t dv,
                           const Block& blk, TimeRunScratch& t, const E* grad_out, int64_t ld_go,
                           int64_t head_stride, Grads& grads, double* ts_grad) {
  for_each_row_time_runs(src, mask, seqs, v, heads, dv, blk, t, [&](int64_t r, int64_t count) {
    for (int64_t h = 0; h < heads; ++h) {
      const E* go = grad_out + r * ld_go + h * head_stride;
      for (int64_t d = 0; d < dv; ++d) t.row()[d] = element_value(go[d]);
      src.passes->time_runs_backward(t.runs(), count, src.ts_w, t.value_sums(h), dv, t.row(),
                                     grads.value_differences(h), ts_grad);
    }
  });
}

}  // namespace recops::attention::kernels
