// Software prefetches, for streams the hardware prefetcher does not run far enough ahead of: rows
// read at a stride (a head's slice of every key row), one 4 KiB page after another, while the
// loop computes on the rows before them. Prefetches never fault, so the addresses may be past
// what is read; callers still keep them inside the arrays they index.
#pragma once

#include <algorithm>
#include <cstdint>

namespace recops {

// Prefetches the cache lines of `bytes` bytes starting at p (addresses are never dereferenced);
// kForWrite fetches them ready to be written (prefetchw), kLocality is __builtin_prefetch's
// (3: all cache levels, 2: L2 and below). Always inlined: GCC deems a function that only
// prefetches free of side effects and deletes calls to it that it did not inline.
template <int kForWrite = 0, int kLocality = 3>
__attribute__((always_inline)) inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* line = static_cast<const char*>(p);
  const char* end = line + bytes;
  for (; line + 512 <= end; line += 512) {  // unrolled: a loop per line measured 20% slower
    for (int64_t off = 0; off < 512; off += 64)
      __builtin_prefetch(line + off, kForWrite, kLocality);
  }
  for (; line < end; line += 64) __builtin_prefetch(line, kForWrite, kLocality);
}

// Prefetches `cols` values of each of rows [first, first + count) of a matrix of row stride ld.
template <typename T>
__attribute__((always_inline)) inline void prefetch_rows(const T* matrix, int64_t ld, int64_t first,
                                                         int64_t count, int64_t cols) {
  for (int64_t r = first; r < first + count; ++r) {
    prefetch_bytes(matrix + r * ld, cols * static_cast<int64_t>(sizeof(T)));
  }
}

}  // namespace recops
