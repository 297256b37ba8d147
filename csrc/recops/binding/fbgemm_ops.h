// FBGEMM's ops that recops implements with FBGEMM's schemas (docs/ops.md section 1): the one list.
// recops defines each fbgemm:: schema FBGEMM has not defined when its library loads
// (fbgemm_schemas.cpp), recops/_fbgemm.py reads the list through torch.ops.recops._fbgemm_binding,
// and tests/torchrec_trace.py reads it from this file (one entry a line, `{"name", Kind},`).
#pragma once

#include <string_view>

namespace recops::binding {

enum class FbgemmOpKind {
  kKernel,     // served by redispatching to the recops:: twin's kernels
  kComposite,  // a CompositeImplicitAutograd kernel calling fbgemm:: ops; nothing of its own to
               // route
};

struct FbgemmOp {
  const char* name;
  FbgemmOpKind kind;
};

inline constexpr FbgemmOpKind kKernel = FbgemmOpKind::kKernel;
inline constexpr FbgemmOpKind kComposite = FbgemmOpKind::kComposite;

inline constexpr FbgemmOp kFbgemmOps[] = {
    {"asynchronous_complete_cumsum", kKernel},
    {"asynchronous_exclusive_cumsum", kKernel},
    {"asynchronous_inclusive_cumsum", kKernel},
    {"jagged_to_padded_dense", kComposite},
    {"jagged_to_padded_dense_forward", kKernel},
    {"jagged_to_padded_dense_backward", kKernel},
    {"dense_to_jagged", kComposite},
    {"dense_to_jagged_forward", kKernel},
    {"jagged_2d_to_dense", kKernel},
    {"jagged_1d_to_dense", kKernel},
    {"permute_2D_sparse_data", kKernel},
    {"permute_1D_sparse_data", kKernel},
    {"invert_permute", kKernel},
    {"block_bucketize_sparse_features", kKernel},
    {"offsets_range", kKernel},
    {"permute_pooled_embs", kKernel},
    {"permute_pooled_embs_split", kKernel},
    {"permute_pooled_embs_auto_grad", kKernel},
    {"permute_pooled_embs_auto_grad_split", kKernel},
    // torchrec utilities: managed-collision hashing, feature gates, memory kinds, index select
    {"create_zch_buffer", kKernel},
    {"zero_collision_hash", kKernel},
    {"check_feature_gate_key", kKernel},
    {"is_uvm_tensor", kKernel},
    // sparse: new ops
    {"block_bucketize_sparse_features_inference", kKernel},
    {"permute_sparse_features", kKernel},
    {"permute_2D_sparse_data_input1D", kKernel},
    {"permute_2D_sparse_preallocated_out", kKernel},
    {"expand_into_jagged_permute", kKernel},
    // keyed: pooled embeddings of several features side by side (recops/operators/keyed.py)
    {"merge_pooled_embeddings", kKernel},
    {"permute_multi_embedding_function", kKernel},
    {"permute_multi_embedding", kKernel},
    {"kt_regroup_arguments", kKernel},
    {"regroup_keyed_tensor", kKernel},
    // jagged: index selection, segment sums, batched cumsum
    {"asynchronous_batched_complete_cumsum", kKernel},
    {"segment_sum_csr", kKernel},
    {"jagged_index_select", kComposite},
    {"jagged_index_select_2d_forward", kKernel},
    {"jagged_index_select_2d_forward_v2", kKernel},
    {"jagged_index_add_2d_forward", kKernel},
    {"jagged_index_add_2d_forward_v2", kKernel},
    {"keyed_jagged_index_select_dim1", kKernel},
    {"jagged_unique_indices", kKernel},
    // index select: row gathers of several tables (torchrec's EBC with inverse indices, sharded
    // EBC)
    {"group_index_select_dim0", kKernel},
    {"group_index_select_dim0_gpu_impl", kKernel},
    {"group_index_select_dim0_gpu_backward", kKernel},
    {"batch_index_select_dim0", kKernel},
    {"batch_index_select_dim0_tensor", kKernel},
    {"batch_index_select_dim0_backward_cpu_impl", kKernel},
    // quantize: row-wise quantized embedding tables and pruned-index remapping (inference)
    {"FloatToFused8BitRowwiseQuantized", kKernel},
    {"HalfToFused8BitRowwiseQuantized", kKernel},
    {"FloatOrHalfToFused8BitRowwiseQuantized", kKernel},
    {"Fused8BitRowwiseQuantizedToFloat", kKernel},
    {"Fused8BitRowwiseQuantizedToHalf", kKernel},
    {"Fused8BitRowwiseQuantizedToFloatOrHalf", kKernel},
    {"FloatToFusedNBitRowwiseQuantizedSBHalf", kKernel},
    {"HalfToFusedNBitRowwiseQuantizedSBHalf", kKernel},
    {"FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf", kKernel},
    {"FusedNBitRowwiseQuantizedSBHalfToFloat", kKernel},
    {"FusedNBitRowwiseQuantizedSBHalfToHalf", kKernel},
    {"FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf", kKernel},
    {"pruned_hashmap_lookup", kKernel},
    {"pruned_hashmap_insert", kKernel},
    {"pruned_array_lookup", kKernel},
    // embedding: the TBE modules' index and offset check, the quantized inference TBE lookup
    // (IntNBitTableBatchedEmbeddingBagsCodegen)
    {"bounds_check_indices", kKernel},
    {"int_nbit_split_embedding_codegen_lookup_function", kKernel},
};

// Whether `name` is one of kFbgemmOps' composites.
inline bool is_fbgemm_composite(std::string_view name) {
  for (const FbgemmOp& op : kFbgemmOps) {
    if (name == op.name) return op.kind == kComposite;
  }
  return false;
}

}  // namespace recops::binding
