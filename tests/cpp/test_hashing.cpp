// Hashing family kernels (csrc/recops/hashing/kernels): zero_collision_hash's read-only lookup
// against a scalar loop written from the rule (home slot = hash % probe rows, probe up to
// max_probe slots circularly within the block, fall back to the home slot, a reserved tail slot,
// or -1), for whole-table and per-id blocks, 32- and 64-bit ids and identities, strided identity
// tables, and one and several threads.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "recops/hashing/kernels/zero_collision_hash.h"
#include "test_util.h"

namespace recops::hashing::kernels {
namespace {

using test::random_integers;
using test::ScopedThreads;

struct Options {
  int64_t max_probe = 4;
  bool disable_fallback = false;
  int64_t num_reserved_slots = 0;
  int64_t identity_stride = 1;
};

// The slot of `id` by the rule, one probe at a time with modular arithmetic.
template <typename id_t, typename identity_t>
int64_t scalar_slot(id_t id, const std::vector<identity_t>& identities, const Options& o,
                    int64_t offset, int64_t rows, bool fold) {
  const uint64_t hash = murmur_hash3_2x64(static_cast<uint64_t>(static_cast<int64_t>(id)), 0, 0);
  const int64_t probe_rows = o.num_reserved_slots > 0 ? rows - o.num_reserved_slots : rows;
  const int64_t home = static_cast<int64_t>(hash % static_cast<uint64_t>(probe_rows));
  const int64_t wanted = fold ? static_cast<int64_t>(id) % 2147483647 : static_cast<int64_t>(id);
  for (int64_t k = 0; k < o.max_probe && k < probe_rows; ++k) {
    const int64_t slot = offset + (home + k) % probe_rows;
    if (static_cast<int64_t>(identities[slot * o.identity_stride]) == wanted) return slot;
  }
  if (o.disable_fallback) return -1;
  if (o.num_reserved_slots > 0) {
    return offset + probe_rows +
           static_cast<int64_t>(hash % static_cast<uint64_t>(o.num_reserved_slots));
  }
  return offset + static_cast<int64_t>(hash % static_cast<uint64_t>(rows));
}

// A table of `rows` slots (stride o.identity_stride) where each of `ids` with an even position
// was stored at its probed slot (or its home slot's neighbourhood, as training would), the rest
// empty (-1); returns the table.
template <typename id_t, typename identity_t>
std::vector<identity_t> trained_table(const std::vector<id_t>& ids, int64_t rows, const Options& o,
                                      bool fold) {
  std::vector<identity_t> table(rows * o.identity_stride, identity_t(-1));
  const int64_t probe_rows = o.num_reserved_slots > 0 ? rows - o.num_reserved_slots : rows;
  for (size_t i = 0; i < ids.size(); i += 2) {
    const uint64_t hash =
        murmur_hash3_2x64(static_cast<uint64_t>(static_cast<int64_t>(ids[i])), 0, 0);
    const int64_t home = static_cast<int64_t>(hash % static_cast<uint64_t>(probe_rows));
    for (int64_t k = 0; k < probe_rows; ++k) {  // the first empty slot from home, circularly
      identity_t& slot = table[((home + k) % probe_rows) * o.identity_stride];
      if (slot == identity_t(-1)) {
        slot = static_cast<identity_t>(fold ? static_cast<int64_t>(ids[i]) % 2147483647
                                            : static_cast<int64_t>(ids[i]));
        break;
      }
    }
  }
  return table;
}

template <typename id_t, typename identity_t>
void check_table(int64_t n, int64_t rows, const Options& o, int64_t id_max) {
  const bool fold = sizeof(identity_t) < sizeof(id_t);
  const std::vector<id_t> ids = random_integers<id_t>(n, -5, id_max);
  const std::vector<identity_t> identities = trained_table<id_t, identity_t>(ids, rows, o, fold);
  const ZchProbe probe{rows, o.identity_stride,   o.max_probe, o.disable_fallback,
                       fold, o.num_reserved_slots};
  std::vector<int64_t> out(n, -7);
  zero_collision_hash(ids.data(), n, identities.data(), probe, nullptr, nullptr, out.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], scalar_slot(ids[i], identities, o, 0, rows, fold)) << "id " << ids[i];
  }
}

