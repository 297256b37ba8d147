// Fresh large outputs. A multi-hundred-MB output from the allocator is new anonymous memory that
// the OS maps in on first touch; with 4 KiB pages that is one fault (and one page zeroing) per
// 4 KiB, which costs more than the copy that fills the output. Advising transparent huge pages
// before the first write cuts the faults 512-fold. The advice is best effort and changes no data;
// RECOPS_HUGE_PAGES=0 turns it off (a fault on such a page may compact memory when the system is
// short of free 2 MiB blocks: the same trade PyTorch's opt-in THP_MEM_ALLOC_ENABLE makes).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace recops {

// Below this an allocation is usually recycled heap memory (glibc mmaps afresh only from 32 MiB).
constexpr int64_t kHugePageAdviceMinBytes = 32 << 20;

// Marks the 2 MiB-aligned interior of [data, data + bytes) for transparent huge pages. Call it on
// a freshly allocated buffer before writing to it.
inline void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  static const bool enabled = [] {
    const char* setting = std::getenv("RECOPS_HUGE_PAGES");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  if (!enabled || bytes < kHugePageAdviceMinBytes) return;
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (start + static_cast<uintptr_t>(bytes)) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace recops
