// FuXi-alpha's position channel, O_p = (M * pos_w[N - 1 + j - i]) V, under a plain causal mask as
// a convolution along the sequence: O_p[i] = sum over d = 0..i of w[d] V[i - d], w[d] =
// pos_w[N - 1 - d]. A tile product costs n^2 / 2 multiply-adds per value column; the convolution
// by FFT (common/kernels/lane_fft.h) n log n, on 16 column pairs at once (two real columns as the
// re and im of one complex signal: the kernel is real, so the pair's convolutions stay apart).
// The forward's convolution alone, one core of an AMD EPYC (Zen 4), 50 value columns: n = 768
// 120 us against 708 us for tiles of 16 rows times V (in the attention: kPositionFftMinKeys).
//
// The backward is two more convolutions of the same kind: dV[j] = sum over d of w[d] dO[j + d]
// (the conjugate spectrum of w) and the table's gradient dw[d] = sum over i of dO[i] . V[i - d],
// the real part of the inverse of the summed cross spectra dO conj(V) (the imaginary part holds
// the pairs' cross terms), summed over the sequences of one transform size before one inverse.
//
// A transform of size M >= 2n - 1 leaves the n outputs unaliased; the kernel's taps stop at M / 2
// (a sequence of n <= M / 2 keys reads no further: position_fft_size), so one kernel spectrum
// serves every sequence of that size. Applies where each query row i of a sequence sees exactly
// keys [0, i]: fp32, a structured causal mask without contextual tokens, targets or window, all of
// the sequence's rows queries, its keys one run of rows; other sequences keep the channel's tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "recops/common/kernels/lane_fft.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Sequences shorter than this keep the tile, which shares its block's passes with the other
// channels where the convolution reads V and writes O_p again. Measured in the whole FuXi-alpha
// attention (fp32, one head of 50, 2 threads, AMD EPYC Zen 4), forward and backward against the
// tiles alone: sequences of 128-256 keys 5-8% slower by FFT, of 256-512 keys about 10% faster,
// the synthetic N = 1024 batch (512-1024 keys) 20% faster.
constexpr int64_t kPositionFftMinKeys = 256;

// The transform size of a sequence of n keys: the least power of two >= 2n (>= 2n - 1, which
// leaves the n outputs unaliased, and n <= size / 2, the kernel's taps).
inline int64_t position_fft_size(int64_t n) {
  int64_t size = 2;
  while (size < 2 * n) size *= 2;
  return size;
}

// A block of 64-byte aligned floats (the lane FFT's whole-vector loads and stores).
class AlignedFloats {
 public:
  explicit AlignedFloats(int64_t count)
      : data_(static_cast<float*>(
            std::aligned_alloc(64, static_cast<size_t>((std::max<int64_t>(count, 16) + 15) / 16 *
                                                       16 * int64_t{sizeof(float)})))) {
    if (data_ == nullptr) throw std::bad_alloc();  // as std::vector would
  }
  float* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
};

// A signal block of `size` samples (lane_fft.h's layout), re then im.
class SignalBlock {
 public:
  explicit SignalBlock(int64_t size) : re_(size * kFftLanes), im_(size * kFftLanes) {}
  float* re() const { return re_.get(); }
  float* im() const { return im_.get(); }

 private:
  AlignedFloats re_, im_;
};

// Which sequences of a call take the position channel by FFT, and their forward and backward.
class PositionFft {
 public:
  // Covers no sequence (a precision whose elements are not fp32).
  explicit PositionFft(const Sequences& seqs) : seqs_(seqs) {}

  // Covers the sequences whose rows see exactly keys [0, i] (StructuredMask::plain_causal), all of
  // them queries, with at least kPositionFftMinKeys keys in one run of rows, when the channel is
  // the position table alone.
  PositionFft(const Sequences& seqs, const MaskSource<float>& mask, const BiasSource<float>& bias)
      : seqs_(seqs) {
    if (bias.kind != BiasKind::kRelative || bias.pos_w == nullptr || bias.ts_w != nullptr ||
        seqs.keys.row_begin == nullptr || !lane_fft_available()) {
      return;
    }
    pos_w_ = bias.pos_w;
    for (int64_t b = 0; b < seqs.count; ++b) {
      const int64_t n = seqs.keys.length[b];
      if (n >= kPositionFftMinKeys && seqs.q_length[b] == n &&
          mask.structured(b, n).plain_causal()) {
        sequences_.push_back(b);
      }
    }
    // Longest first, for the dynamic schedule's balance.
    std::stable_sort(sequences_.begin(), sequences_.end(), [&](int64_t a, int64_t b) {
      return seqs.keys.length[a] > seqs.keys.length[b];
    });
    covered_.assign(static_cast<size_t>(seqs.count), 0);
    for (const int64_t b : sequences_) covered_[b] = 1;
  }

