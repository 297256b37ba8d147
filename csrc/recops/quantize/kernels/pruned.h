// Index remapping of pruned embedding tables (FBGEMM's pruned_hashmap_* / pruned_array_lookup),
// torch-free. Indices come as T tables x B bags (offsets[t * B + b] .. offsets[t * B + b + 1]);
// table t remaps through its slice [table_offsets[t], table_offsets[t + 1]) of
// - a hash table of [key, dense index] rows (key -1: empty), open addressing with linear probing
//   from MurmurHash3's finaliser of the key (fmix32 for int32 indices, fmix64 for int64) modulo
//   the slice's capacity, or
// - an array of dense indices by original index.
// A table with an empty slice is not pruned: its indices pass through. Entries no bag covers
// (before offsets[0] or from offsets[T * B] on) are set to -1.
//
// The adapters validated the offsets (non-decreasing, within the indices and the table); the
// kernels report a bad value (an index outside its array slice, a value that does not fit the
// dtype it is stored in) by returning its position in indices, -1 when there is none.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/hashing/kernels/murmur_hash.h"

namespace recops::quantize::kernels {

// MurmurHash3's 32-bit finaliser (fmix32).
inline uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The first probed slot of key in a slice of `capacity` slots.
template <typename index_t>
int64_t home_slot(index_t key, int64_t capacity) {
  if constexpr (std::is_same_v<index_t, int32_t>) {
    return static_cast<int64_t>(mix32(static_cast<uint32_t>(key)) %
                                static_cast<uint64_t>(capacity));
  } else {
    return static_cast<int64_t>(hashing::kernels::mix64(static_cast<uint64_t>(key)) %
                                static_cast<uint64_t>(capacity));
  }
}

// Whether value fits in T (a narrowing store must not change it).
template <typename T, typename V>
bool fits(V value) {
  return value >= std::numeric_limits<T>::min() && value <= std::numeric_limits<T>::max();
}

// Records position in first_bad unless a bad position was recorded before.
inline void record_bad(std::atomic<int64_t>& first_bad, int64_t position) {
  int64_t none = -1;
  first_bad.compare_exchange_strong(none, position);
}

template <typename index_t>
struct Bags {
  const index_t* indices;
  int64_t num_indices;
  const index_t* offsets;  // num_tables * batch + 1 entries
  int64_t num_tables;
  int64_t batch;

  int64_t begin(int64_t bag) const { return offsets[bag]; }
  int64_t end(int64_t bag) const { return offsets[bag + 1]; }
};

template <typename index_t>
void mark_uncovered(const Bags<index_t>& bags, index_t* out) {
  std::fill(out, out + bags.begin(0), index_t{-1});
  std::fill(out + bags.end(bags.num_tables * bags.batch - 1), out + bags.num_indices, index_t{-1});
}

// Runs fn(table, bag) over every bag, in parallel.
template <typename index_t, typename Fn>
void for_each_bag(const Bags<index_t>& bags, const Fn& fn) {
  const int64_t total = bags.num_tables * bags.batch;
  const int64_t grain = grain_for_bytes(std::max<int64_t>(1, bags.end(total - 1) - bags.begin(0)) *
                                        2 * int64_t{sizeof(index_t)} / std::max<int64_t>(1, total));
  parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    for (int64_t bag = begin; bag < end; ++bag) fn(bag / bags.batch, bag);
  });
}

// Dense index of key in a slice of `capacity` [key, dense] rows, or -1. A full slice without
// the key ends the probe after every slot.
template <typename index_t, typename hash_t>
int64_t find_dense(const hash_t* slice, int64_t capacity, index_t key) {
  int64_t slot = home_slot(key, capacity);
  for (int64_t probes = 0; probes < capacity; ++probes) {
    const hash_t stored = slice[2 * slot];
    if (stored == -1) return -1;
    if (stored == key) return slice[2 * slot + 1];
    slot = slot + 1 == capacity ? 0 : slot + 1;
  }
  return -1;
}

// out[i] = the dense index of indices[i] in its table's hash slice (-1: pruned). Returns the
// position of an index whose dense index does not fit in index_t, or -1.
template <typename index_t, typename hash_t>
int64_t pruned_hashmap_lookup(const Bags<index_t>& bags, const hash_t* hash_table,
                              const int64_t* table_offsets, index_t* out) {
  mark_uncovered(bags, out);
  std::atomic<int64_t> first_bad{-1};
  for_each_bag(bags, [&](int64_t t, int64_t bag) {
    const int64_t capacity = table_offsets[t + 1] - table_offsets[t];
    const hash_t* slice = hash_table + 2 * table_offsets[t];
    for (int64_t i = bags.begin(bag); i < bags.end(bag); ++i) {
      if (capacity == 0) {
        out[i] = bags.indices[i];
        continue;
      }
      const int64_t dense = find_dense(slice, capacity, bags.indices[i]);
      if (!fits<index_t>(dense)) record_bad(first_bad, i);
      out[i] = static_cast<index_t>(dense);
    }
  });
  return first_bad.load();
}