TEST(ZeroCollisionHash, WholeTableMatchesScalarLoop) {
  check_table<int64_t, int64_t>(500, 97, Options{}, 1000);
  check_table<int32_t, int32_t>(500, 64, Options{}, 1000);
  check_table<int64_t, int32_t>(500, 50, Options{}, int64_t{1} << 40);  // folded identities
  check_table<int64_t, int64_t>(300, 40, Options{.max_probe = 0}, 1000);
  check_table<int64_t, int64_t>(300, 8, Options{.max_probe = 100}, 1000);  // more than the rows
  check_table<int64_t, int64_t>(300, 33, Options{.disable_fallback = true}, 1000);
  check_table<int64_t, int64_t>(300, 40, Options{.num_reserved_slots = 5}, 1000);
  check_table<int64_t, int64_t>(300, 40, Options{.identity_stride = 2}, 1000);
}

TEST(ZeroCollisionHash, FindsEveryStoredId) {
  // Stored ids are found at the slot they were stored in when max_probe covers the table.
  const Options o{.max_probe = 64};
  const std::vector<int64_t> ids = random_integers<int64_t>(40, 0, 1 << 20);
  const std::vector<int64_t> table = trained_table<int64_t, int64_t>(ids, 64, o, false);
  std::vector<int64_t> out(ids.size());
  const ZchProbe probe{64, 1, 64, false, false, 0};
  zero_collision_hash(ids.data(), static_cast<int64_t>(ids.size()), table.data(), probe, nullptr,
                      nullptr, out.data());
  for (size_t i = 0; i < ids.size(); i += 2) EXPECT_EQ(table[out[i]], ids[i]);
}

TEST(ZeroCollisionHash, PerIdBlocksMatchScalarLoop) {
  // Four blocks of 25 rows; each id probes only inside its own block.
  const int64_t n = 2000, block = 25, blocks = 4;
  const Options o{.max_probe = 6, .num_reserved_slots = 3};
  const std::vector<int64_t> ids = random_integers<int64_t>(n, 0, 5000);
  const std::vector<int64_t> which = random_integers<int64_t>(n, 0, blocks - 1, 2);
  std::vector<int64_t> identities = random_integers<int64_t>(block * blocks, 0, 5000, 3);
  for (int64_t i = 0; i < n; i += 3) identities[which[i] * block + i % block] = ids[i];
  std::vector<int64_t> local_sizes(n, block), offsets(n);
  for (int64_t i = 0; i < n; ++i) offsets[i] = which[i] * block;
  const ZchProbe probe{block * blocks, 1, o.max_probe, false, false, o.num_reserved_slots};
  for (int threads : {1, 4}) {
    ScopedThreads scoped(threads);
    std::vector<int64_t> out(n, -7);
    zero_collision_hash(ids.data(), n, identities.data(), probe, local_sizes.data(), offsets.data(),
                        out.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], scalar_slot(ids[i], identities, o, offsets[i], block, false)) << i;
      ASSERT_GE(out[i], offsets[i]);
      ASSERT_LT(out[i], offsets[i] + block);
    }
  }
}

TEST(ZeroCollisionHash, ManyThreadsMatchScalarLoop) {
  ScopedThreads threads(4);
  check_table<int64_t, int64_t>(100000, 4099, Options{.max_probe = 32}, int64_t{1} << 40);
  check_table<int32_t, int32_t>(100000, 1024, Options{.max_probe = 8}, 1 << 20);
}

}  // namespace
}  // namespace recops::hashing::kernels
