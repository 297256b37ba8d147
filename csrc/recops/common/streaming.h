// Stores that bypass the caches, for outputs too large to stay in them. A normal store first reads
// its line into the cache (the write-allocate read) and later writes it back: a copy moves 3 bytes
// over the memory bus per byte copied. Non-temporal stores write whole lines straight to memory:
// 2 bytes per byte, about 1.2x the copy rate on 2 threads here (93 -> 110 GB/s). They only pay
// when the output would be evicted before anyone reads it anyway, hence should_stream.
//
// Streaming stores are weakly ordered: a task that made them calls store_fence() before the data
// is read by another thread (at the end of its parallel task).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define RECOPS_STREAMING_STORES 1
#else
#define RECOPS_STREAMING_STORES 0
#endif

namespace recops {

// Runs shorter than this are copied with normal stores: streaming pays per whole 64-byte line.
constexpr int64_t kStreamingMinBytes = 512;

// The size in bytes of the largest cache cpu0 has, from sysfs (32 MiB where it does not say).
// sysconf(_SC_LEVEL3_CACHE_SIZE) is not used: in VMs it reports the host's total over all its
// core complexes (512 MiB on a machine where one core reaches 32 MiB).
inline int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    int64_t largest = 0;
    for (int index = 0; index < 8; ++index) {
      const std::string path =
          "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size";
      std::ifstream file(path);
      int64_t size = 0;
      char unit = 0;
      if (!(file >> size)) continue;
      file >> unit;
      if (unit == 'K') size <<= 10;
      if (unit == 'M') size <<= 20;
      largest = std::max(largest, size);
    }
    return largest > 0 ? largest : int64_t{32} << 20;
  }();
  return bytes;
}

// Whether an op writing `output_bytes` should stream them: when they exceed the last-level cache,
// the caller could not find them there anyway. RECOPS_STREAM_ABOVE_BYTES=<n> moves the threshold
// (read per call, so tests can force either path).
inline bool should_stream(int64_t output_bytes) {
  if (!RECOPS_STREAMING_STORES) return false;
  const char* threshold = std::getenv("RECOPS_STREAM_ABOVE_BYTES");
  return output_bytes > (threshold != nullptr ? std::atoll(threshold) : last_level_cache_bytes());
}

inline void store_fence() {
#if RECOPS_STREAMING_STORES
  _mm_sfence();
#endif
}

#if RECOPS_STREAMING_STORES
// Writes [out, out + bytes): each whole 64-byte line of it by stream_line(offset of the line),
// the partial lines at both ends by normal(offset, count) (a streaming store to a partial line
// costs a read of it from memory).
template <typename Normal, typename StreamLine>
void write_whole_lines_streamed(char* out, int64_t bytes, const Normal& normal,
                                const StreamLine& stream_line) {
  const int64_t head = (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64;
  normal(0, head);
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) stream_line(i);
  normal(i, bytes - i);
}
#endif

// memcpy whose whole 64-byte lines of the destination are written by streaming stores (for runs
// of any length; copy_bytes keeps short runs to normal stores).
inline void copy_bytes_streamed(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return;  // as in copy_bytes
#if RECOPS_STREAMING_STORES
  char* out = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  write_whole_lines_streamed(
      out, bytes, [&](int64_t at, int64_t count) { std::memcpy(out + at, in + at, count); },
      [&](int64_t at) {
        __m128i parts[4];
        for (int k = 0; k < 4; ++k) {
          parts[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at + 16 * k));
        }
        for (int k = 0; k < 4; ++k) {
          _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 16 * k), parts[k]);
        }
      });
#else
  std::memcpy(dst, src, bytes);
#endif
}

// memcpy, streamed (copy_bytes_streamed) when `streaming` and the run is long enough.
inline void copy_bytes(void* dst, const void* src, int64_t bytes, bool streaming) {
  // memcpy needs valid pointers even for 0 bytes, and an empty tensor's data pointer is null.
  if (bytes == 0) return;
  if (streaming && bytes >= kStreamingMinBytes) {
    copy_bytes_streamed(dst, src, bytes);
    return;
  }
  std::memcpy(dst, src, bytes);
}

// memset, streamed like copy_bytes.
inline void set_bytes(void* dst, unsigned char byte, int64_t bytes, bool streaming) {
  if (bytes == 0) return;  // as in copy_bytes
#if RECOPS_STREAMING_STORES
  if (streaming && bytes >= kStreamingMinBytes) {
    char* out = static_cast<char*>(dst);
    const __m128i pattern = _mm_set1_epi8(static_cast<char>(byte));
    write_whole_lines_streamed(
        out, bytes, [&](int64_t at, int64_t count) { std::memset(out + at, byte, count); },
        [&](int64_t at) {
          for (int k = 0; k < 4; ++k) {
            _mm_stream_si128(reinterpret_cast<__m128i*>(out + at + 16 * k), pattern);
          }
        });
    return;
  }
#else
  (void)streaming;
#endif
  if (bytes > 0) std::memset(dst, byte, bytes);
}

}  // namespace recops
