// Groups the occurrences of each (table, row) of a batch, for the exact backward: every index
// becomes a 32- or 64-bit key (row, then what the occurrence contributes) in its table's block,
// and a stable LSD radix sort of each block brings all occurrences of one row together, in
// position order, across bags and across the features that share the table. Compiled per
// instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/bags.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// Number of bits needed to write every value below `bound` (0 for bound <= 1).
inline int bits_below(uint64_t bound) {
  return bound <= 1 ? 0 : 64 - __builtin_clzll(bound - 1);
}

struct Table {
  int64_t rows;
  int64_t D;
  int64_t weights_offset;
  int64_t state_offset[kMaxStates];  // first element of the table in each state buffer
};

// The distinct tables behind the features, in weights order. Features with one weights offset
// share a table, except that an empty table shares its offset with the next table without being
// it (validated by the adapter: features on one non-empty table agree on its rows and dim).
struct Tables {
  std::vector<Table> tables;
  std::vector<int64_t> feature_table;  // [T]: index into tables

  Tables(const FeatureLayout& layout, const int64_t* const* state_offsets) {
    const int64_t T = layout.num_features;
    const auto key = [&](int64_t t) {
      return std::make_tuple(layout.weights_offsets[t], layout.rows[t],
                             layout.D_offsets[t + 1] - layout.D_offsets[t]);
    };
    std::vector<int64_t> order(T);
    for (int64_t t = 0; t < T; ++t) order[t] = t;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return key(a) < key(b); });
    feature_table.resize(T);
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t t = order[i];
      if (i == 0 || key(order[i - 1]) != key(t)) {
        Table table{layout.rows[t],
                    layout.D_offsets[t + 1] - layout.D_offsets[t],
                    layout.weights_offsets[t],
                    {}};
        for (int k = 0; k < kMaxStates; ++k) {
          table.state_offset[k] = state_offsets[k] != nullptr ? state_offsets[k][t] : 0;
        }
        tables.push_back(table);
      }
      feature_table[t] = static_cast<int64_t>(tables.size()) - 1;
    }
  }
};

// The occurrences of the batch's indices grouped into runs of one row each, table by table in
// row order. Run j of table i is row tables[i].row[j] with occurrences
// [tables[i].begin[j], tables[i].begin[j + 1]) in sorted order; occurrence k reads
// grad_output[source[k] : + D] scaled by scale[k] (scale is null when every scale is 1).
// first_run[i] numbers table i's runs after the previous tables' runs.
struct RowRuns {
  struct TableRuns {
    std::vector<int64_t> row;    // [runs]: local row
    std::vector<int64_t> begin;  // [runs + 1]: the last entry is the end of the table's block
  };
  std::vector<TableRuns> tables;
  std::vector<int64_t> first_run;     // [tables + 1]
  std::unique_ptr<int64_t[]> source;  // [occurrences]
  std::unique_ptr<float[]> scale;     // [occurrences] or null

  int64_t num_runs() const { return first_run.empty() ? 0 : first_run.back(); }
};

// Stable LSD radix sort of keys[0, n) on bits [low_bit, low_bit + num_bits), in digits of at
// most kMaxDigitBits; each pass counts digits per chunk in parallel, then scatters in parallel.
// Returns the buffer (keys or scratch) that holds the result.
constexpr int kMaxDigitBits = 11;
constexpr int64_t kMinSortChunk = 1 << 14;

template <typename key_t>
key_t* radix_sort(key_t* keys, key_t* scratch, int64_t n, int low_bit, int num_bits) {
  if (n <= 1 || num_bits == 0) return keys;
  const int passes = (num_bits + kMaxDigitBits - 1) / kMaxDigitBits;
  const int digit_bits = (num_bits + passes - 1) / passes;
  const int64_t radix = int64_t{1} << digit_bits;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(max_threads(), n / kMinSortChunk));
  const int64_t chunk_size = (n + chunks - 1) / chunks;
  std::vector<int64_t> counts(chunks * radix);
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = low_bit + pass * digit_bits;
    const key_t mask = static_cast<key_t>(radix - 1);
    parallel_for(0, chunks, 1, [&](int64_t c_begin, int64_t c_end) {
      for (int64_t c = c_begin; c < c_end; ++c) {
        int64_t* count = counts.data() + c * radix;
        std::fill(count, count + radix, 0);
        for (int64_t i = c * chunk_size; i < std::min(n, (c + 1) * chunk_size); ++i) {
          ++count[(keys[i] >> shift) & mask];
        }
      }
    });
    int64_t next = 0;  // digit-major, then chunk: the chunks of one digit stay in order
    for (int64_t digit = 0; digit < radix; ++digit) {
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t count = counts[c * radix + digit];
        counts[c * radix + digit] = next;
        next += count;
      }
    }
    parallel_for(0, chunks, 1, [&](int64_t c_begin, int64_t c_end) {
      for (int64_t c = c_begin; c < c_end; ++c) {
        int64_t* slot = counts.data() + c * radix;
        for (int64_t i = c * chunk_size; i < std::min(n, (c + 1) * chunk_size); ++i) {
          scratch[slot[(keys[i] >> shift) & mask]++] = keys[i];
        }
      }
    });
    std::swap(keys, scratch);
  }
  return keys;
}

