// ATen adapters of the hashing family (docs/ops.md section 1): FBGEMM's zero-collision hashing
// (faster_hash_ops) behind torchrec's HashZchManagedCollisionModule.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <tuple>

namespace recops::hashing {

// (identities [size, 1], metadata [size, 1] or undefined), every entry -1.
std::tuple<at::Tensor, at::Tensor> create_zch_buffer(int64_t size, bool support_evict,
                                                     std::optional<at::Device> device,
                                                     bool long_type);

// (slots, evicted slots: undefined in read-only mode).
std::tuple<at::Tensor, at::Tensor> zero_collision_hash(
    const at::Tensor& input, const at::Tensor& identities, int64_t max_probe, bool circular_probe,
    int64_t exp_hours, bool readonly, const std::optional<at::Tensor>& local_sizes,
    const std::optional<at::Tensor>& offsets, const std::optional<at::Tensor>& metadata,
    bool output_on_uvm, bool disable_fallback, bool modulo_identity_deprecated,
    const std::optional<at::Tensor>& input_metadata, int64_t eviction_threshold,
    int64_t eviction_policy, int64_t opt_in_prob, int64_t num_reserved_slots,
    const std::optional<at::Tensor>& opt_in_rands, const std::optional<at::Tensor>& runtime_meta);

}  // namespace recops::hashing
