// Parallel helpers. Grain-size policy for at::parallel_for: give each task roughly
// kTargetBytesPerTask of memory traffic so thread start-up is amortised, but never less than one
// item. Fixed chunking for reductions: see num_chunks.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <thread>

namespace recops {

constexpr int64_t kTargetBytesPerTask = 64 * 1024;

inline int64_t grain_for_bytes(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kTargetBytesPerTask / std::max<int64_t>(1, bytes_per_item));
}

// Runs work(thread_state, item) for items 0..num_items-1 with dynamic scheduling: each thread
// claims the next unprocessed item, so items of very different cost (causal attention blocks,
// jagged sequences) balance across threads. make_state(slot) builds per-thread scratch once per
// participating thread; slots are distinct and below at::get_num_threads(), so they can index
// per-thread partial results. Order items by decreasing cost for the best balance.
template <typename MakeState, typename Work>
void parallel_for_dynamic(int64_t num_items, MakeState&& make_state, Work&& work) {
  if (num_items <= 0) return;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> next_slot{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), num_items);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
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
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), chunks);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
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
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), by_size));
}

// Calls fn(chunk, begin, end) for the `chunks` contiguous, near-equal ranges of [0, n), in
// parallel.
template <typename Fn>
void for_each_chunk(int64_t n, int64_t chunks, const Fn& fn) {
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) fn(c, n * c / chunks, n * (c + 1) / chunks);
  });
}

}  // namespace recops