// Splits a table block of sorted keys (local_row << shift | payload), occurrences [begin, end)
// with occurrence k at block[k - begin], into runs of one row, and lays out each occurrence's
// gradient source and scale (looked up by payload) in sorted order, so the update streams
// through them.
template <typename key_t>
void collect_runs(const key_t* block, int64_t begin, int64_t end, int shift,
                  const int64_t* source_of, const float* scale_of, RowRuns& runs,
                  RowRuns::TableRuns& table_runs) {
  const key_t payload_mask = static_cast<key_t>((key_t{1} << shift) - 1);
  const auto starts_run = [&](int64_t k) {
    return k == begin || (block[k - begin] >> shift) != (block[k - begin - 1] >> shift);
  };
  int64_t num_runs = 0;
  for (int64_t k = begin; k < end; ++k) num_runs += starts_run(k);
  table_runs.row.resize(num_runs);
  table_runs.begin.resize(num_runs + 1);
  table_runs.begin[num_runs] = end;
  int64_t u = 0;
  for (int64_t k = begin; k < end; ++k) {
    if (starts_run(k)) {
      table_runs.row[u] = static_cast<int64_t>(block[k - begin] >> shift);
      table_runs.begin[u++] = k;
    }
    const auto payload = static_cast<int64_t>(block[k - begin] & payload_mask);
    runs.source[k] = source_of[payload];
    if (scale_of != nullptr) runs.scale[k] = scale_of[payload];
  }
}

