#include "recops/hstu/delta.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/zeros.h>

#include "recops/common/checks.h"

namespace recops::attention {
namespace {

using namespace kernels;

// q [R, H, Dqk]; k, v [L, H, D] (jagged rows) or [pages, page_rows, H, D] (paged), all of one
// floating dtype, with q's heads and k's head dim.
void check_delta_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool paged) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_cpu(*t, name);
    check_floating(*t, name);
  }
  check_dim(q, 3, "q");
  const int64_t kv_dim = paged ? 4 : 3;
  TORCH_CHECK(k.dim() == kv_dim && v.dim() == kv_dim, "k and v must be ",
              paged ? "4-D pages [pages, page_rows, H, D] (with page_table)"
                    : "3-D jagged rows [L, H, D] (with seq_offsets)",
              ", got shapes ", k.sizes(), " and ", v.sizes());
  check_same_dtype(q, "q", k, "k");
  check_same_dtype(q, "q", v, "v");
  TORCH_CHECK(v.size(0) == k.size(0) && (!paged || v.size(1) == k.size(1)),
              "k and v must have the same ", paged ? "pages" : "rows", ", got shapes ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(k.size(-2) == q.size(1) && v.size(-2) == q.size(1),
              "q, k and v must have the same number of heads, got ", q.size(1), ", ", k.size(-2),
              " and ", v.size(-2));
  TORCH_CHECK(k.size(-1) == q.size(2), "q and k must have the same head dim, got ", q.size(2),
              " and ", k.size(-1));
}

// delta_offsets [B + 1]: the new rows of each sequence in q, ending at its last row.
at::Tensor checked_delta_offsets(const at::Tensor& delta_offsets, int64_t query_rows) {
  check_cpu(delta_offsets, "delta_offsets");
  check_dim(delta_offsets, 1, "delta_offsets");
  check_index_dtype(delta_offsets, "delta_offsets");
  TORCH_CHECK(delta_offsets.numel() >= 1, "delta_offsets must have B + 1 >= 1 entries, got none");
  const at::Tensor offsets = delta_offsets.to(at::kLong).contiguous();
  check_offsets_monotonic(offsets, "delta_offsets");
  TORCH_CHECK(offsets.const_data_ptr<int64_t>()[0] == 0, "delta_offsets[0] must be 0, got ",
              offsets.const_data_ptr<int64_t>()[0]);
  const int64_t last = offsets.const_data_ptr<int64_t>()[offsets.numel() - 1];
  TORCH_CHECK(last == query_rows, "delta_offsets[-1] = ", last,
              " must equal the number of rows of q (", query_rows, ")");
  return offsets;
}

// The keys of a paged step: page_table [B, max_pages] and seq_lengths [B], every page a sequence
// uses in [0, pages).
PreparedSequences paged_sequences(const at::Tensor& page_table,
                                  const std::optional<at::Tensor>& seq_lengths, int64_t batch,
                                  int64_t pages, int64_t page_rows, int64_t max_seq_len) {
  check_cpu(page_table, "page_table");
  check_dim(page_table, 2, "page_table");
  check_index_dtype(page_table, "page_table");
  TORCH_CHECK(page_table.size(0) == batch, "page_table must have B = ", batch, " rows, got ",
              page_table.size(0));
  TORCH_CHECK(seq_lengths.has_value(), "page_table needs seq_lengths (the keys of each sequence)");
  check_cpu(*seq_lengths, "seq_lengths");
  check_dim(*seq_lengths, 1, "seq_lengths");
  check_index_dtype(*seq_lengths, "seq_lengths");
  TORCH_CHECK(seq_lengths->numel() == batch, "seq_lengths must have B = ", batch, " entries, got ",
              seq_lengths->numel());
  TORCH_CHECK_VALUE(max_seq_len >= 0, "max_seq_len must be >= 0, got ", max_seq_len);
  PreparedSequences p;
  p.length = seq_lengths->to(at::kLong).contiguous();
  check_lengths_non_negative(p.length, "seq_lengths");
  p.pages = page_table.to(at::kLong).contiguous();
  const int64_t* length = p.length.const_data_ptr<int64_t>();
  const int64_t* table = p.pages.const_data_ptr<int64_t>();
  const int64_t width = page_table.size(1);
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(length[b] <= max_seq_len, "sequence ", b, " has length ", length[b],
                " (from seq_lengths) > max_seq_len = ", max_seq_len);
    const int64_t used = (length[b] + page_rows - 1) / page_rows;
    TORCH_CHECK(used <= width, "sequence ", b, " has ", length[b], " keys, ", used, " pages of ",
                page_rows, " rows, but page_table has ", width, " columns");
    for (int64_t j = 0; j < used; ++j) {
      TORCH_CHECK(table[b * width + j] >= 0 && table[b * width + j] < pages, "page_table[", b, ", ",
                  j, "] = ", table[b * width + j], " is not a page of k (", pages, " pages)");
    }
  }
  return p;
}

// The queries of every sequence: its last q_length[b] = diff(delta_offsets) positions.
void add_queries(PreparedSequences& p, const at::Tensor& delta_offsets) {
  const int64_t batch = delta_offsets.numel() - 1;
  p.q_row_begin = delta_offsets.slice(0, 0, batch).contiguous();
  p.q_length = at::sub(delta_offsets.slice(0, 1), delta_offsets.slice(0, 0, batch)).contiguous();
  const int64_t* q_length = p.q_length.const_data_ptr<int64_t>();
  const int64_t* length = p.length.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(q_length[b] <= length[b], "delta_offsets gives sequence ", b, " ", q_length[b],
                " new rows, more than its ", length[b], " keys");
  }
}

