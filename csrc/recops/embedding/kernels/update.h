// The fused exact backward: after group_rows, parallel over unique rows (each row belongs to
// exactly one task: no atomics, no locks). Per row, the gradients of all its occurrences are
// summed in position order (deterministic for any thread count), then the optimizer updates the
// row and its state in place. Compiled per instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/optimizers.h"
#include "recops/embedding/kernels/row_groups.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// Prefetch distances: gradient rows of occurrences, and weights and state of unique rows.
constexpr int64_t kGradPrefetchDistance = 8;
constexpr int64_t kRowPrefetchDistance = 4;

// g[0, D) = sum over occurrences k in [begin, end) of scale[k] * clip(grad_output[source[k] :]),
// in registers block by block; prefetches gradient rows up to `prefetch_end` occurrences.
inline void sum_gradients(const float* grad_output, const int64_t* source, const float* scale,
                          int64_t begin, int64_t end, int64_t prefetch_end, float bound, int64_t D,
                          float* g) {
  const bool clip = bound != std::numeric_limits<float>::infinity();
  for_each_column_block(D, [&](auto width, int64_t c) {
    constexpr int64_t kWidth = decltype(width)::value;
    float block[kWidth] = {};
    for (int64_t k = begin; k < end; ++k) {
      if (c == 0 && k + kGradPrefetchDistance < prefetch_end) {
        prefetch_bytes(grad_output + source[k + kGradPrefetchDistance],
                       D * static_cast<int64_t>(sizeof(float)));
      }
      const float* src = grad_output + source[k] + c;
      const float s = scale != nullptr ? scale[k] : 1.0f;
      if (clip) {
        float clipped[kWidth];
        for (int64_t i = 0; i < kWidth; ++i) clipped[i] = std::min(std::max(src[i], -bound), bound);
        add_scaled_block<kWidth>(block, clipped, s);
      } else {
        add_scaled_block<kWidth>(block, src, s);
      }
    }
    std::memcpy(g + c, block, sizeof(block));
  });
}

// Calls fn(std::integral_constant<int, k>{}) for each state buffer k that kOptimizer uses: which
// buffers, and their widths, are compile-time constants, so no row reads the optimizer table.
template <Optimizer kOptimizer, typename Fn, int... kBuffers>
void for_each_state_of(Fn&& fn, std::integer_sequence<int, kBuffers...>) {
  ((optimizer_state_size(kOptimizer, kBuffers, 1) > 0 ? fn(std::integral_constant<int, kBuffers>{})
                                                      : void()),
   ...);
}

template <Optimizer kOptimizer, typename Fn>
void for_each_state(Fn&& fn) {
  for_each_state_of<kOptimizer>(std::forward<Fn>(fn),
                                std::make_integer_sequence<int, kMaxStates>{});
}

template <Optimizer kOptimizer, typename weight_t>
void apply_updates(const UpdateArgs& args, const Tables& tables, const RowRuns& runs) {
  auto* weights = static_cast<weight_t*>(args.weights);
  const int64_t max_D = args.layout.max_D;
  const int64_t num_runs = runs.num_runs();
  const int64_t occurrences = runs.tables.empty() ? 0 : runs.tables.back().begin.back();
  // A unique row reads and writes its weights and reads at least one gradient row.
  const int64_t grain = grain_for_bytes(3 * max_D * static_cast<int64_t>(sizeof(float)));
  parallel_for(0, num_runs, grain, [&](int64_t u_begin, int64_t u_end) {
    ScratchRows scratch(2, max_D);
    float* g = scratch.row(0);
    float* converted = scratch.row(1);
    size_t i = std::upper_bound(runs.first_run.begin(), runs.first_run.end(), u_begin) -
               runs.first_run.begin() - 1;
    for (int64_t u = u_begin; u < u_end; ++u) {
      while (u >= runs.first_run[i + 1]) ++i;  // skips tables without runs
      const Table& table = tables.tables[i];
      const RowRuns::TableRuns& table_runs = runs.tables[i];
      const int64_t j = u - runs.first_run[i];
      const int64_t D = table.D;
      // Row `row`'s elements in state buffer k (a buffer the optimizer uses, k a constant).
      const auto state_row = [&](auto k, int64_t row) {
        return args.state[k] + table.state_offset[k] + row * optimizer_state_size(kOptimizer, k, D);
      };
      if (j + kRowPrefetchDistance < static_cast<int64_t>(table_runs.row.size())) {
        const int64_t ahead = table_runs.row[j + kRowPrefetchDistance];
        prefetch_bytes<1>(weights + table.weights_offset + ahead * D,
                          D * static_cast<int64_t>(sizeof(weight_t)));
        for_each_state<kOptimizer>([&](auto k) {
          prefetch_bytes<1>(state_row(k, ahead), optimizer_state_size(kOptimizer, k, D) *
                                                     static_cast<int64_t>(sizeof(float)));
        });
      }
      sum_gradients(args.grad_output, runs.source.get(), runs.scale.get(), table_runs.begin[j],
                    table_runs.begin[j + 1], occurrences, args.max_gradient, D, g);
      const int64_t row = table_runs.row[j];
      float* state[kMaxStates] = {};
      for_each_state<kOptimizer>([&](auto k) { state[k] = state_row(k, row); });
      update_row<kOptimizer>(weights + table.weights_offset + row * D, state, g, D, args.params,
                             converted);
    }
  });
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS
