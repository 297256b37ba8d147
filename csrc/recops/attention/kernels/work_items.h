// Work decomposition and the one parallel work loop of the tiled attention kernels (HSTU,
// FuXi-alpha, DeBERTa).
//
// A unit is one independent attention problem (an HSTU sequence with all its heads, a DeBERTa
// (batch, head) pair) whose query rows are cut into blocks of at most kQueryBlock rows (a kernel
// family may choose fewer: HSTU's blocks over whole sequences, batch.h). A work item is
// (unit, chunk): chunk c of a unit owns its query blocks c, c + C, c + 2C, ... (interleaved, so
// causal chunks cost the same). Items that write disjoint query rows own them; key-side gradients
// go to per-chunk partials that the adapter sums. Units are ordered longest first so that
// parallel_for_dynamic balances them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "recops/common/parallel.h"

namespace recops::attention::kernels {

constexpr int64_t kQueryBlock = 64;

struct WorkItem {
  int64_t sequence, chunk;
};

// The query blocks of a unit with `length` query rows, in blocks of block_rows.
inline int64_t query_blocks(int64_t length, int64_t block_rows) {
  return (length + block_rows - 1) / block_rows;
}

// Items (unit, chunk) for units of length[0..count) query rows, longest first; a unit gets at
// most one chunk per query block.
inline std::vector<WorkItem> make_work_items(const int64_t* length, int64_t count, int64_t chunks,
                                             int64_t block_rows) {
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return length[a] > length[b]; });
  std::vector<WorkItem> items;
  for (const int64_t u : order) {
    for (int64_t c = 0; c < std::min(chunks, query_blocks(length[u], block_rows)); ++c)
      items.push_back({u, c});
  }
  return items;
}

// Calls fn(row0, rows) for the query blocks of one item of a unit with `length` query rows.
template <typename Fn>
void for_each_query_block(int64_t length, const WorkItem& item, int64_t chunks, int64_t block_rows,
                          Fn&& fn) {
  for (int64_t qb = item.chunk, blocks = query_blocks(length, block_rows); qb < blocks;
       qb += chunks) {
    const int64_t row0 = qb * block_rows;
    fn(row0, std::min(block_rows, length - row0));
  }
}

// The one parallel loop of the tiled attention kernels: the work items of `units` units (unit u
// has length[u] query rows, in blocks of block_rows <= kQueryBlock), longest first on
// parallel_for_dynamic. A thread builds its scratch once (make_scratch(slot)); per item it calls
// begin_item(scratch, item), then block(scratch, item, row0, rows) for each of the item's query
// blocks, then end_item(scratch, item).
template <typename MakeScratch, typename BeginItem, typename BlockFn, typename EndItem>
void for_each_work_item(const int64_t* length, int64_t units, int64_t chunks, int64_t block_rows,
                        MakeScratch&& make_scratch, BeginItem&& begin_item, BlockFn&& block,
                        EndItem&& end_item) {
  const std::vector<WorkItem> items = make_work_items(length, units, chunks, block_rows);
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()), make_scratch, [&](auto& scratch, int64_t index) {
        const WorkItem item = items[index];
        begin_item(scratch, item);
        for_each_query_block(length[item.sequence], item, chunks, block_rows,
                             [&](int64_t row0, int64_t rows) { block(scratch, item, row0, rows); });
        end_item(scratch, item);
      });
}

// Chunks per unit so that a few long units still give every thread about two items (each chunk
// adds one fp32 copy of the key-side gradients).
inline int64_t choose_chunks(int64_t units, int64_t threads) {
  const int64_t wanted = 2 * threads;
  return std::max<int64_t>(1, (wanted + units - 1) / std::max<int64_t>(1, units));
}

}  // namespace recops::attention::kernels