// The paged step as a jagged one: each sequence's keys, values and times copied out of its pages.
DeltaAttention gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const DeltaKeys& keys, const HstuOptions& options, const Sequences& paged) {
  int64_t total = 0;
  for (int64_t b = 0; b < paged.count; ++b) total += paged.keys.length[b];
  at::Tensor rows = at::empty({total}, at::kLong);
  int64_t* row = rows.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < paged.count; ++b) {
    paged.keys.for_each_run(b, 0, paged.keys.length[b], [&](int64_t first, int64_t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *row++ = first + i;
    });
  }
  const at::Tensor length = keys.seq_lengths->to(at::kLong);
  const at::Tensor offsets = at::cat({at::zeros({1}, length.options()), at::cumsum(length, 0)});
  HstuOptions jagged = options;
  if (options.timestamps.has_value()) {
    jagged.timestamps = options.timestamps->reshape({-1}).index_select(0, rows);
  }
  const DeltaKeys jagged_keys{keys.delta_offsets, offsets, std::nullopt, std::nullopt};
  return prepare_delta_attention(q, k.flatten(0, 1).index_select(0, rows),
                                 v.flatten(0, 1).index_select(0, rows), jagged_keys, jagged);
}

}  // namespace

DeltaAttention prepare_delta_attention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const DeltaKeys& keys,
                                       const HstuOptions& options) {
  TORCH_CHECK(keys.seq_offsets.has_value() != keys.page_table.has_value(),
              "pass the keys as jagged rows (seq_offsets) or as pages (page_table with "
              "seq_lengths), one of the two");
  const bool paged = keys.page_table.has_value();
  check_delta_qkv(q, k, v, paged);
  const at::Tensor delta_offsets = checked_delta_offsets(keys.delta_offsets, q.size(0));
  const int64_t batch = delta_offsets.numel() - 1;
  DeltaAttention d;
  d.k = paged ? k.reshape({-1, k.size(2), k.size(3)}) : k;
  d.v = paged ? v.reshape({-1, v.size(2), v.size(3)}) : v;
  d.options = options;
  PreparedAttention& a = d.attention;
  a.rows = q.size(0);
  a.heads = q.size(1);
  a.compute = compute_dtype(q);
  check_finite(options.alpha, "alpha", a.compute);
  check_finite(options.silu_scale, "silu_scale", a.compute);
  if (paged) {
    a.seqs = paged_sequences(*keys.page_table, keys.seq_lengths, batch, k.size(0), k.size(1),
                             options.max_seq_len);
    if (options.timestamps.has_value()) {
      const at::Tensor& ts = *options.timestamps;
      TORCH_CHECK(ts.dim() == 2 && ts.size(0) == k.size(0) && ts.size(1) == k.size(1),
                  "with page_table, timestamps must be the pages' [pages, page_rows] = [",
                  k.size(0), ", ", k.size(1), "], got shape ", ts.sizes());
      d.options.timestamps = ts.reshape({-1});
    }
  } else {
    a.seqs = prepare_sequences(k.size(0), *keys.seq_offsets, keys.seq_lengths, options.max_seq_len);
    TORCH_CHECK(a.seqs.view.count == batch, "seq_offsets and delta_offsets must describe the same ",
                "B sequences, got ", a.seqs.view.count, " and ", batch);
  }
  add_queries(a.seqs, delta_offsets);
  PreparedSequences& s = a.seqs;
  s.key_rows = d.k.size(0);
  s.query_rows = a.rows;
  const int64_t* q_begin = s.q_row_begin.const_data_ptr<int64_t>();
  const int64_t* q_length = s.q_length.const_data_ptr<int64_t>();
  const int64_t* length = s.length.const_data_ptr<int64_t>();
  KeyRows key_rows{nullptr, length};
  if (paged) {
    key_rows.pages = s.pages.const_data_ptr<int64_t>();
    key_rows.page_stride = s.pages.size(1);
    key_rows.page_rows = k.size(1);
  } else {
    key_rows.row_begin = s.row_begin.const_data_ptr<int64_t>();
  }
  s.view = Sequences::with_keys(batch, q_begin, q_length, key_rows, options.max_seq_len);
  if (paged) {
    // The kernels would convert all of k and v to their compute type (fp16 pages, or bf16 pages
    // without the bf16 tiles): only this step's keys are copied and converted instead. The bf16
    // tiles pair keys, so their runs (pages) start at even keys.
    const bool converted = !(Bf16Inputs::applies(q, d.k, d.v) || k.scalar_type() == at::kFloat ||
                             k.scalar_type() == at::kDouble);
    if (converted) return gathered(q, k, v, keys, options, s.view);
    TORCH_CHECK(!Bf16Inputs::applies(q, d.k, d.v) || k.size(1) % 2 == 0,
                "bf16 pages must have an even number of rows (page_rows), got ", k.size(1));
  }
  a.mask = prepare_mask(d.options, s.view, a.heads, a.compute);
  return d;
}

}  // namespace recops::attention
