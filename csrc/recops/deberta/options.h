// The options of DeBERTa's disentangled attention, declared once: the schema text (the forward's,
// the alias's and the backward's schemas are built from it), the struct the adapters take, and
// the function that fills it from a call's arguments by name.
#pragma once

#include <optional>
#include <string>

#include "recops/common/named_args.h"

namespace recops::attention {

constexpr const char* kDisentangledOptionArguments =
    "str pos_att_type=\"c2p|p2c\", int position_buckets=256, int max_relative_positions=512, "
    "float? scale=None, float dropout_p=0.0, int seed=0";

struct DisentangledOptions {
  std::string pos_att_type;  // "c2p|p2c", any subset, "" for none
  int64_t position_buckets, max_relative_positions;
  std::optional<double> scale;
  double dropout_p;
  int64_t seed;
};

inline DisentangledOptions read_disentangled_options(const NamedArgs& args) {
  return DisentangledOptions{args.string("pos_att_type"),
                             args.integer("position_buckets"),
                             args.integer("max_relative_positions"),
                             args.optional_real("scale"),
                             args.real("dropout_p"),
                             args.integer("seed")};
}

}  // namespace recops::attention
