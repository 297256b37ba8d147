// mips_topk (mips_topk.h): the queries a block of rows at a time against the candidates a chunk
// of rows at a time, each chunk's scores computed into scratch and offered to one k-heap per
// query row, so the [M, N] scores never exist. The worst entry of a full heap is a threshold that
// almost every score fails with one comparison, so only the few that pass look up whether they
// are excluded (in the row's excluded candidates, sorted, walked in step with the scan). When the
// query rows make fewer blocks than there are threads, the candidates are split into spans too,
// each with its own heaps, merged per row at the end. The products read the candidates in place:
// a few query rows multiply them vector by vector along d (the attention tiles' key_row_dots,
// attention/kernels/tile_variants.h); more take the chunk's scores transposed, S^T = C Q^T, on
// common/kernels/small_gemm.h with the block's queries transposed once.
#include "recops/retrieval/kernels/mips_topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/kernels/small_gemm.h"
#include "recops/common/parallel.h"

namespace recops::retrieval::kernels {
namespace {

constexpr int64_t kQueryBlock = 48;  // query rows scored together
constexpr int64_t kChunk = 256;      // candidates per product
// Fewest query rows (fp32) whose scores small_gemm computes transposed, S^T = C Q^T: it keeps
// the block's queries in vectors of 16 along a row of S^T, so fewer leave most lanes idle.
constexpr int64_t kTransposedRows = 16;
// Fewest candidates worth a span of their own: a span costs a heap per row and a share of the
// merge, and a thread's start.
constexpr int64_t kMinSpan = 2048;

template <typename T>
struct Ranked {
  T value;
  int64_t index;
};

// The problem's total order: NaN first, then larger scores, then lower indices.
template <typename T>
bool ranks_before(const Ranked<T>& a, const Ranked<T>& b) {
  const bool a_nan = std::isnan(a.value), b_nan = std::isnan(b.value);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

// One query row's best k in one span: a heap whose front is the worst entry kept, and the row's
// excluded candidates (sorted) with a cursor at the first not below the last candidate offered.
// Candidates are offered in increasing index order.
template <typename T>
struct RowTop {
  Ranked<T>* heap;
  int64_t size;
  const int64_t* excluded;
  const int64_t* excluded_end;

  bool is_excluded(int64_t j) {
    while (excluded != excluded_end && *excluded < j) ++excluded;
    return excluded != excluded_end && *excluded == j;
  }

  // A score s can enter only when !(s <= threshold): the worst score of a full heap (an equal
  // score comes with a higher index; an excluded candidate's -inf never beats it either), NaN
  // (everything passes) while the heap fills.
  T threshold(int64_t k) const {
    return size < k ? std::numeric_limits<T>::quiet_NaN() : heap[0].value;
  }

  void offer(T score, int64_t j, int64_t k) {
    const Ranked<T> x{is_excluded(j) ? -std::numeric_limits<T>::infinity() : score, j};
    if (size < k) {
      heap[size++] = x;
      std::push_heap(heap, heap + size, ranks_before<T>);
    } else if (ranks_before(x, heap[0])) {
      std::pop_heap(heap, heap + k, ranks_before<T>);
      heap[k - 1] = x;
      std::push_heap(heap, heap + k, ranks_before<T>);
    }
  }
};

// Whether any s[i] passes its threshold t[i] (one threshold for all: t_step 0), i < n. Almost
// every score fails, so the test is a loop that vectorises: no branch per score, and an int
// accumulator (GCC 12 does not vectorise an OR into a bool).
template <typename T>
bool any_passes(const T* s, const T* t, int64_t t_step, int64_t n) {
  int any = 0;
  for (int64_t i = 0; i < n; ++i) any |= s[i] <= t[i * t_step] ? 0 : 1;
  return any != 0;
}

template <typename T>
struct Scratch {
  std::vector<T> scores;          // [kQueryBlock, kChunk], or transposed
  std::vector<T> queries_t;       // [d, kQueryBlock]: the block's queries, for small_gemm
  std::vector<int64_t> excluded;  // the block's rows' excluded candidates, each row's sorted
};

template <typename T>
class Search {
 public:
  Search(const MipsTopkProblem<T>& p, CpuIsa isa)
      : p_(p), ops_(attention::kernels::tile_ops<T>(isa)) {
    blocks_ = (p.queries + kQueryBlock - 1) / kQueryBlock;
    const int64_t wanted = (max_threads() + blocks_ - 1) / std::max<int64_t>(blocks_, 1);
    spans_ = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, p.candidates / kMinSpan));
    if constexpr (std::is_same_v<T, float>) {
      transposes_ = small_gemm_available() && p.dim >= 1 && p.dim <= kSmallGemmMaxK;
    }
    heaps_.resize(static_cast<size_t>(p.queries * spans_ * p.k));
    sizes_.assign(static_cast<size_t>(p.queries * spans_), 0);
  }

