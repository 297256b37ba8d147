#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/hashing/kernels/zero_collision_hash.h"
#include "recops/hashing/ops.h"

namespace recops::hashing {
namespace {

// What FBGEMM's CPU kernel computes: read-only lookups, no eviction, no opt-in draws.
void check_inference_mode(int64_t exp_hours, bool readonly,
                          const std::optional<at::Tensor>& metadata,
                          const std::optional<at::Tensor>& input_metadata,
                          int64_t eviction_threshold,
                          const std::optional<at::Tensor>& opt_in_rands) {
  TORCH_CHECK(exp_hours == -1, "exp_hours must be -1 (deprecated), got ", exp_hours);
  TORCH_CHECK(readonly,
              "readonly must be True on CPU: zero_collision_hash inserts ids on GPU only, the CPU "
              "kernel looks ids up in identities filled at training time");
  TORCH_CHECK(!metadata.has_value(), "metadata must be None on CPU (no eviction in readonly mode)");
  TORCH_CHECK(!input_metadata.has_value(),
              "input_metadata must be None on CPU (no eviction in readonly mode)");
  TORCH_CHECK(eviction_threshold == -1,
              "eviction_threshold must be -1 on CPU (no eviction in readonly mode), got ",
              eviction_threshold);
  TORCH_CHECK(!opt_in_rands.has_value(),
              "opt_in_rands must be None on CPU (no insertion in readonly mode)");
}

at::Tensor checked_blocks(const std::optional<at::Tensor>& t, const char* name, int64_t n) {
  check_cpu(*t, name);
  TORCH_CHECK(t->scalar_type() == at::kLong, name, " must be int64, got ", t->scalar_type());
  TORCH_CHECK(t->numel() == n, name, " must have one entry per input id (", n, "), got ",
              t->numel());
  return t->contiguous().view({-1});
}

// Every id's block [offsets[i], offsets[i] + local_sizes[i]) must lie in the table and hold more
// than the reserved slots: the kernel probes and hashes within it.
void check_blocks(const at::Tensor& local_sizes, const at::Tensor& offsets, int64_t rows,
                  int64_t reserved) {
  const int64_t* size = local_sizes.const_data_ptr<int64_t>();
  const int64_t* offset = offsets.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < local_sizes.numel(); ++i) {
    TORCH_CHECK_VALUE(size[i] > reserved, "local_sizes must be > ", reserved,
                      reserved > 0 ? " (num_reserved_slots)" : "", ", got local_sizes[", i,
                      "] = ", size[i]);
    TORCH_CHECK_VALUE(offset[i] >= 0 && offset[i] <= rows - size[i], "offsets[", i,
                      "] = ", offset[i], " with local_sizes[", i, "] = ", size[i],
                      " addresses rows outside identities (", rows, " rows)");
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> zero_collision_hash(
    const at::Tensor& input, const at::Tensor& identities, int64_t max_probe, bool circular_probe,
    int64_t exp_hours, bool readonly, const std::optional<at::Tensor>& local_sizes,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& metadata,
    bool /*output_on_uvm*/, bool disable_fallback, bool modulo_identity_deprecated,
    const std::optional<at::Tensor>& input_metadata, int64_t eviction_threshold,
    int64_t /*eviction_policy*/, int64_t opt_in_prob, int64_t num_reserved_slots,
    const std::optional<at::Tensor>& opt_in_rands,
    const std::optional<at::Tensor>& /*runtime_meta*/) {
  check_inference_mode(exp_hours, readonly, metadata, input_metadata, eviction_threshold,
                       opt_in_rands);
  TORCH_CHECK(input.dim() >= 1, "input must be 1-D, got a scalar");
  const int64_t n = input.size(0);
  at::Tensor slots = at::empty({n}, input.options().dtype(at::kLong));
  if (n == 0) return {slots, at::Tensor()};  // FBGEMM returns before its other checks

  check_cpu(input, "input");
  check_dim(input, 1, "input");
  check_index_dtype(input, "input");
  check_cpu(identities, "identities");
  check_dim(identities, 2, "identities");
  check_index_dtype(identities, "identities");
  TORCH_CHECK(identities.size(1) >= 1, "identities must have at least one column, got shape ",
              identities.sizes());
  TORCH_CHECK(input.scalar_type() == at::kLong || identities.scalar_type() == at::kInt,
              "identities must be int32 when input is int32, got ", identities.scalar_type());
  TORCH_CHECK(circular_probe, "circular_probe must be True");
  TORCH_CHECK(!modulo_identity_deprecated, "_modulo_identity_DPRECATED must be False");
  if (opt_in_prob != -1) {
    TORCH_CHECK_VALUE(opt_in_prob > 0 && opt_in_prob <= 100,
                      "opt_in_prob must be -1 or in [1, 100], got ", opt_in_prob);
    TORCH_CHECK_VALUE(num_reserved_slots > 0,
                      "num_reserved_slots must be > 0 when opt_in_prob is set, got ",
                      num_reserved_slots);
  }
  if (num_reserved_slots != -1) {
    TORCH_CHECK_VALUE(opt_in_prob != -1, "num_reserved_slots must be -1 unless opt_in_prob is set");
  }
  const int64_t reserved = opt_in_prob != -1 ? num_reserved_slots : 0;
  const int64_t rows = identities.size(0);

  // FBGEMM reads offsets only with local_sizes (per-id blocks); alone they are ignored.
  at::Tensor sizes_c, offsets_c;
  if (local_sizes.has_value()) {
    sizes_c = checked_blocks(local_sizes, "local_sizes", n);
    TORCH_CHECK(offsets.has_value(), "offsets must be given with local_sizes");
    offsets_c = checked_blocks(offsets, "offsets", n);
    check_blocks(sizes_c, offsets_c, rows, reserved);
  } else {
    TORCH_CHECK_VALUE(rows > reserved, "identities must have more than ", reserved,
                      " rows (num_reserved_slots), got ", rows);
    if (offsets.has_value()) checked_blocks(offsets, "offsets", n);
  }

  kernels::ZchProbe probe;
  probe.table_rows = rows;
  probe.identity_stride = identities.stride(0);
  probe.max_probe = max_probe;
  probe.disable_fallback = disable_fallback;
  probe.fold_identity = input.scalar_type() != identities.scalar_type();
  probe.num_reserved_slots = reserved;
  const at::Tensor input_c = input.contiguous();
  const int64_t* sizes_ptr = sizes_c.defined() ? sizes_c.const_data_ptr<int64_t>() : nullptr;
  const int64_t* offsets_ptr = sizes_c.defined() ? offsets_c.const_data_ptr<int64_t>() : nullptr;
  dispatch_index_kind(index_kind(input_c.scalar_type()), [&](auto id_tag) {
    using id_t = typename decltype(id_tag)::type;
    dispatch_index_kind(index_kind(identities.scalar_type()), [&](auto identity_tag) {
      using identity_t = typename decltype(identity_tag)::type;
      kernels::zero_collision_hash(input_c.const_data_ptr<id_t>(), n,
                                   identities.const_data_ptr<identity_t>(), probe, sizes_ptr,
                                   offsets_ptr, slots.mutable_data_ptr<int64_t>());
    });
  });
  return {slots, at::Tensor()};
}

}  // namespace recops::hashing
