// Which query blocks the HSTU-family kernels (HSTU, FuXi-alpha; fp32 and bf16) visit, and in
// what parallel order: the attention kernels' work loop (work_items.h: a sequence's chunk of
// interleaved query blocks, longest first on parallel_for_dynamic), each block meeting only the
// keys its mask lets it see (MaskSource::block). One loop serves every kernel: a thread builds its
// scratch once and runs the kernel's per-block work; backward adds each item's key-side gradients
// into its chunk's partial when the item ends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "recops/attention/kernels/bf16_layouts.h"
#include "recops/attention/kernels/tile_variants.h"
#include "recops/attention/kernels/work_items.h"
#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/mask_and_bias.h"
#include "recops/hstu/kernels/time_runs.h"

namespace recops::attention::kernels {

// The query rows of a tile of `seqs`: a block's most (seqs.query_block, or fewer when no sequence
// has that many queries, as in a serving step), padded to the precision's row granule.
inline int64_t tile_rows(const Sequences& seqs, int64_t granule) {
  return std::min(seqs.query_block, round_up(std::max<int64_t>(seqs.most_queries, 1), granule));
}

// Per-thread scratch: `count` tiles of `rows` x `keys` values (a kernel names them with its own
// enum), time-bucket indices for the relative bias, the time channel's scratch when it runs by
// runs of keys (sized on first use), and this thread's slot for per-thread partial results. The
// BLAS stays single-threaded while it lives.
template <typename T>
class TileArena {
 public:
  TileArena(int count, int64_t rows, int64_t keys, bool with_buckets, int64_t thread_slot)
      : tile_size_(rows * keys),
        values_(count * tile_size_),
        buckets_(with_buckets ? tile_size_ : 0),
        slot_(thread_slot) {}
  T* tile(int index) { return values_.data() + index * tile_size_; }
  int64_t tile_size() const { return tile_size_; }
  int32_t* buckets() { return buckets_.data(); }
  TimeRunScratch& time_runs() { return time_runs_; }
  int64_t slot() const { return slot_; }

 private:
  SingleThreadedBlas blas_;
  int64_t tile_size_;
  std::vector<T> values_;
  std::vector<int32_t> buckets_;
  TimeRunScratch time_runs_;
  int64_t slot_;
};

// Gradients of q, k, v: dQ rows belong to the work item that owns their query block; dK and dV
// accumulate in one partial per chunk (the adapter sums them), so items never share a row. With
// write_keys (one chunk, and no key row in two sequences: unwritten_key_rows) each item writes
// its key rows instead, and only the rows no item writes start at zero.
template <typename T>
struct QkvGrads {
  T* dq = nullptr;  // [rows, H, Dqk], written
  T* dk = nullptr;  // [chunks, rows, H, Dqk], accumulated (zero-initialised) or written
  T* dv = nullptr;  // [chunks, rows, H, Dv], accumulated (zero-initialised) or written
  int64_t rows = 0, heads = 1, dqk = 0, dv_dim = 0;
  bool write_keys = false;

  T* dk_partial(int64_t chunk) const { return dk + chunk * rows * heads * dqk; }
  T* dv_partial(int64_t chunk) const { return dv + chunk * rows * heads * dv_dim; }
};

// The current work item's key-side gradients, per thread: dK^T [H, dqk_pad, ld] and
// dV^T [H, dv_pad, ld] (dK = dS^T Q and dV = A^T dO accumulate transposed, from products whose left
// operand is the block's Q or dO read transposed), and dV in difference form (the time channel's,
// time_runs.h; allocated on first use), zeroed as the item begins (`granule`: how far past its
// keys a padded block accumulates) and added into the item's dK / dV partial, dK times
// `dk_scale` (a precision that leaves the scores' scale alpha out of its products), as it ends,
// through TileOps::transpose_scaled's register blocks (common/blas.h's element by element
// transposed add ran scalar: 3% of a training step's attention).
template <typename T>
class KeyGradients {
 public:
  KeyGradients(int64_t heads, int64_t dqk, int64_t dv, int64_t dqk_pad, int64_t dv_pad, int64_t ld,
               int64_t granule, T dk_scale = T(1))
      : heads_(heads),
        dqk_(dqk),
        dv_(dv),
        dqk_pad_(dqk_pad),
        dv_pad_(dv_pad),
        ld_(ld),
        granule_(granule),
        dk_scale_(dk_scale),
        passes_(&tile_ops<T>()),
        dk_t_(new T[heads * dqk_pad * ld]),
        dv_t_(new T[heads * dv_pad * ld]) {}