// Inserts (key, dense) into a slice; false when the slice is full without the key.
template <typename index_t, typename hash_t>
bool insert_one(hash_t* slice, int64_t capacity, index_t key, index_t dense) {
  int64_t slot = home_slot(key, capacity);
  for (int64_t probes = 0; probes < capacity; ++probes) {
    hash_t& stored = slice[2 * slot];
    if (stored == -1 || stored == key) {
      stored = static_cast<hash_t>(key);
      slice[2 * slot + 1] = static_cast<hash_t>(dense);
      return true;
    }
    slot = slot + 1 == capacity ? 0 : slot + 1;
  }
  return false;
}

// Inserts table t's (index, dense index) pairs (dense -1: pruned, skipped) into its slice, in
// bag order; the position of the first pair that found the slice full, or -1.
template <typename index_t, typename hash_t>
int64_t insert_table(const Bags<index_t>& bags, const index_t* dense_indices, int64_t t,
                     hash_t* slice, int64_t capacity) {
  for (int64_t i = bags.begin(t * bags.batch); i < bags.end((t + 1) * bags.batch - 1); ++i) {
    if (dense_indices[i] == -1) continue;
    if (!insert_one(slice, capacity, bags.indices[i], dense_indices[i])) return i;
  }
  return -1;
}

// Fills the hash slices, one table per task (a table's pairs go in order, as FBGEMM inserts
// them). Returns -1, or the position of a pair whose table filled up or whose index or dense
// index does not fit in hash_t; then nothing was written: a table that might fill up (more pairs
// than empty slots) is first filled in a copy.
template <typename index_t, typename hash_t>
int64_t pruned_hashmap_insert(const Bags<index_t>& bags, const index_t* dense_indices,
                              hash_t* hash_table, const int64_t* table_offsets) {
  const int64_t num_tables = bags.num_tables;
  std::vector<int64_t> failed(num_tables, -1);
  std::vector<std::vector<hash_t>> copies(num_tables);
  parallel_for(0, num_tables, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t capacity = table_offsets[t + 1] - table_offsets[t];
      if (capacity == 0) continue;
      hash_t* slice = hash_table + 2 * table_offsets[t];
      int64_t pairs = 0;
      for (int64_t i = bags.begin(t * bags.batch); i < bags.end((t + 1) * bags.batch - 1); ++i) {
        if (dense_indices[i] == -1) continue;
        ++pairs;
        if (!fits<hash_t>(bags.indices[i]) || !fits<hash_t>(dense_indices[i])) {
          failed[t] = i;
          break;
        }
      }
      if (failed[t] >= 0) continue;
      int64_t empty = 0;
      for (int64_t s = 0; s < capacity; ++s) empty += slice[2 * s] == -1;
      if (pairs <= empty) continue;  // every pair finds a slot
      copies[t].assign(slice, slice + 2 * capacity);
      failed[t] = insert_table(bags, dense_indices, t, copies[t].data(), capacity);
    }
  });
  for (const int64_t position : failed) {
    if (position >= 0) return position;
  }
  parallel_for(0, num_tables, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t capacity = table_offsets[t + 1] - table_offsets[t];
      hash_t* slice = hash_table + 2 * table_offsets[t];
      if (!copies[t].empty()) {
        std::copy(copies[t].begin(), copies[t].end(), slice);
      } else if (capacity > 0) {
        insert_table(bags, dense_indices, t, slice, capacity);
      }
    }
  });
  return -1;
}

// out[i] = remappings[table's slice start + indices[i]] (-1: pruned). Returns -1, or the
// position of an index outside its table's slice or whose dense index does not fit in index_t.
template <typename index_t, typename remap_t>
int64_t pruned_array_lookup(const Bags<index_t>& bags, const remap_t* remappings,
                            const int64_t* remap_offsets, index_t* out) {
  mark_uncovered(bags, out);
  std::atomic<int64_t> first_bad{-1};
  for_each_bag(bags, [&](int64_t t, int64_t bag) {
    const int64_t start = remap_offsets[t];
    const int64_t capacity = remap_offsets[t + 1] - start;
    for (int64_t i = bags.begin(bag); i < bags.end(bag); ++i) {
      const index_t index = bags.indices[i];
      if (capacity == 0) {
        out[i] = index;
      } else if (index >= 0 && index < capacity && fits<index_t>(remappings[start + index])) {
        out[i] = static_cast<index_t>(remappings[start + index]);
      } else {
        record_bad(first_bad, i);
        out[i] = -1;
      }
    }
  });
  return first_bad.load();
}

}  // namespace recops::quantize::kernels
