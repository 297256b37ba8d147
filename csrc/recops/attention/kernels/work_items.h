// Work decomposition shared by the tiled attention kernels (HSTU, DeBERTa).
//
// A unit is one independent attention problem (an HSTU sequence with all its heads, a DeBERTa
// (batch, head) pair) whose query rows are cut into blocks of kQueryBlock rows. A work item is
// (unit, chunk): chunk c of a unit owns its query blocks c, c + C, c + 2C, ... (interleaved, so
// causal chunks cost the same). Items that write disjoint query rows own them; key-side gradients
// go to per-chunk partials that the adapter sums. Units are ordered longest first so that
// parallel_for_dynamic balances them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace recops::attention::kernels {

constexpr int64_t kQueryBlock = 64;

struct WorkItem {
  int64_t sequence, chunk;
};

// Items (unit, chunk) for units of length[0..count) query rows, longest first; a unit gets at
// most one chunk per query block.
inline std::vector<WorkItem> make_work_items(const int64_t* length, int64_t count, int64_t chunks) {
  std::vector<int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return length[a] > length[b]; });
  std::vector<WorkItem> items;
  for (const int64_t u : order) {
    const int64_t blocks = (length[u] + kQueryBlock - 1) / kQueryBlock;
    for (int64_t c = 0; c < std::min(chunks, blocks); ++c) items.push_back({u, c});
  }
  return items;
}

// Calls fn(row0, rows) for the query blocks of one item of a unit with `length` query rows.
template <typename Fn>
void for_each_query_block(int64_t length, const WorkItem& item, int64_t chunks, Fn&& fn) {
  const int64_t blocks = (length + kQueryBlock - 1) / kQueryBlock;
  for (int64_t qb = item.chunk; qb < blocks; qb += chunks) {
    const int64_t row0 = qb * kQueryBlock;
    fn(row0, std::min(kQueryBlock, length - row0));
  }
}

// Chunks per unit so that a few long units still give every thread about two items (each chunk
// adds one fp32 copy of the key-side gradients).
inline int64_t choose_chunks(int64_t units, int64_t threads) {
  const int64_t wanted = 2 * threads;
  return std::max<int64_t>(1, (wanted + units - 1) / std::max<int64_t>(1, units));
}

}  // namespace recops::attention::kernels