  void begin_item(int64_t length) {
    const int64_t keys = std::min(ld_, (length + granule_ - 1) / granule_ * granule_);
    for (int64_t c = 0; c < heads_ * dqk_pad_; ++c) std::fill_n(dk_t_.get() + c * ld_, keys, T(0));
    for (int64_t c = 0; c < heads_ * dv_pad_; ++c) std::fill_n(dv_t_.get() + c * ld_, keys, T(0));
    for (int64_t h = 0; h < heads_ && !diffs_.empty(); ++h) {
      std::fill_n(value_differences(h), (length + 1) * dv_, 0.0);
    }
  }
  // Column key0 (a key of the item's sequence) of head h's dK^T / dV^T (leading dimension ld()).
  T* dk_t(int64_t h, int64_t key0) { return dk_t_.get() + h * dqk_pad_ * ld_ + key0; }
  T* dv_t(int64_t h, int64_t key0) { return dv_t_.get() + h * dv_pad_ * ld_ + key0; }
  int64_t ld() const { return ld_; }
  // Head h's value gradients as differences by key position: rows of dv doubles, key j's gradient
  // the sum of rows [0, j] (time_runs.h's time_runs_backward), made so as the item finishes.
  double* value_differences(int64_t h) {
    if (diffs_.empty()) diffs_.assign(heads_ * (ld_ + 1) * dv_, 0.0);
    return diffs_.data() + h * (ld_ + 1) * dv_;
  }

  // Sums the value differences over the item's `length` keys, in place: row j becomes key j's.
  void finish_item(int64_t length) {
    for (int64_t h = 0; h < heads_ && !diffs_.empty(); ++h) {
      double* row = value_differences(h);
      for (int64_t j = 1; j < length; ++j) {
        for (int64_t d = 0; d < dv_; ++d) row[j * dv_ + d] += row[(j - 1) * dv_ + d];
      }
    }
  }

  // Adds (or, accumulate false, writes) dK^T / dV^T of keys [key0, key0 + n) into n rows of
  // dK [rows, H, Dqk] and dV [rows, H, Dv] (pointers at key0's row), and then the summed value
  // differences (finish_item).
  void end_item(int64_t key0, int64_t n, T* dk, T* dv, bool accumulate) {
    for (int64_t h = 0; h < heads_; ++h) {
      passes_->transpose_scaled(dk_t(h, key0), dqk_, n, ld_, dk + h * dqk_, heads_ * dqk_,
                                dk_scale_, accumulate);
      passes_->transpose_scaled(dv_t(h, key0), dv_, n, ld_, dv + h * dv_, heads_ * dv_, T(1),
                                accumulate);
      if (diffs_.empty()) continue;
      const double* sums = value_differences(h) + key0 * dv_;
      for (int64_t j = 0; j < n; ++j) {
        T* row = dv + j * heads_ * dv_ + h * dv_;
        for (int64_t d = 0; d < dv_; ++d) row[d] += static_cast<T>(sums[j * dv_ + d]);
      }
    }
  }

 protected:  // the shape, for the block operands a precision adds
  int64_t heads_, dqk_, dv_, dqk_pad_, dv_pad_, ld_, granule_;

 private:
  T dk_scale_;
  const TileOps<T>* passes_;
  std::unique_ptr<T[]> dk_t_, dv_t_;  // uninitialised; begin_item zeroes what an item uses
  std::vector<double> diffs_;         // [H, ld + 1, dv] once value_differences is first used
};

// Per-thread scratch of a backward kernel: its tiles and its gradient accumulators (a
// KeyGradients with the block operands of its precision).
template <typename Tiles, typename Grads>
struct BackwardScratch {
  Tiles tiles;
  Grads grads;
};

// Query rows [row0, row0 + rows) of sequence b's queries, with the keys `mask` lets them see.
template <typename T>
Block query_block(const Sequences& seqs, const MaskSource<T>& mask, int64_t b, int64_t row0,
                  int64_t rows) {
  return mask.block(b, seqs.keys.length[b], seqs.first_query(b) + row0, rows);
}

// Runs fn(scratch, block) for every query block of every work item that sees a key, in parallel:
// make_scratch(slot) builds a thread's scratch once, and begin_item(scratch, item) and
// end_item(scratch, item) run around an item's blocks.
template <typename T, typename MakeScratch, typename BeginItem, typename Fn, typename EndItem>
void for_each_item_block(const Sequences& seqs, const MaskSource<T>& mask, int64_t chunks,
                         MakeScratch&& make_scratch, BeginItem&& begin_item, Fn&& fn,
                         EndItem&& end_item) {
  for_each_work_item(
      seqs.q_length, seqs.count, chunks, seqs.query_block, make_scratch, begin_item,
      [&](auto& scratch, const WorkItem& item, int64_t row0, int64_t rows) {
        const Block blk = query_block(seqs, mask, item.sequence, row0, rows);
        if (blk.keys > 0) fn(scratch, blk);
      },
      end_item);
}

// A forward block's keys are split between threads in parts of whole multiples of this many keys
// (so that a part past the first starts where the bf16 padding of keys would start it), and of at
// least kMinPartKeys keys.
constexpr int64_t kKeyPartGranule = 64;
constexpr int64_t kMinPartKeys = 512;

// The parts the forward splits each block's keys into: 1, unless the batch has fewer query blocks
// than there are threads (a serving step: a few long sequences with a few new rows each), when
// the threads share the keys instead. HSTU-family attention has no softmax, so the parts' outputs
// add up to the block's.
inline int64_t forward_key_parts(const Sequences& seqs) {
  int64_t blocks = 0;
  for (int64_t b = 0; b < seqs.count; ++b)
    blocks += query_blocks(seqs.q_length[b], seqs.query_block);
  const int64_t threads = max_threads();
  if (blocks == 0 || blocks >= threads) return 1;
  return std::max<int64_t>(1,
                           std::min((threads + blocks - 1) / blocks, seqs.longest / kMinPartKeys));
}

// The forward kernels' loop: fn(scratch, block, part) for every block, scratch =
// make_scratch(slot); with parts > 1 (forward_key_parts), for every part of every block: the
// block with the part's keys, part p's starting at a multiple of kKeyPartGranule unless p = 0.
template <typename T, typename MakeScratch, typename Fn>
void for_each_block_in_parallel(const Sequences& seqs, const MaskSource<T>& mask, int64_t chunks,
                                int64_t parts, MakeScratch&& make_scratch, Fn&& fn) {
  const auto nothing = [](auto&, const WorkItem&) {};
  if (parts == 1) {
    for_each_item_block(
        seqs, mask, chunks, make_scratch, nothing,
        [&](auto& scratch, const Block& blk) { fn(scratch, blk, int64_t{0}); }, nothing);
    return;
  }
  std::vector<Block> blocks;  // fewer than the threads (forward_key_parts)
  for (int64_t b = 0; b < seqs.count; ++b) {
    for_each_query_block(seqs.q_length[b], WorkItem{b, 0}, 1, seqs.query_block,
                         [&](int64_t row0, int64_t rows) {
                           const Block blk = query_block(seqs, mask, b, row0, rows);
                           if (blk.keys > 0) blocks.push_back(blk);
                         });
  }
  parallel_for_dynamic(
      static_cast<int64_t>(blocks.size()) * parts, make_scratch, [&](auto& scratch, int64_t i) {
        const Block& whole = blocks[i / parts];
        const int64_t part = i % parts, end = whole.key0 + whole.keys;
        const int64_t span = (whole.keys + parts - 1) / parts;
        const auto cut = [&](int64_t p) {
          return p == 0 ? whole.key0
                        : std::min(end, round_up(whole.key0 + p * span, kKeyPartGranule));
        };
        Block blk = whole;
        blk.key0 = cut(part);
        blk.keys = cut(part + 1) - blk.key0;  // cut(parts) = end
        if (blk.keys > 0) fn(scratch, blk, part);
      });
}

using RowGaps = std::vector<std::pair<int64_t, int64_t>>;

// The rows [begin, end) of [0, rows) outside every run of `runs` (sorted here); none (nullopt)
// when two runs overlap.
inline std::optional<RowGaps> rows_outside(RowGaps runs, int64_t rows) {
  std::sort(runs.begin(), runs.end());
  RowGaps gaps;
  int64_t next = 0;  // the first row past the runs so far
  for (const auto& [begin, end] : runs) {
    if (begin < next) return std::nullopt;
    if (begin > next) gaps.emplace_back(next, begin);
    next = end;
  }
  if (next < rows) gaps.emplace_back(next, rows);
  return gaps;
}

// The rows of dK and dV (of `rows` rows) that no backward item writes when each sequence with
// queries is one item (one chunk): the rows outside every such sequence's keys. None (nullopt)
// when two of those sequences share a key row, whose gradients must then add up.
inline std::optional<RowGaps> unwritten_key_rows(const Sequences& seqs, int64_t rows) {
  RowGaps runs;
  for (int64_t b = 0; b < seqs.count; ++b) {
    if (seqs.q_length[b] == 0) continue;  // no item
    seqs.keys.for_each_run(b, 0, seqs.keys.length[b], [&](int64_t row, int64_t, int64_t n) {
      runs.emplace_back(row, row + n);
    });
  }
  return rows_outside(std::move(runs), rows);
}

// The rows of an output or of dQ (of `rows` rows) that no block writes: the rows outside every
// sequence's query rows (every query row is in one block, which sees at least one key and writes
// the row). None (nullopt) when two sequences share a query row.
inline std::optional<RowGaps> unwritten_query_rows(const Sequences& seqs, int64_t rows) {
  RowGaps runs;
  for (int64_t b = 0; b < seqs.count; ++b) {
    if (seqs.q_length[b] > 0) {
      runs.emplace_back(seqs.q_row_begin[b], seqs.q_row_begin[b] + seqs.q_length[b]);
    }
  }
  return rows_outside(std::move(runs), rows);
}

// The backward kernels' loop: as for_each_block_in_parallel, with the thread's key-side gradient
// accumulators in scratch.grads (a KeyGradients, bf16's Bf16Gradients) zeroed as an item
// begins and added into its chunk's dK, dV partial, run by run of key rows, as it ends.
template <typename T, typename G, typename MakeScratch, typename Fn>
void for_each_backward_block(const Sequences& seqs, const MaskSource<T>& mask, int64_t chunks,
                             const QkvGrads<G>& qkv, MakeScratch&& make_scratch, Fn&& fn) {
  for_each_item_block(
      seqs, mask, chunks, make_scratch,
      [&](auto& scratch, const WorkItem& item) {
        scratch.grads.begin_item(seqs.keys.length[item.sequence]);
      },
      fn,
      [&](auto& scratch, const WorkItem& item) {
        const int64_t b = item.sequence;
        scratch.grads.finish_item(seqs.keys.length[b]);
        seqs.keys.for_each_run(b, 0, seqs.keys.length[b], [&](int64_t row, int64_t key, int64_t n) {
          scratch.grads.end_item(key, n, qkv.dk_partial(item.chunk) + row * qkv.heads * qkv.dqk,
                                 qkv.dv_partial(item.chunk) + row * qkv.heads * qkv.dv_dim,
                                 !qkv.write_keys);
        });
      });
}

}  // namespace recops::attention::kernels
