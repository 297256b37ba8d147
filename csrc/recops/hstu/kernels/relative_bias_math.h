// Per-element math of the relative attention bias (docs/ops.md section 3), shared by the
// relative-bias ops and by attention kernels that compute the bias in-tile: the log bucket of a
// time delta, the query-time shift, and the position-table index. Torch-free.
//
// Bucketing convention: bucket(dt) = clamp(floor(ln(max(|dt|, 1)) / divisor), 0, num_buckets),
// evaluated in float64. |dt| is exact for integer timestamps (then rounded to double, exact below
// 2^53) and the double difference for floating ones; ln and the division are IEEE double, as
// torch.log and `/` compute them on float64 tensors, so a float64 torch reference gives the same
// buckets (two double logs within an ulp could only disagree on a delta whose ln / divisor lies
// within ~1e-15 of an integer). HSTU's research code evaluates the formula in float32; the two
// differ only where float32 rounding carries ln|dt| / divisor across an integer (measured: 44 of
// the integers below 2^24, ~7 per million random deltas up to 2^40), and then by one bucket.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "recops/common/cpu_isa.h"

namespace recops::attention::kernels {

// The reference bucket of a time-delta magnitude; NaN magnitudes fall in bucket 0.
inline int32_t log_bucket_reference(double magnitude, double divisor, int32_t num_buckets) {
  const double m = magnitude >= 1.0 ? magnitude : 1.0;
  const double q = std::log(m) / divisor;
  return q < num_buckets ? static_cast<int32_t>(q) : num_buckets;
}

// |query - key| as a double, exact for integer timestamps (no overflow: unsigned difference).
template <typename ts_t>
double time_delta_magnitude(ts_t query, ts_t key) {
  if constexpr (std::is_integral_v<ts_t>) {
    const uint64_t q = static_cast<uint64_t>(query);
    const uint64_t k = static_cast<uint64_t>(key);
    return static_cast<double>(query >= key ? q - k : k - q);
  } else {
    return std::abs(static_cast<double>(query) - static_cast<double>(key));
  }
}

// Position of the query timestamp of row i in a sequence of `length` timestamps: the next item's
// (HSTU / FuXi-alpha: tq[i] = ts[i + 1], the last item using its own), or its own without shift.
inline int64_t query_time_index(int64_t i, int64_t length, bool query_time_shift) {
  return query_time_shift && i + 1 < length ? i + 1 : i;
}

// Index into a [2N - 1] position table of the bias between query i and key j.
inline int64_t position_index(int64_t i, int64_t j, int64_t seq_len) {
  return seq_len - 1 + j - i;
}

// log_bucket_reference(m, divisor, num_buckets) for any m, without a logarithm per call. The bucket
// is a non-decreasing step function of m, so it is fixed by its thresholds (the smallest magnitude
// of each bucket, found once with the reference itself) and evaluated by comparisons: a table
// indexed by the top bits of m's binary64 encoding (the exponent and the first cell_bits_ bits of
// the mantissa, which order like the values) gives the bucket at the start of m's cell, and one
// comparison with the next threshold finishes. Cells are made small enough that no cell holds two
// thresholds (4 mantissa bits for HSTU's divisor 0.301); only divisors below ~2.4e-4 need more
// than kMaxCellBits and fall back to a loop over the thresholds. Exact by construction, about two
// thousand logarithms to build (once per op call), about a nanosecond per element: evaluate with
// `const auto bucket = bucketizer.view();` then `bucket(magnitude)` in the loop.
class LogBucketizer {
 public:
  LogBucketizer(double divisor, int32_t num_buckets)
      : divisor_(divisor), num_buckets_(num_buckets), thresholds_(num_buckets + 2) {
    thresholds_[0] = 1.0;
    uint64_t lo = bits(1.0);
    for (int32_t k = 1; k <= num_buckets; ++k) {
      lo = smallest_reaching(k, lo);
      thresholds_[k] = from_bits(lo);
    }
    // No magnitude reaches bucket num_buckets + 1 (comparisons with NaN are false).
    thresholds_[num_buckets + 1] = std::numeric_limits<double>::quiet_NaN();
    saturation_ = thresholds_[num_buckets];

    int cell_bits = kMinCellBits;
    while (cell_bits < kMaxCellBits && !one_threshold_per_cell(cell_bits)) ++cell_bits;
    several_per_cell_ = !one_threshold_per_cell(cell_bits);
    cell_shift_ = kMantissaBits - cell_bits;
    const uint64_t cells = cell_of(saturation_) + 1;
    cell_bucket_.resize(cells);
    int32_t b = 0;
    for (uint64_t c = 0; c < cells; ++c) {
      const double start = from_bits(kOneBits + (c << cell_shift_));
      while (b < num_buckets && start >= thresholds_[b + 1]) ++b;
      cell_bucket_[c] = b;
    }
  }

