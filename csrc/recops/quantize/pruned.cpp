// Adapters of FBGEMM's index remapping for pruned embedding tables (kernels/pruned.h).
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/quantize/kernels/pruned.h"
#include "recops/quantize/ops.h"

namespace recops::quantize {
namespace {

// The bags of a call: indices and offsets (same dtype, 1-D), T = table_offsets' length - 1
// tables, the first T * B + 1 offsets (B = floor(bags / T), as FBGEMM) covering the bags read, and
// table_offsets slicing `table_rows` rows.
struct Checked {
  at::Tensor indices;
  at::Tensor offsets;
  at::Tensor table_offsets;
  int64_t num_tables;
  int64_t batch;
};

Checked check_bags(const at::Tensor& indices, const at::Tensor& offsets,
                   const at::Tensor& table_offsets, const char* table_offsets_name,
                   int64_t table_rows, const char* table_name) {
  check_cpu(indices, "indices");
  check_cpu(offsets, "offsets");
  check_cpu(table_offsets, table_offsets_name);
  check_index_dtype(indices, "indices");
  check_same_dtype(indices, "indices", offsets, "offsets");
  check_dim(indices, 1, "indices");
  check_dim(offsets, 1, "offsets");
  check_dim(table_offsets, 1, table_offsets_name);
  TORCH_CHECK(table_offsets.scalar_type() == at::kLong, table_offsets_name, " must be int64, got ",
              table_offsets.scalar_type());
  const int64_t num_tables = table_offsets.numel() - 1;
  TORCH_CHECK_VALUE(num_tables >= 1, table_offsets_name,
                    " must hold T + 1 >= 2 entries (one slice per table), got ",
                    table_offsets.numel());
  const int64_t batch = (offsets.numel() - 1) / num_tables;
  TORCH_CHECK_VALUE(batch >= 1, "offsets must hold at least T + 1 = ", num_tables + 1,
                    " entries (B >= 1 bags per table), got ", offsets.numel());
  // As FBGEMM: B = floor(bags / T); the T * B bags are read, offsets past them are not.
  const int64_t bags = num_tables * batch;
  Checked checked{indices.contiguous(), offsets.narrow(0, 0, bags + 1).contiguous(),
                  table_offsets.contiguous(), num_tables, batch};
  check_offsets_monotonic(checked.offsets, "offsets");
  const int64_t last = index_at(checked.offsets, bags);
  TORCH_CHECK_VALUE(last <= indices.numel(), "offsets must end within indices: offsets[", bags,
                    "] = ", last, " > ", indices.numel(), " indices");
  check_offsets_monotonic(checked.table_offsets, table_offsets_name);
  const int64_t end = index_at(checked.table_offsets, num_tables);
  TORCH_CHECK_VALUE(end <= table_rows, table_offsets_name, " must end within ", table_name, ": ",
                    table_offsets_name, "[", num_tables, "] = ", end, " > ", table_rows, " rows");
  return checked;
}

template <typename index_t>
kernels::Bags<index_t> bags_of(const Checked& c) {
  return {c.indices.const_data_ptr<index_t>(), c.indices.numel(),
          c.offsets.const_data_ptr<index_t>(), c.num_tables, c.batch};
}

void check_hash_table(const at::Tensor& hash_table) {
  check_cpu(hash_table, "hash_table");
  check_index_dtype(hash_table, "hash_table");
  TORCH_CHECK(hash_table.dim() == 2 && hash_table.size(1) == 2,
              "hash_table must be 2-D with rows of [index, dense index], got shape ",
              hash_table.sizes());
}

}  // namespace

at::Tensor pruned_hashmap_lookup(const at::Tensor& indices, const at::Tensor& offsets,
                                 const at::Tensor& hash_table,
                                 const at::Tensor& hash_table_offsets) {
  check_hash_table(hash_table);
  const Checked c = check_bags(indices, offsets, hash_table_offsets, "hash_table_offsets",
                               hash_table.size(0), "hash_table");
  const at::Tensor table = hash_table.contiguous();
  at::Tensor out = at::empty_like(c.indices);
  const int64_t bad = dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    return dispatch_index_kind(index_kind(table.scalar_type()), [&](auto hash_tag) {
      using hash_t = typename decltype(hash_tag)::type;
      return kernels::pruned_hashmap_lookup(bags_of<index_t>(c), table.const_data_ptr<hash_t>(),
                                            c.table_offsets.const_data_ptr<int64_t>(),
                                            out.mutable_data_ptr<index_t>());
    });
  });
  TORCH_CHECK_VALUE(bad < 0, "pruned_hashmap_lookup: the dense index of indices[", bad,
                    "] in hash_table does not fit in indices' dtype ", indices.scalar_type());
  return out;
}

