// Zero-collision hashing, read-only (inference) mode: the slot of each id in an identity table
// filled at training time. An id hashes to a home slot in its block of the table (the whole table,
// or a per-id block [offset, offset + local_size)); the kernel probes up to max_probe slots from
// there, circularly within the block, and returns the first whose identity equals the id's. An id
// found nowhere falls back to its home slot (or to a reserved tail slot when opt-in is on), or to
// -1 when the fallback is disabled. Torch-free; the adapter has validated every block.
#pragma once

#include <cstdint>

#include "recops/common/parallel.h"
#include "recops/hashing/kernels/murmur_hash.h"

namespace recops::hashing::kernels {

struct ZchProbe {
  int64_t table_rows;          // identity rows (the block when there are no local sizes)
  int64_t identity_stride;     // elements between rows of the identity table (column 0 is read)
  int64_t max_probe;           // slots probed before falling back (<= 0: fall back at once)
  bool disable_fallback;       // not found: -1 instead of a fallback slot
  bool fold_identity;          // identities narrower than ids: an id's identity is id % INT32_MAX
  int64_t num_reserved_slots;  // > 0: opt-in on, the block's last slots take the fallbacks
};

// The identity an id is stored under: the id itself, or (64-bit ids in 32-bit identities) its
// remainder by INT32_MAX, with the sign of the id as C++'s % gives it.
template <typename id_t, typename identity_t>
inline identity_t identity_of(id_t id, bool fold) {
  constexpr int64_t kMaxIdentity = 2147483647;
  return fold ? static_cast<identity_t>(static_cast<int64_t>(id) % kMaxIdentity)
              : static_cast<identity_t>(id);
}

// The slot of one id (global row, or -1), its block starting at `offset` with `block_rows` rows.
template <typename id_t, typename identity_t>
inline int64_t zch_slot(id_t id, const identity_t* identities, const ZchProbe& p, int64_t offset,
                        int64_t block_rows) {
  const uint64_t hash = murmur_hash3_2x64(static_cast<uint64_t>(static_cast<int64_t>(id)), 0, 0);
  const bool opt_in = p.num_reserved_slots > 0;
  const int64_t probe_rows = opt_in ? block_rows - p.num_reserved_slots : block_rows;
  const identity_t identity = identity_of<id_t, identity_t>(id, p.fold_identity);
  int64_t slot = static_cast<int64_t>(hash % static_cast<uint64_t>(probe_rows));
  // Past probe_rows probes every slot of the block has been seen: more would find nothing new.
  const int64_t probes = p.max_probe < probe_rows ? p.max_probe : probe_rows;
  for (int64_t probe = 0; probe < probes; ++probe) {
    // An empty slot (-1) is probed past like any other identity: read-only mode never inserts.
    if (identities[(offset + slot) * p.identity_stride] == identity) return offset + slot;
    slot = slot + 1 == probe_rows ? 0 : slot + 1;
  }
  if (p.disable_fallback) return -1;
  const int64_t fallback =
      opt_in ? probe_rows + static_cast<int64_t>(hash % static_cast<uint64_t>(p.num_reserved_slots))
             : static_cast<int64_t>(hash % static_cast<uint64_t>(block_rows));
  return offset + fallback;
}

// out[i] = the slot of ids[i], for i < n. local_sizes / offsets: per-id blocks, or both null (the
// whole table is one block).
template <typename id_t, typename identity_t>
void zero_collision_hash(const id_t* ids, int64_t n, const identity_t* identities,
                         const ZchProbe& probe, const int64_t* local_sizes, const int64_t* offsets,
                         int64_t* out) {
  const int64_t grain = probe.max_probe > 16 ? 256 : 2048;
  parallel_for(0, n, grain, [&, ids, identities, out](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = local_sizes == nullptr
                   ? zch_slot(ids[i], identities, probe, 0, probe.table_rows)
                   : zch_slot(ids[i], identities, probe, offsets[i], local_sizes[i]);
    }
  });
}

}  // namespace recops::hashing::kernels