  // The bits of 1.0, the smallest magnitude: cell c starts at the magnitude of bits
  // kOneBits + (c << cell_shift).
  static constexpr uint64_t kOneBits = 0x3FF0000000000000ull;

  // The evaluation state by value, for hot loops: held in registers, it need not be reloaded
  // after every store (a uint8 bucket store may alias anything in memory).
  struct View {
    const int32_t* cell_bucket;
    const double* thresholds;
    double saturation;
    int cell_shift;
    bool several_per_cell;

    int32_t operator()(double magnitude) const {
      if (!several_per_cell) return one_per_cell(magnitude);
      const double m = clamped(magnitude);
      int32_t b = cell_bucket[(bits(m) - kOneBits) >> cell_shift];
      while (m >= thresholds[b + 1]) ++b;
      return b;
    }

    // The bucket where no cell holds two thresholds (!several_per_cell): a table lookup and one
    // comparison, without branches (attention/kernels/variant.h's AVX-512 add_time_bias is this,
    // eight magnitudes at a time).
    RECOPS_ALWAYS_INLINE int32_t one_per_cell(double magnitude) const {
      const double m = clamped(magnitude);
      const int32_t b = cell_bucket[(bits(m) - kOneBits) >> cell_shift];
      return b + (m >= thresholds[b + 1] ? 1 : 0);
    }

    // Into [1, saturation] without branches (a NaN magnitude becomes 1).
    RECOPS_ALWAYS_INLINE double clamped(double magnitude) const {
      const double m = magnitude > 1.0 ? magnitude : 1.0;
      return m < saturation ? m : saturation;
    }
  };

  View view() const {
    return {cell_bucket_.data(), thresholds_.data(), saturation_, cell_shift_, several_per_cell_};
  }

 private:
  static constexpr int kMantissaBits = 52;
  static constexpr int kMinCellBits = 4;
  static constexpr int kMaxCellBits = 12;
  static constexpr uint64_t kInfBits = 0x7FF0000000000000ull;

  RECOPS_ALWAYS_INLINE static uint64_t bits(double x) {
    uint64_t u;
    std::memcpy(&u, &x, sizeof(u));
    return u;
  }
  static double from_bits(uint64_t u) {
    double x;
    std::memcpy(&x, &u, sizeof(x));
    return x;
  }

  // Cell of a magnitude in [1, +inf].
  uint64_t cell_of(double m) const { return (bits(m) - kOneBits) >> cell_shift_; }

  // Whether cells of cell_bits mantissa bits separate all finite thresholds.
  bool one_threshold_per_cell(int cell_bits) const {
    const int shift = kMantissaBits - cell_bits;
    for (int32_t k = 1; k < num_buckets_ && std::isfinite(thresholds_[k + 1]); ++k) {
      if ((bits(thresholds_[k + 1]) - kOneBits) >> shift ==
          (bits(thresholds_[k]) - kOneBits) >> shift) {
        return false;
      }
    }
    return true;
  }

  bool reaches(uint64_t magnitude_bits, int32_t k) const {
    return log_bucket_reference(from_bits(magnitude_bits), divisor_, num_buckets_) >= k;
  }

  // Bit pattern of the smallest magnitude >= from_bits(lo) whose bucket is >= k (+inf at worst,
  // whose bucket is num_buckets). Positive doubles order like their bit patterns, so this is a
  // binary search, narrowed first around the estimate exp(k * divisor).
  uint64_t smallest_reaching(int32_t k, uint64_t lo) const {
    uint64_t hi = kInfBits;
    const double estimate = std::exp(k * divisor_);
    if (std::isfinite(estimate)) {
      const uint64_t below = bits(estimate * (1 - 1e-12));
      const uint64_t above = bits(estimate * (1 + 1e-12));
      if (below > lo && !reaches(below, k)) lo = below + 1;
      if (above >= lo && above < hi && reaches(above, k)) hi = above;
    }
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (reaches(mid, k)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  double divisor_;
  int32_t num_buckets_;
  std::vector<double>
      thresholds_;           // [k]: smallest magnitude of bucket >= k; [num_buckets + 1]: NaN
  double saturation_ = 1.0;  // thresholds_[num_buckets]: bucket num_buckets from here on
  int cell_shift_ = 0;
  bool several_per_cell_ = false;
  std::vector<int32_t> cell_bucket_;  // bucket at the start of each cell
};

}  // namespace recops::attention::kernels
