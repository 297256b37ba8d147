// Exact, cheap evaluation of a monotone bucket function of |dt| (the relative time bias's log
// bucketing) inside attention tiles, where calling log per (query, key) pair would cost more than
// the matmuls. |dt| >= 1 is split into cells of 1/64 of an octave (one exponent, top 6 mantissa
// bits); a log bucket spans e^divisor (> 1.3x for the default divisor), so a cell holds at most one
// bucket boundary, stored as (bucket at cell start, first value of the next bucket). The table is
// built from the scalar bucket function itself, so tile results match it exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace recops::attention::kernels {

class TimeBucketTable {
 public:
  static constexpr int kOctaves = 64;  // |dt| in [1, 2^64)
  static constexpr int kCellBits = 6;
  static constexpr int kCellsPerOctave = 1 << kCellBits;

  // bucket_of(x) must be non-decreasing in x for x >= 1.
  template <typename BucketFn>
  explicit TimeBucketTable(BucketFn&& bucket_of)
      : base_(kOctaves * kCellsPerOctave), split_(kOctaves * kCellsPerOctave) {
    for (int cell = 0; cell < kOctaves * kCellsPerOctave; ++cell) {
      const double lo = cell_start(cell);
      const double hi = cell_start(cell + 1);  // exclusive
      const int32_t first = static_cast<int32_t>(bucket_of(lo));
      base_[cell] = first;
      split_[cell] = INFINITY;
      const double last_in_cell = std::nextafter(hi, 0.0);
      if (bucket_of(last_in_cell) == first) continue;
      // Bisection on the bit patterns of positive doubles, which order like the values.
      uint64_t a = bits(lo), b = bits(last_in_cell);  // bucket(a) == first < bucket(b)
      while (b - a > 1) {
        const uint64_t mid = a + (b - a) / 2;
        if (bucket_of(from_bits(mid)) == first) {
          a = mid;
        } else {
          b = mid;
        }
      }
      split_[cell] = from_bits(b);
    }
  }

  // Bucket of |dt| (any value; below 1 counts as 1).
  int32_t bucket(double abs_dt) const {
    const double x = abs_dt < 1.0 ? 1.0 : abs_dt;
    const uint64_t x_bits = bits(x);
    int64_t octave = static_cast<int64_t>(x_bits >> 52) - 1023;
    int64_t cell = (octave << kCellBits) |
                   static_cast<int64_t>((x_bits >> (52 - kCellBits)) & (kCellsPerOctave - 1));
    if (octave >= kOctaves) cell = kOctaves * kCellsPerOctave - 1;
    return base_[cell] + (x >= split_[cell] ? 1 : 0);
  }

 private:
  static uint64_t bits(double x) {
    uint64_t b;
    std::memcpy(&b, &x, sizeof(b));
    return b;
  }
  static double from_bits(uint64_t b) {
    double x;
    std::memcpy(&x, &b, sizeof(x));
    return x;
  }
  static double cell_start(int cell) {
    const int octave = cell >> kCellBits;
    const int sub = cell & (kCellsPerOctave - 1);
    return std::ldexp(1.0 + static_cast<double>(sub) / kCellsPerOctave, octave);
  }

  std::vector<int32_t> base_;
  std::vector<double> split_;
};

}  // namespace recops::attention::kernels
