// DeBERTa's relative positions (docs/ops.md section 6), torch-free: HuggingFace's log bucketing of
// a relative position i - j (make_log_bucket_position), and the kernel's position-index table.
// The one C++ copy of the formula: the disentangled-attention adapter builds its table with it,
// and Python reaches it through torch.ops.recops.deberta_log_bucket_position.
#pragma once

#include <cmath>
#include <cstdint>

namespace recops::attention::kernels {

// The float32 natural logarithm, correctly rounded (the double logarithm rounded once).
inline float log_float32(float x) {
  return static_cast<float>(std::log(static_cast<double>(x)));
}

// HF's make_log_bucket_position of one relative position, in float32 op for op as torch
// evaluates HF's tensor expression (float32 division, log, ceil; the default dtype):
//   mid = bucket_size / 2; a = |rel|, or mid - 1 when |rel| < mid;
//   a <= mid: rel; else sign(rel) * (ceil(log(a / mid) / log((max_position - 1) / mid)
//                                         * (mid - 1)) + mid).
// The logarithms are correctly rounded, so the result is the same on every CPU; torch's float32
// log is not (SLEEF's within one ulp on AVX2 / AVX-512, libm's otherwise), and where the ceil's
// argument lies within such an ulp of an integer the two may differ by one bucket. They agree on
// every distance below 2^14 for power-of-two bucket sizes up to 1024 with max_position 2 or 4
// times the bucket size, 512 or 1024, HF's default (256, 512) among them
// (tests/test_deberta.py).
// Needs bucket_size >= 2 and max_position - 1 > bucket_size / 2 (the adapters check).
inline int64_t log_bucket_position(int64_t rel, int64_t bucket_size, int64_t max_position) {
  const int64_t mid = bucket_size / 2;
  const int64_t magnitude = rel < 0 ? -rel : rel;
  if (magnitude <= mid) return rel;  // also |rel| < mid, which HF maps to mid - 1 <= mid
  // HF's torch.tensor((max_position - 1) / mid): a Python (double) quotient stored as float32.
  const float base = static_cast<float>(static_cast<double>(max_position - 1) / mid);
  const float ratio = static_cast<float>(magnitude) / static_cast<float>(mid);
  const float scaled = log_float32(ratio) / log_float32(base) * static_cast<float>(mid - 1);
  const float bucket = std::ceil(scaled) + static_cast<float>(mid);
  return rel < 0 ? -static_cast<int64_t>(bucket) : static_cast<int64_t>(bucket);
}

// out[i] = log_bucket_position(rel[i], bucket_size, max_position) for i < n.
inline void log_bucket_positions(const int64_t* rel, int64_t n, int64_t bucket_size,
                                 int64_t max_position, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = log_bucket_position(rel[i], bucket_size, max_position);
}

// The position index of every relative distance of a q_len x k_len problem:
// delta[q_len - 1 - i + j] = clamp(d(i - j) + span, 0, 2 span - 1) for the q_len + k_len - 1
// distances i - j = q_len - 1, ..., -(k_len - 1), with d the log bucket when bucket_size > 0
// and max_position > 0, else the identity.
inline void relative_position_index(int64_t q_len, int64_t k_len, int64_t bucket_size,
                                    int64_t max_position, int64_t span, int32_t* delta) {
  const bool bucketed = bucket_size > 0 && max_position > 0;
  for (int64_t c = 0; c < q_len + k_len - 1; ++c) {
    const int64_t rel = q_len - 1 - c;
    const int64_t d = bucketed ? log_bucket_position(rel, bucket_size, max_position) : rel;
    const int64_t index = d + span;
    delta[c] = static_cast<int32_t>(index < 0 ? 0 : index > 2 * span - 1 ? 2 * span - 1 : index);
  }
}

}  // namespace recops::attention::kernels
