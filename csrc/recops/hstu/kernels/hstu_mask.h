// The structured HSTU mask of one sequence (docs/ops.md section 4), as generative-recommenders
// builds it: causal or two-sided, with contextual tokens, targets (optionally in groups) and a
// window. Every rule is monotone in the position ids, so each query row sees a union of at most
// four key intervals; rows are filled interval by interval instead of testing every key.
#pragma once

#include <algorithm>
#include <cstdint>

namespace recops::attention::kernels {

enum class MaskKind : int { kCausal = 0, kNone = 1, kCustom = 2 };

struct StructuredMask {
  bool causal = true;
  int64_t length = 0;             // n
  int64_t contextual_len = 0;     // c
  int64_t num_targets = 0;        // t
  int64_t target_group_size = 1;  // g
  int64_t max_attn_len = 0;       // w, 0 = no window

  int64_t top() const {
    return length - num_targets - (contextual_len > 0 ? contextual_len - 1 : 0);
  }
  int64_t first_target() const { return length - num_targets; }

  // id(p): context tokens share id 0, targets share id top().
  int64_t id(int64_t p) const {
    const int64_t raw = contextual_len > 0 ? std::max<int64_t>(p - contextual_len + 1, 0) : p;
    return std::min(raw, top());
  }

  // First position whose id is >= x (length when none): ids never decrease with position.
  int64_t first_with_id_at_least(int64_t x) const {
    int64_t lo = 0, hi = length;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (id(mid) >= x) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  // The key intervals [begin, end) query row i sees; returns how many (<= 4) were written.
  int visible_intervals(int64_t i, int64_t begin[4], int64_t end[4]) const {
    int count = 0;
    auto add = [&](int64_t b, int64_t e) {
      if (b < e) {
        begin[count] = b;
        end[count] = e;
        ++count;
      }
    };
    const int64_t di = id(i);
    const bool windowed = max_attn_len > 0;
    // d = id(i) - id(j) (causal) or |id(i) - id(j)|; keys with 0 < d <= w, and i itself.
    const int64_t window_begin = windowed ? first_with_id_at_least(di - max_attn_len) : 0;
    const int64_t same_id_begin = first_with_id_at_least(di);
    add(window_begin, same_id_begin);
    if (!causal) {
      const int64_t after_same_id = first_with_id_at_least(di + 1);
      const int64_t window_end = windowed ? first_with_id_at_least(di + max_attn_len + 1) : length;
      add(after_same_id, window_end);
    }
    add(i, i + 1);
    // Context tokens (id 0) see every non-target token.
    if (contextual_len > 0 && di == 0) add(0, first_with_id_at_least(top()));
    // A target sees the earlier (causal) or all (two-sided) members of its group.
    const int64_t first = first_target();
    if (target_group_size > 1 && num_targets > 0 && i >= first) {
      const int64_t group_begin = first + (i - first) / target_group_size * target_group_size;
      add(group_begin, causal ? i + 1 : std::min(group_begin + target_group_size, length));
    }
    return count;
  }

  // Keys [*begin, *end) that some row of [row_begin, row_end) may see; blocks skip the rest.
  // Interval bounds never decrease with the row's id, so the block's first row bounds every
  // begin and its last row every end, except for context rows, which see from key 0.
  void key_range(int64_t row_begin, int64_t row_end, int64_t* begin, int64_t* end) const {
    const bool has_context_rows = contextual_len > 0 && id(row_begin) == 0;
    const int64_t first_id = id(row_begin), last_id = id(row_end - 1);
    int64_t lo =
        max_attn_len > 0 ? std::min(row_begin, first_with_id_at_least(first_id - max_attn_len)) : 0;
    int64_t hi = row_end;
    if (!causal) {
      hi = max_attn_len > 0 ? std::max(hi, first_with_id_at_least(last_id + max_attn_len + 1))
                            : length;
      if (target_group_size > 1) hi = length;
    }
    if (has_context_rows) {
      lo = 0;
      hi = std::max(hi, first_with_id_at_least(top()));
    }
    *begin = lo;
    *end = std::min(hi, length);
  }
};

}  // namespace recops::attention::kernels
