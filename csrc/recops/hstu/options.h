// The options of HSTU and FuXi-alpha attention, each declared once: the schema text below (names,
// types, defaults; the forward's and the backward's schemas are both built from it), the struct
// the adapters take, and the one function that fills the struct from a call's arguments by name.
// The delta ops (kDeltaArguments) fill the same structs; what their schema lacks keeps its
// default. Adding an option: its schema entry and struct field here, its use in the adapter /
// kernel; the Python entry points pass options through by name (recops/operators/hstu.py,
// recops/operators/fuxi.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>
#include <string>

#include "recops/common/named_args.h"

namespace recops::attention {

// The differentiable tensors (attn_bias, ts_w, pos_w; FuXi's ts_bias, pos_bias) are positional:
// torch.library's autograd gives gradients to positional arguments only.
constexpr const char* kHstuArguments =
    "Tensor q, Tensor k, Tensor v, Tensor seq_offsets, Tensor? seq_lengths, SymInt max_seq_len, "
    "float alpha=1.0, float? silu_scale=None, str mask_type=\"causal\", "
    "int contextual_seq_len=0, Tensor? num_targets=None, int target_group_size=1, "
    "int max_attn_len=0, Tensor? custom_mask=None, Tensor? attn_bias=None, "
    "Tensor? timestamps=None, Tensor? ts_w=None, Tensor? pos_w=None, bool query_time_shift=True, "
    "float bucket_divisor=0.301";

constexpr const char* kFuxiArguments =
    "Tensor q, Tensor k, Tensor v, Tensor seq_offsets, Tensor? seq_lengths, SymInt max_seq_len, "
    "float alpha=1.0, float? silu_scale=None, str mask_type=\"causal\", "
    "int contextual_seq_len=0, Tensor? num_targets=None, int target_group_size=1, "
    "int max_attn_len=0, Tensor? custom_mask=None, Tensor? ts_bias=None, Tensor? pos_bias=None, "
    "Tensor? timestamps=None, Tensor? ts_w=None, Tensor? pos_w=None, bool query_time_shift=True, "
    "float bucket_divisor=0.301, bool reference_layout=False";

// A delta step (forward only): the new rows q [R, H, Dqk] of each sequence, delta_offsets
// [B + 1] apart, attend to all of its keys, the cached rows and the new ones (the last of them),
// under the causal structured mask. The keys are k, v [L, H, D] with seq_offsets, or the pages
// k, v [pages, page_rows, H, D] through page_table [B, max_pages] with seq_lengths (keys per
// sequence); timestamps are aligned with the keys' rows ([L], or [pages, page_rows]).
constexpr const char* kDeltaArguments =
    "Tensor q, Tensor k, Tensor v, Tensor delta_offsets, Tensor? seq_offsets, "
    "Tensor? page_table, Tensor? seq_lengths, SymInt max_seq_len, float alpha=1.0, "
    "float? silu_scale=None, int contextual_seq_len=0, Tensor? num_targets=None, "
    "int target_group_size=1, int max_attn_len=0, Tensor? timestamps=None, Tensor? ts_w=None, "
    "Tensor? pos_w=None, bool query_time_shift=True, float bucket_divisor=0.301";

struct HstuOptions {
  int64_t max_seq_len;
  double alpha, silu_scale;  // silu_scale defaults to 1 / max_seq_len
  std::string mask_type;
  int64_t contextual_seq_len;
  std::optional<at::Tensor> num_targets;
  int64_t target_group_size, max_attn_len;
  std::optional<at::Tensor> custom_mask, attn_bias, timestamps, ts_w, pos_w;
  bool query_time_shift;
  double bucket_divisor;
};

// FuXi-alpha: HSTU's options (no attn_bias) plus the two dense bias channels and the layout.
struct FuxiOptions {
  HstuOptions base;
  std::optional<at::Tensor> ts_bias, pos_bias;  // dense [B, N, N] / [1, N, N]
  bool reference_layout;  // per head [position, time, semantic] instead of channel-major
};

inline HstuOptions read_hstu_options(const NamedArgs& args) {
  HstuOptions o;
  o.max_seq_len = args.integer("max_seq_len");
  o.alpha = args.real("alpha");
  o.silu_scale = args.optional_real("silu_scale")
                     .value_or(1.0 / static_cast<double>(std::max<int64_t>(o.max_seq_len, 1)));
  o.mask_type = args.has("mask_type") ? args.string("mask_type") : "causal";  // delta: causal
  o.contextual_seq_len = args.integer("contextual_seq_len");
  o.num_targets = args.optional_tensor("num_targets");
  o.target_group_size = args.integer("target_group_size");
  o.max_attn_len = args.integer("max_attn_len");
  o.custom_mask = args.optional_tensor("custom_mask");
  o.attn_bias = args.optional_tensor("attn_bias");  // absent from FuXi's and delta's: nullopt
  o.timestamps = args.optional_tensor("timestamps");
  o.ts_w = args.optional_tensor("ts_w");
  o.pos_w = args.optional_tensor("pos_w");
  o.query_time_shift = args.flag("query_time_shift");
  o.bucket_divisor = args.real("bucket_divisor");
  return o;
}

inline FuxiOptions read_fuxi_options(const NamedArgs& args) {
  return FuxiOptions{read_hstu_options(args), args.optional_tensor("ts_bias"),
                     args.optional_tensor("pos_bias"), args.flag("reference_layout")};
}

}  // namespace recops::attention