void pruned_hashmap_insert(const at::Tensor& indices, const at::Tensor& dense_indices,
                           const at::Tensor& offsets, const at::Tensor& hash_table,
                           const at::Tensor& hash_table_offsets) {
  check_hash_table(hash_table);
  TORCH_CHECK(hash_table.is_contiguous(), "hash_table must be contiguous: it is filled in place");
  const Checked c = check_bags(indices, offsets, hash_table_offsets, "hash_table_offsets",
                               hash_table.size(0), "hash_table");
  check_cpu(dense_indices, "dense_indices");
  check_same_dtype(indices, "indices", dense_indices, "dense_indices");
  TORCH_CHECK(dense_indices.dim() == 1 && dense_indices.numel() == indices.numel(),
              "dense_indices must be 1-D with one entry per index (", indices.numel(),
              "), got shape ", dense_indices.sizes());
  const at::Tensor dense = dense_indices.contiguous();
  const int64_t bad = dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    return dispatch_index_kind(index_kind(hash_table.scalar_type()), [&](auto hash_tag) {
      using hash_t = typename decltype(hash_tag)::type;
      return kernels::pruned_hashmap_insert(bags_of<index_t>(c), dense.const_data_ptr<index_t>(),
                                            hash_table.mutable_data_ptr<hash_t>(),
                                            c.table_offsets.const_data_ptr<int64_t>());
    });
  });
  TORCH_CHECK_VALUE(bad < 0, "pruned_hashmap_insert: indices[", bad,
                    "] = ", bad < 0 ? 0 : index_at(c.indices, bad), " (dense index ",
                    bad < 0 ? 0 : index_at(dense, bad), ") does not fit: either its table's ",
                    "hash_table slice is full, or a value does not fit in hash_table's dtype ",
                    hash_table.scalar_type(), "; hash_table is unchanged");
}

at::Tensor pruned_array_lookup(const at::Tensor& indices, const at::Tensor& offsets,
                               const at::Tensor& index_remappings,
                               const at::Tensor& index_remappings_offsets) {
  check_cpu(index_remappings, "index_remappings");
  check_index_dtype(index_remappings, "index_remappings");
  check_dim(index_remappings, 1, "index_remappings");
  const Checked c =
      check_bags(indices, offsets, index_remappings_offsets, "index_remappings_offsets",
                 index_remappings.numel(), "index_remappings");
  const at::Tensor remappings = index_remappings.contiguous();
  at::Tensor out = at::empty_like(c.indices);
  const int64_t bad = dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    return dispatch_index_kind(index_kind(remappings.scalar_type()), [&](auto remap_tag) {
      using remap_t = typename decltype(remap_tag)::type;
      return kernels::pruned_array_lookup(bags_of<index_t>(c), remappings.const_data_ptr<remap_t>(),
                                          c.table_offsets.const_data_ptr<int64_t>(),
                                          out.mutable_data_ptr<index_t>());
    });
  });
  TORCH_CHECK_VALUE(bad < 0, "pruned_array_lookup: indices[", bad,
                    "] = ", bad < 0 ? 0 : index_at(c.indices, bad),
                    " must lie within its table's index_remappings slice [0, rows) and remap to ",
                    "a value that fits in indices' dtype ", indices.scalar_type());
  return out;
}

}  // namespace recops::quantize