  void run(T* values, int64_t* indices) {
    const auto make_scratch = [&](int64_t) {
      Scratch<T> s;
      s.scores.resize(kQueryBlock * kChunk);
      if (transposes_) s.queries_t.resize(static_cast<size_t>(p_.dim * kQueryBlock));
      return s;
    };
    parallel_for_dynamic(blocks_ * spans_, make_scratch, [&](Scratch<T>& s, int64_t item) {
      search(s, item / spans_, item % spans_);
    });
    const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, spans_ * p_.k));
    parallel_for(0, p_.queries, grain, [&](int64_t begin, int64_t end) {
      std::vector<Ranked<T>> gathered;
      for (int64_t m = begin; m < end; ++m) merge(m, gathered, values, indices);
    });
  }

 private:
  // Query rows of block b against the candidates of span `span`.
  void search(Scratch<T>& s, int64_t b, int64_t span) {
    const int64_t r0 = b * kQueryBlock, rows = std::min(kQueryBlock, p_.queries - r0);
    const int64_t c0 = p_.candidates * span / spans_, c1 = p_.candidates * (span + 1) / spans_;
    RowTop<T> tops[kQueryBlock];
    sort_excluded(s, r0, rows);
    const int64_t* next = s.excluded.data();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t m = r0 + r;
      const int64_t count = p_.excluded_offsets ? excluded_count(m) : 0;
      tops[r] = RowTop<T>{&heaps_[(m * spans_ + span) * p_.k], 0, next, next + count};
      next += count;
    }
    const T* q = p_.query_rows + r0 * p_.ld_queries;
    const bool transposed = transposes_ && rows >= kTransposedRows;
    if (transposed) ops_.transpose(q, rows, p_.dim, p_.ld_queries, s.queries_t.data(), rows);
    T thresholds[kQueryBlock];
    for (int64_t r = 0; r < rows; ++r) thresholds[r] = tops[r].threshold(p_.k);
    // Offers score x of row r, candidate j, where it passes the row's threshold.
    const auto offer = [&](int64_t r, T x, int64_t j) {
      if (x <= thresholds[r]) return;
      tops[r].offer(x, j, p_.k);
      thresholds[r] = tops[r].threshold(p_.k);
    };
    for (int64_t j = c0; j < c1; j += kChunk) {
      const int64_t n = std::min(kChunk, c1 - j);
      const T* c = p_.candidate_rows + j * p_.ld_candidates;
      const T* scores = s.scores.data();
      if (transposed) {  // scores [n, rows]: a candidate's scores for every row
        if constexpr (std::is_same_v<T, float>) {
          small_gemm(n, rows, p_.dim, c, p_.ld_candidates, s.queries_t.data(), rows,
                     s.scores.data(), rows, false);
        }
        for (int64_t i = 0; i < n; ++i) {
          const T* x = scores + i * rows;
          if (!any_passes(x, thresholds, 1, rows)) continue;
          for (int64_t r = 0; r < rows; ++r) offer(r, x[r], j + i);
        }
      } else {  // scores [rows, n]: a row's scores for every candidate of the chunk
        ops_.key_row_dots(q, p_.ld_queries, rows, c, p_.ld_candidates, n, p_.dim, s.scores.data(),
                          kChunk);
        constexpr int64_t kGroup = 16;
        for (int64_t r = 0; r < rows; ++r) {
          const T* x = scores + r * kChunk;
          for (int64_t i = 0; i < n; i += kGroup) {
            const int64_t g = std::min(kGroup, n - i);
            if (!any_passes(x + i, thresholds + r, 0, g)) continue;
            for (int64_t e = i; e < i + g; ++e) offer(r, x[e], j + e);
          }
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) sizes_[(r0 + r) * spans_ + span] = tops[r].size;
  }

  int64_t excluded_count(int64_t m) const {
    return p_.excluded_offsets[m + 1] - p_.excluded_offsets[m];
  }

  // The excluded candidates of rows [r0, r0 + rows), each row's sorted, one after another.
  void sort_excluded(Scratch<T>& s, int64_t r0, int64_t rows) const {
    s.excluded.clear();
    if (p_.excluded_offsets == nullptr) return;
    for (int64_t m = r0; m < r0 + rows; ++m) {
      const int64_t* first = p_.excluded + p_.excluded_offsets[m];
      const size_t start = s.excluded.size();
      s.excluded.insert(s.excluded.end(), first, first + excluded_count(m));
      std::sort(s.excluded.begin() + static_cast<std::ptrdiff_t>(start), s.excluded.end());
    }
  }

  // Row m's best k of every span's, best first, into values / indices.
  void merge(int64_t m, std::vector<Ranked<T>>& gathered, T* values, int64_t* indices) const {
    gathered.clear();
    for (int64_t span = 0; span < spans_; ++span) {
      const Ranked<T>* heap = &heaps_[(m * spans_ + span) * p_.k];
      gathered.insert(gathered.end(), heap, heap + sizes_[m * spans_ + span]);
    }
    const auto kth = gathered.begin() + static_cast<std::ptrdiff_t>(p_.k);
    std::partial_sort(gathered.begin(), kth, gathered.end(), ranks_before<T>);
    for (int64_t i = 0; i < p_.k; ++i) {
      values[m * p_.k + i] = gathered[i].value;
      indices[m * p_.k + i] = gathered[i].index;
    }
  }

  const MipsTopkProblem<T>& p_;
  const attention::kernels::TileOps<T>& ops_;
  int64_t blocks_ = 0, spans_ = 1;
  bool transposes_ = false;
  std::vector<Ranked<T>> heaps_;  // [M, spans, k]
  std::vector<int64_t> sizes_;    // [M, spans]
};

}  // namespace

template <typename T>
void mips_topk(const MipsTopkProblem<T>& p, T* values, int64_t* indices, CpuIsa isa) {
  if (p.queries == 0 || p.k == 0) return;
  Search<T>(p, isa).run(values, indices);
}

template void mips_topk<float>(const MipsTopkProblem<float>&, float*, int64_t*, CpuIsa);
template void mips_topk<double>(const MipsTopkProblem<double>&, double*, int64_t*, CpuIsa);

}  // namespace recops::retrieval::kernels
