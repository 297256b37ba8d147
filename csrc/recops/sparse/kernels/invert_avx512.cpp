// AVX-512 scan of invert_permute's owned-slice kernel (invert.h): compare every entry of
// permute with the slice, compress the ones that land in it (and their positions) into a small
// buffer, then store the buffer. The stores then run as a fixed-count loop; a branch per entry
// would mispredict on half of them.
#include "recops/sparse/kernels/invert.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>

RECOPS_TARGET_AVX512_BEGIN
namespace recops::sparse::kernels {
namespace {

// One 512-bit vector of permute entries, for 32- and 64-bit entries.
template <typename perm_t>
struct Lanes;

template <>
struct Lanes<int32_t> {
  static constexpr int kCount = 16;
  using Mask = __mmask16;
  static __m512i splat(int64_t x) { return _mm512_set1_epi32(static_cast<int32_t>(x)); }
  static __m512i iota() {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static __m512i load(Mask valid, const int32_t* p) { return _mm512_maskz_loadu_epi32(valid, p); }
  static __m512i sub(__m512i a, __m512i b) { return _mm512_sub_epi32(a, b); }
  static __m512i add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static Mask below(Mask valid, __m512i a, __m512i b) {
    return _mm512_mask_cmplt_epu32_mask(valid, a, b);
  }
  static __m512i compress(Mask keep, __m512i a) { return _mm512_maskz_compress_epi32(keep, a); }
};

template <>
struct Lanes<int64_t> {
  static constexpr int kCount = 8;
  using Mask = __mmask8;
  static __m512i splat(int64_t x) { return _mm512_set1_epi64(x); }
  static __m512i iota() { return _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7); }
  static __m512i load(Mask valid, const int64_t* p) { return _mm512_maskz_loadu_epi64(valid, p); }
  static __m512i sub(__m512i a, __m512i b) { return _mm512_sub_epi64(a, b); }
  static __m512i add(__m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
  static Mask below(Mask valid, __m512i a, __m512i b) {
    return _mm512_mask_cmplt_epu64_mask(valid, a, b);
  }
  static __m512i compress(Mask keep, __m512i a) { return _mm512_maskz_compress_epi64(keep, a); }
};

template <typename perm_t>
void scatter_owned(const perm_t* permute, int64_t n, int64_t lo, int64_t hi,
                   perm_t* inverse_slice) {
  using L = Lanes<perm_t>;
  using Mask = typename L::Mask;
  constexpr int kLanes = L::kCount;
  // Buffered (slot, position) pairs: a few KiB, so they stay in L1 between compress and store.
  constexpr int kBuffer = 1024;
  alignas(64) perm_t slots[kBuffer + kLanes];
  alignas(64) perm_t positions[kBuffer + kLanes];
  const __m512i slice_begin = L::splat(lo), slice_size = L::splat(hi - lo);
  const __m512i step = L::splat(kLanes);
  __m512i position = L::iota();
  int64_t i = 0;
  while (i < n) {
    int buffered = 0;
    for (; buffered <= kBuffer - kLanes && i < n; i += kLanes) {
      const Mask valid = n - i >= kLanes ? Mask(~Mask{0}) : Mask((Mask{1} << (n - i)) - 1);
      const __m512i slot = L::sub(L::load(valid, permute + i), slice_begin);
      const Mask mine = L::below(valid, slot, slice_size);  // negative slots compare huge
      _mm512_storeu_si512(slots + buffered, L::compress(mine, slot));
      _mm512_storeu_si512(positions + buffered, L::compress(mine, position));
      buffered += __builtin_popcount(mine);
      position = L::add(position, step);
    }
    for (int k = 0; k < buffered; ++k) inverse_slice[slots[k]] = positions[k];
  }
}

}  // namespace

void scatter_owned_avx512(const int32_t* permute, int64_t n, int64_t lo, int64_t hi,
                          int32_t* inverse_slice) {
  scatter_owned(permute, n, lo, hi, inverse_slice);
}

void scatter_owned_avx512(const int64_t* permute, int64_t n, int64_t lo, int64_t hi,
                          int64_t* inverse_slice) {
  scatter_owned(permute, n, lo, hi, inverse_slice);
}

}  // namespace recops::sparse::kernels
RECOPS_TARGET_END
#endif