  // Whether sequence b's position channel goes by FFT (its blocks then skip the channel).
  bool covers(int64_t b) const { return !covered_.empty() && covered_[b] != 0; }
  bool any() const { return !sequences_.empty(); }

  // The channel's output rows of the covered sequences (any()): head h of query row r at
  // out[r * ld_out + h * head_stride].
  void forward(const Rows<float>& v, int64_t heads, int64_t dv, float* out, int64_t ld_out,
               int64_t head_stride) const {
    const Spectra spectra(*this);
    for_each_sequence_head(heads, [&](int64_t, int64_t b, int64_t h, Scratch& s) {
      const int64_t n = seqs_.keys.length[b], size = position_fft_size(n);
      const Spectrum& w = spectra.of(size);
      float* o = out + seqs_.query_row(b, 0) * ld_out + h * head_stride;
      for_each_pair_group(dv, [&](int64_t c0, int64_t cols) {
        lane_fft_load_pairs(v.at(seqs_.keys.row(b, 0), h, dv) + c0, v.stride, n, cols, size,
                            s.signal.re(), s.signal.im());
        lane_fft_forward(spectra.twiddles, size, s.signal.re(), s.signal.im());
        lane_fft_multiply(s.signal.re(), s.signal.im(), size, w.re.data(), w.im.data(), false);
        lane_fft_inverse(spectra.twiddles, size, s.signal.re(), s.signal.im());
        lane_fft_store_pairs(s.signal.re(), s.signal.im(), n, cols, 1.0f / size, false, o + c0,
                             ld_out);
      });
    });
  }

  // The channel's backward over the covered sequences (any()): dO_p addressed as forward's out; the
  // value gradient added to dv [key rows, H, Dv] (contiguous), the table's to pos_grad [2N - 1]
  // (null: not wanted).
  void backward(const Rows<float>& v, int64_t heads, int64_t dv, const float* grad_out,
                int64_t ld_go, int64_t head_stride, float* grad_v, double* pos_grad) const {
    const Spectra spectra(*this);
    // Per thread slot and transform size, the lanes' summed cross spectra dO conj(V).
    const int64_t slots = max_threads(), sizes = spectra.count();
    std::vector<std::unique_ptr<SignalBlock>> cross(static_cast<size_t>(slots * sizes));
    for_each_sequence_head(heads, [&](int64_t slot, int64_t b, int64_t h, Scratch& s) {
      const int64_t n = seqs_.keys.length[b], size = position_fft_size(n);
      const int64_t row = seqs_.keys.row(b, 0);
      const Spectrum& w = spectra.of(size);
      std::unique_ptr<SignalBlock>& sum = cross[slot * sizes + spectra.index(size)];
      if (pos_grad != nullptr && sum == nullptr) {
        sum = std::make_unique<SignalBlock>(size);
        std::fill_n(sum->re(), size * kFftLanes, 0.0f);
        std::fill_n(sum->im(), size * kFftLanes, 0.0f);
      }
      const float* go = grad_out + seqs_.query_row(b, 0) * ld_go + h * head_stride;
      for_each_pair_group(dv, [&](int64_t c0, int64_t cols) {
        SignalBlock& g = s.signal;
        lane_fft_load_pairs(go + c0, ld_go, n, cols, size, g.re(), g.im());
        lane_fft_forward(spectra.twiddles, size, g.re(), g.im());
        if (pos_grad != nullptr) {
          SignalBlock& x = s.values;
          lane_fft_load_pairs(v.at(row, h, dv) + c0, v.stride, n, cols, size, x.re(), x.im());
          lane_fft_forward(spectra.twiddles, size, x.re(), x.im());
          lane_fft_add_cross_spectrum(g.re(), g.im(), x.re(), x.im(), size, sum->re(), sum->im());
        }
        lane_fft_multiply(g.re(), g.im(), size, w.re.data(), w.im.data(), true);
        lane_fft_inverse(spectra.twiddles, size, g.re(), g.im());
        lane_fft_store_pairs(g.re(), g.im(), n, cols, 1.0f / size, true,
                             grad_v + (row * heads + h) * dv + c0, heads * dv);
      });
    });
    if (pos_grad == nullptr) return;
    for (int64_t k = 0; k < sizes; ++k) {
      SignalBlock* total = nullptr;
      for (int64_t slot = 0; slot < slots; ++slot) {
        SignalBlock* part = cross[slot * sizes + k].get();
        if (part == nullptr) continue;
        if (total == nullptr) {
          total = part;
          continue;
        }
        const int64_t size = spectra.size(k);
        for (int64_t i = 0; i < size * kFftLanes; ++i) {
          total->re()[i] += part->re()[i];
          total->im()[i] += part->im()[i];
        }
      }
      if (total != nullptr) add_table_gradient(spectra, spectra.size(k), *total, pos_grad);
    }
  }