// Groups the batch's occurrences by (table, row) (see RowRuns). Occurrences are first placed in
// one block per table (features in order, so positions stay in order within a block), then
// each block is radix sorted on its local row: blocks are small enough to sort in cache, and
// tables sort in parallel. The key is local_row << payload_bits | payload, in 32 bits when it
// fits; the payload names what an occurrence contributes: its bag when every occurrence of a bag
// contributes alike (no per-sample weights, pooled output), else its position. Returns -1, or
// the first position whose index is outside its table (then `runs` is left empty).
template <typename key_t, typename index_t>
int64_t group_rows_as(const FeatureLayout& layout, const TypedBags<index_t>& bags,
                      const Tables& tables, int payload_bits, RowRuns& runs) {
  const int64_t T = layout.num_features;
  const int64_t N = bags.num_indices;
  const bool pooled = bags.pooling != Pooling::kNone;
  const bool by_bag = pooled && bags.per_sample_weights == nullptr;
  const bool scaled = bags.per_sample_weights != nullptr || bags.pooling == Pooling::kMean;
  const int64_t num_payloads = by_bag ? layout.num_bags() : N;

  // Table blocks, and where each feature's occurrences start in its table's block.
  const auto num_tables = static_cast<int64_t>(tables.tables.size());
  std::vector<int64_t> block_begin(num_tables + 1, 0);
  std::vector<int64_t> feature_begin(T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t table = tables.feature_table[t];
    feature_begin[t] = block_begin[table + 1];
    block_begin[table + 1] +=
        bags.offsets[layout.first_bag(t + 1)] - bags.offsets[layout.first_bag(t)];
  }
  for (int64_t i = 0; i < num_tables; ++i) {
    for (int64_t t = 0; t < T; ++t) {
      if (tables.feature_table[t] == i) feature_begin[t] += block_begin[i];
    }
    block_begin[i + 1] += block_begin[i];
  }
  const int64_t count = block_begin[num_tables];
  std::unique_ptr<key_t[]> keys(new key_t[count]);
  std::unique_ptr<key_t[]> scratch(new key_t[count]);
  std::unique_ptr<int64_t[]> source_of(new int64_t[num_payloads]);
  std::unique_ptr<float[]> scale_of(scaled ? new float[num_payloads] : nullptr);

  const int64_t bad = for_each_bag_chunk(
      layout, N, 2 * sizeof(key_t) + sizeof(int64_t),
      [&](ScratchRows&, int64_t t, int64_t b_begin, int64_t b_end, bool) -> int64_t {
        const auto rows = static_cast<uint64_t>(layout.rows[t]);
        const int64_t D = layout.D_offsets[t + 1] - layout.D_offsets[t];
        const index_t* indices = bags.indices;
        key_t* key = keys.get() + feature_begin[t];  // key[p - first] for position p
        const int64_t first_bag = layout.first_bag(t);
        const int64_t first = bags.offsets[first_bag];
        int64_t* source = source_of.get();
        float* scale = scale_of.get();
        int64_t bad_position = -1;
        for (int64_t b = b_begin; b < b_end; ++b) {
          const int64_t bag = first_bag + b;
          const int64_t begin = bags.offsets[bag];
          const int64_t end = bags.offsets[bag + 1];
          const float pooling_scale = bags.pooling_scale(end - begin);
          if (by_bag) {
            source[bag] = layout.output_offset(t, b);
            if (scaled) scale[bag] = pooling_scale;
          }
          for (int64_t p = begin; p < end; ++p) {
            const auto r = static_cast<uint64_t>(static_cast<int64_t>(indices[p]));
            if (r >= rows && bad_position < 0) bad_position = p;
            const auto payload = static_cast<key_t>(by_bag ? bag : p);
            key[p - first] = static_cast<key_t>(static_cast<key_t>(r) << payload_bits) | payload;
            if (!by_bag) {
              source[p] = pooled ? layout.output_offset(t, b) : p * D;
              if (scaled) scale[p] = bags.sample_weight(p) * pooling_scale;
            }
          }
        }
        return bad_position;
      });
  if (bad >= 0) return bad;
  // One table per task, sorted then split into runs; a lone table sorts with the radix sort's
  // own parallelism instead. One parallel region: each costs a wake-up of the other threads.
  runs.tables.resize(num_tables);
  runs.source.reset(new int64_t[count]);
  if (scaled) runs.scale.reset(new float[count]);
  parallel_for(0, num_tables, 1, [&](int64_t i_begin, int64_t i_end) {
    for (int64_t i = i_begin; i < i_end; ++i) {
      const int64_t begin = block_begin[i];
      const int64_t size = block_begin[i + 1] - begin;
      const key_t* sorted =
          radix_sort(keys.get() + begin, scratch.get() + begin, size, payload_bits,
                     bits_below(static_cast<uint64_t>(tables.tables[i].rows)));
      collect_runs(sorted, begin, block_begin[i + 1], payload_bits, source_of.get(), scale_of.get(),
                   runs, runs.tables[i]);
    }
  });
  runs.first_run.assign(num_tables + 1, 0);
  for (int64_t i = 0; i < num_tables; ++i) {
    runs.first_run[i + 1] = runs.first_run[i] + static_cast<int64_t>(runs.tables[i].row.size());
  }
  return -1;
}

template <typename index_t>
int64_t group_rows(const FeatureLayout& layout, const Bags& raw_bags, const Tables& tables,
                   RowRuns& runs) {
  const TypedBags<index_t> bags(raw_bags);
  const int64_t num_bags = layout.num_bags();
  if (num_bags == 0 || bags.offsets[num_bags] == bags.offsets[0]) return -1;
  const bool by_bag = bags.pooling != Pooling::kNone && bags.per_sample_weights == nullptr;
  const int payload_bits = bits_below(static_cast<uint64_t>(by_bag ? num_bags : bags.num_indices));
  int row_bits = 0;
  for (const Table& table : tables.tables) {
    row_bits = std::max(row_bits, bits_below(static_cast<uint64_t>(table.rows)));
  }
  if (row_bits + payload_bits <= 32) {
    return group_rows_as<uint32_t>(layout, bags, tables, payload_bits, runs);
  }
  return group_rows_as<uint64_t>(layout, bags, tables, payload_bits, runs);
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS
