// Which query blocks the HSTU-family kernels (HSTU, FuXi-alpha; fp32 and bf16) visit, and in
// what parallel order: the attention kernels' work loop (work_items.h: a sequence's chunk of
// interleaved query blocks, longest first on parallel_for_dynamic), each block meeting only the
// keys its mask lets it see (MaskSource::block). One loop serves every kernel: a thread builds its
// scratch once and runs the kernel's per-block work; backward adds each item's key-side gradients
// into its chunk's partial when the item ends.
#pragma once

#include <cstdint>
#include <vector>

#include "recops/attention/kernels/work_items.h"
#include "recops/common/blas.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Per-thread scratch: `count` tiles of kQueryBlock x N values (a kernel names them with its own
// enum), time-bucket indices for the relative bias, and this thread's slot for per-thread partial
// results. The BLAS stays single-threaded while it lives.
template <typename T>
class TileArena {
 public:
  TileArena(int count, int64_t max_len, bool with_buckets, int64_t thread_slot)
      : tile_size_(kQueryBlock * max_len),
        values_(count * tile_size_),
        buckets_(with_buckets ? tile_size_ : 0),
        slot_(thread_slot) {}
  T* tile(int index) { return values_.data() + index * tile_size_; }
  int32_t* buckets() { return buckets_.data(); }
  int64_t slot() const { return slot_; }

 private:
  SingleThreadedBlas blas_;
  int64_t tile_size_;
  std::vector<T> values_;
  std::vector<int32_t> buckets_;
  int64_t slot_;
};

// Gradients of q, k, v: dQ rows belong to the work item that owns their query block; dK and dV
// accumulate in one partial per chunk (the adapter sums them), so items never share a row.
template <typename T>
struct QkvGrads {
  T* dq = nullptr;  // [rows, H, Dqk], written
  T* dk = nullptr;  // [chunks, rows, H, Dqk], accumulated (zero-initialised)
  T* dv = nullptr;  // [chunks, rows, H, Dv], accumulated (zero-initialised)
  int64_t rows = 0, heads = 1, dqk = 0, dv_dim = 0;

  T* dk_partial(int64_t chunk) const { return dk + chunk * rows * heads * dqk; }
  T* dv_partial(int64_t chunk) const { return dv + chunk * rows * heads * dv_dim; }
};

// Runs fn(scratch, block) for every query block of every work item that sees a key, in parallel:
// make_scratch(slot) builds a thread's scratch once, and begin_item(scratch, item) and
// end_item(scratch, item) run around an item's blocks.
template <typename T, typename MakeScratch, typename BeginItem, typename Fn, typename EndItem>
void for_each_item_block(const Sequences& seqs, const MaskSource<T>& mask, int64_t chunks,
                         MakeScratch&& make_scratch, BeginItem&& begin_item, Fn&& fn,
                         EndItem&& end_item) {
  for_each_work_item(
      seqs.q_length, seqs.count, chunks, make_scratch, begin_item,
      [&](auto& scratch, const WorkItem& item, int64_t row0, int64_t rows) {
        const int64_t b = item.sequence;
        const Block blk = mask.block(b, seqs.keys.length[b], seqs.first_query(b) + row0, rows);
        if (blk.keys > 0) fn(scratch, blk);
      },
      end_item);
}

// The forward kernels' loop: fn(scratch, block) for every block, scratch = make_scratch(slot).
template <typename T, typename MakeScratch, typename Fn>
void for_each_block_in_parallel(const Sequences& seqs, const MaskSource<T>& mask, int64_t chunks,
                                MakeScratch&& make_scratch, Fn&& fn) {
  const auto nothing = [](auto&, const WorkItem&) {};
  for_each_item_block(seqs, mask, chunks, make_scratch, nothing, fn, nothing);
}

// The backward kernels' loop: as for_each_block_in_parallel, with the thread's key-side gradient
// accumulators in scratch.grads (fp32 TransposedGradients or bf16 Bf16Gradients) zeroed as an item
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
        seqs.keys.for_each_run(b, 0, seqs.keys.length[b], [&](int64_t row, int64_t key, int64_t n) {
          scratch.grads.end_item(key, n, qkv.dk_partial(item.chunk) + row * qkv.heads * qkv.dqk,
                                 qkv.dv_partial(item.chunk) + row * qkv.heads * qkv.dv_dim);
        });
      });
}

}  // namespace recops::attention::kernels