 private:
  // The kernel's spectrum for one transform size (bit-reversed order, as the signals').
  struct Spectrum {
    std::vector<float> re, im;
  };

  // The twiddles and the kernel's spectrum of every transform size the covered sequences use.
  struct Spectra {
    int64_t smallest, largest;
    FftTwiddles twiddles;
    std::vector<Spectrum> by_size;  // sizes smallest, 2 smallest, ..., largest

    explicit Spectra(const PositionFft& fft)
        : smallest(position_fft_size(fft.seqs_.keys.length[fft.sequences_.back()])),
          largest(position_fft_size(fft.seqs_.keys.length[fft.sequences_.front()])),
          twiddles(largest) {
      for (int64_t size = smallest; size <= largest; size *= 2) {
        SignalBlock kernel(size);
        std::fill_n(kernel.re(), size * kFftLanes, 0.0f);
        std::fill_n(kernel.im(), size * kFftLanes, 0.0f);
        const int64_t taps = std::min(size / 2, fft.seqs_.max_len);
        for (int64_t d = 0; d < taps; ++d) {
          kernel.re()[d * kFftLanes] = fft.pos_w_[fft.seqs_.max_len - 1 - d];
        }
        lane_fft_forward(twiddles, size, kernel.re(), kernel.im());
        Spectrum s{std::vector<float>(size), std::vector<float>(size)};
        for (int64_t t = 0; t < size; ++t) {
          s.re[t] = kernel.re()[t * kFftLanes];
          s.im[t] = kernel.im()[t * kFftLanes];
        }
        by_size.push_back(std::move(s));
      }
    }
    int64_t count() const { return static_cast<int64_t>(by_size.size()); }
    int64_t index(int64_t size) const {
      int64_t k = 0;
      while ((smallest << k) < size) ++k;
      return k;
    }
    int64_t size(int64_t k) const { return smallest << k; }
    const Spectrum& of(int64_t size) const { return by_size[index(size)]; }
  };

  // A thread's signal blocks, of the largest size.
  struct Scratch {
    SignalBlock signal, values;
  };

  // fn(slot, b, h, scratch) for every covered sequence b and head h, in parallel.
  template <typename Fn>
  void for_each_sequence_head(int64_t heads, Fn&& fn) const {
    const int64_t largest = position_fft_size(seqs_.keys.length[sequences_.front()]);
    struct State {
      int64_t slot;
      Scratch scratch;
    };
    parallel_for_dynamic(
        static_cast<int64_t>(sequences_.size()) * heads,
        [&](int64_t slot) {
          return State{slot, Scratch{SignalBlock(largest), SignalBlock(largest)}};
        },
        [&](State& state, int64_t item) {
          fn(state.slot, sequences_[item / heads], item % heads, state.scratch);
        });
  }

  // fn(c0, cols) for the groups of up to 2 kFftLanes value columns (kFftLanes pairs) of dv.
  template <typename Fn>
  static void for_each_pair_group(int64_t dv, Fn&& fn) {
    for (int64_t c0 = 0; c0 < dv; c0 += 2 * kFftLanes) fn(c0, std::min(2 * kFftLanes, dv - c0));
  }

  // pos_grad[N - 1 - d] += dw[d] for the lags d < size / 2: the real part of the inverse of the
  // summed cross spectra, summed over the lanes.
  void add_table_gradient(const Spectra& spectra, int64_t size, SignalBlock& cross,
                          double* pos_grad) const {
    lane_fft_inverse(spectra.twiddles, size, cross.re(), cross.im());
    const int64_t lags = std::min(size / 2, seqs_.max_len);
    for (int64_t d = 0; d < lags; ++d) {
      double sum = 0;
      for (int64_t l = 0; l < kFftLanes; ++l) sum += cross.re()[d * kFftLanes + l];
      pos_grad[seqs_.max_len - 1 - d] += sum / static_cast<double>(size);
    }
  }

  const Sequences& seqs_;
  const float* pos_w_ = nullptr;
  std::vector<int64_t> sequences_;  // covered, longest first
  std::vector<char> covered_;       // [B] when any
};

}  // namespace recops::attention::kernels
