// The parallel-loop interface kernels use, torch-free. Three functions form the backend, linked in
// once per binary: parallel_aten.cpp (at::parallel_for, in the extension, so kernels share
// PyTorch's thread pool and its torch.set_num_threads) and tests/cpp's OpenMP one (C++ tests).
// Both keep at::parallel_for's contract: the body gets contiguous chunks of at least `grain` items
// (the last may be shorter); inside a parallel region, or with one thread, the whole range runs
// inline on the calling thread, and the body then also counts as inside a parallel region.
//
// On top of it, the helpers every family shares. Grain-size policy: give each task roughly
// kTargetBytesPerTask of memory traffic so thread start-up is amortised, but never less than one
// item. Fixed chunking for reductions: see num_chunks.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "recops/common/function_ref.h"

namespace recops {

// ---- The backend.

// Threads a parallel region may use (at::get_num_threads() in the extension).
int max_threads();

// Whether the calling thread runs the body of a parallel_for.
bool in_parallel_region();

// Calls body(chunk_begin, chunk_end) over chunks covering [begin, end), in parallel.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  FunctionRef<void(int64_t, int64_t)> body);

// ---- Helpers built on it.

constexpr int64_t kTargetBytesPerTask = 64 * 1024;

inline int64_t grain_for_bytes(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kTargetBytesPerTask / std::max<int64_t>(1, bytes_per_item));
}

// Runs work(thread_state, item) for items 0..num_items-1 with dynamic scheduling: each thread
// claims the next unprocessed item, so items of very different cost (causal attention blocks,
// jagged sequences) balance across threads. make_state(slot) builds per-thread scratch once per
// participating thread; slots are distinct and below max_threads(), so they can index per-thread
// partial results. Order items by decreasing cost for the best balance.
template <typename MakeState, typename Work>
void parallel_for_dynamic(int64_t num_items, MakeState&& make_state, Work&& work) {
  if (num_items <= 0) return;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> next_slot{0};
  const int64_t threads = std::min<int64_t>(max_threads(), num_items);
  parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    auto state = make_state(next_slot.fetch_add(1));
    for (int64_t item = next.fetch_add(1); item < num_items; item = next.fetch_add(1)) {
      work(state, item);
    }
  });
}

// Runs kPhases passes over [0, n) in chunks of `grain` items inside one parallel region, calling
// fn(phase, begin, end) for each chunk, where a chunk of phase p starts only once every chunk of
// phase p - 1 has finished: a pass that must see all of the previous one (fill, scatter, check)
// without paying a fork and join per pass. Threads claim chunks in phase order; a thread waits
// only after all chunks of the previous phase are claimed, by threads that are running them, so
// the wait always ends (also when the region runs on one thread).
template <int kPhases, typename Fn>
void parallel_phases(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  std::atomic<int64_t> next{0};
  std::array<std::atomic<int64_t>, kPhases> finished{};
  const int64_t threads = std::min<int64_t>(max_threads(), chunks);
  parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t item = next.fetch_add(1); item < kPhases * chunks; item = next.fetch_add(1)) {
      const int phase = static_cast<int>(item / chunks);
      const int64_t chunk = item % chunks;
      while (phase > 0 && finished[phase - 1].load(std::memory_order_acquire) < chunks) {
        std::this_thread::yield();
      }
      fn(phase, chunk * grain, std::min(n, (chunk + 1) * grain));
      finished[phase].fetch_add(1, std::memory_order_release);
    }
  });
}

// Kernels that reduce (histograms, sums) give each chunk of the input its own partial result and
// combine the partials afterwards. Chunks are fixed by the input size and thread count only, so
// the combined result does not depend on scheduling. At most one chunk per thread, each holding
// at least min_items items (a single chunk when n is small).
inline int64_t num_chunks(int64_t n, int64_t min_items) {
  const int64_t by_size = n / std::max<int64_t>(1, min_items);
  return std::max<int64_t>(1, std::min<int64_t>(max_threads(), by_size));
}

// Chunks of n items for a reduction whose result must be the same bits for any thread count:
// min(n, kFixedChunks) whatever the threads (partials added in chunk order).
constexpr int64_t kFixedChunks = 8;
inline int64_t fixed_chunks(int64_t n) {
  return std::min(n, kFixedChunks);
}

// Calls fn(chunk, begin, end) for the `chunks` contiguous, near-equal ranges of [0, n), in
// parallel.
template <typename Fn>
void for_each_chunk(int64_t n, int64_t chunks, const Fn& fn) {
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) fn(c, n * c / chunks, n * (c + 1) / chunks);
  });
}

// combine(...combine(identity, reduce(chunk 0, identity))..., reduce(last chunk, identity)) over
// num_chunks(end - begin, grain) chunks of [begin, end), reduced in parallel: reduce(b, e, acc)
// folds items [b, e) into acc.
template <typename T, typename Reduce, typename Combine>
T parallel_reduce(int64_t begin, int64_t end, int64_t grain, const T& identity,
                  const Reduce& reduce, const Combine& combine) {
  if (begin >= end) return identity;
  const int64_t chunks = num_chunks(end - begin, grain);
  if (chunks == 1) return reduce(begin, end, identity);
  // One slot per chunk (an array, not std::vector: vector<bool> packs bits, which two threads
  // could not write at once).
  std::unique_ptr<T[]> partial(new T[chunks]);
  for_each_chunk(end - begin, chunks, [&](int64_t c, int64_t b, int64_t e) {
    partial[c] = reduce(begin + b, begin + e, identity);
  });
  T result = identity;
  for (int64_t c = 0; c < chunks; ++c) result = combine(result, partial[c]);
  return result;
}

}  // namespace recops
