// The plan of a keyed-tensor regroup (FBGEMM's kt_regroup_arguments): input keyed tensor i holds
// features keys[i] with widths lengths[i], side by side in its columns; output j holds the
// features groups[j], side by side, in that order. Each output feature becomes one move
// (input, output, input column, output column, width, next), the rows of FBGEMM's `permutes`.
//
// `next` links the moves of a feature that appears more than once in the outputs, for the
// backward, which sums their gradients: the first move of such a feature holds the index of the
// second (> 0), every later one but the last holds minus the index of the following one, and the
// last holds -(number of moves); a feature used once holds 0. A key listed twice in the inputs
// resolves to its first place (FBGEMM's rule); the later one still takes its columns.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace recops::keyed::kernels {

constexpr int kMoveFields = 6;  // in_tensor, out_tensor, in_offset, out_offset, length, next

struct RegroupPlan {
  std::vector<int64_t> moves;          // kMoveFields per output feature, in output order
  std::vector<int64_t> input_widths;   // columns of each input (sum of its feature widths)
  std::vector<int64_t> output_widths;  // columns of each output
};

// The first group entry naming no input key, or {-1, -1} when every one resolves.
struct UnknownKey {
  int64_t group = -1;
  int64_t position = -1;
};

// Fills `plan`. keys[i] and lengths[i] have equal sizes and lengths are >= 0 (the adapter's
// checks); widths are summed in int64.
inline UnknownKey plan_regroup(const std::vector<std::vector<std::string>>& keys,
                               const std::vector<std::vector<int64_t>>& lengths,
                               const std::vector<std::vector<std::string>>& groups,
                               RegroupPlan& plan) {
  struct Place {
    int64_t tensor, column, width;
  };
  std::unordered_map<std::string_view, Place> places;
  plan.input_widths.assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t k = 0; k < keys[i].size(); ++k) {
      places.emplace(keys[i][k],
                     Place{static_cast<int64_t>(i), plan.input_widths[i], lengths[i][k]});
      plan.input_widths[i] += lengths[i][k];
    }
  }
  int64_t num_moves = 0;
  for (const auto& group : groups) num_moves += static_cast<int64_t>(group.size());
  plan.moves.assign(num_moves * kMoveFields, 0);
  plan.output_widths.assign(groups.size(), 0);
  // Per feature used so far: its first move and its latest one.
  struct Uses {
    int64_t first, last;
  };
  std::unordered_map<std::string_view, Uses> uses;
  int64_t m = 0;
  for (size_t j = 0; j < groups.size(); ++j) {
    for (size_t k = 0; k < groups[j].size(); ++k, ++m) {
      const auto found = places.find(groups[j][k]);
      if (found == places.end()) return {static_cast<int64_t>(j), static_cast<int64_t>(k)};
      const Place& place = found->second;
      int64_t* move = plan.moves.data() + m * kMoveFields;
      move[0] = place.tensor;
      move[1] = static_cast<int64_t>(j);
      move[2] = place.column;
      move[3] = plan.output_widths[j];
      move[4] = place.width;
      plan.output_widths[j] += place.width;
      const auto [seen, first_use] = uses.try_emplace(found->first, Uses{m, m});
      if (!first_use) {
        // The previous move of this feature points here: + from the first, - from later ones.
        const int64_t previous = seen->second.last;
        plan.moves[previous * kMoveFields + 5] = previous == seen->second.first ? m : -m;
        move[5] = -num_moves;
        seen->second.last = m;
      }
    }
  }
  return {};
}

}  // namespace recops::keyed::kernels
