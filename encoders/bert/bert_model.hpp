#pragma once
// BERT (post-LayerNorm encoder with absolute positions) in LibTorch, reading a Hugging Face
// folder's safetensors weights; XLM-RoBERTa is the same network with other position numbers. It runs on packed batches: the tokens of all sequences end to
// end, so no matmul computes on padding (Note [Packed batches] in bert_model.cpp). Internal to
// encoders/ (includes LibTorch). forward() is const but not re-entrant on one CUDA stream: one
// thread at a time per instance (its Encoder's).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "encoders/bert/model_folder.hpp"

namespace precompute {

// Sequences of token ids packed end to end, on the model's device.
struct PackedBatch {
  at::Tensor ids;           // [T] int64
  at::Tensor positions;     // [T] int64: each token's position in its sequence
  at::Tensor cu_seqlens;    // [B + 1] int32: where each sequence starts, then T
  at::Tensor padded_index;  // [T] int64: each token's row in a [B * max_length] padded layout
  at::Tensor key_mask;      // [B, 1, 1, max_length] bool: real tokens of the padded layout
  std::vector<int64_t> lengths;  // tokens per sequence
  int64_t max_length = 0;
  int64_t total = 0;        // T
  int64_t squared_lengths = 0;  // the sum of each sequence's length squared
};

// Packs `sequences` for `device`; host staging memory is pinned when the device is a GPU.
// `roberta_padding_id` >= 0 numbers positions as XLM-RoBERTa does (Note [RoBERTa's positions],
// .cpp); -1 as BERT does (0, 1, 2, ...).
PackedBatch pack_sequences(const std::vector<const std::vector<int32_t>*>& sequences,
                           const c10::Device& device, int64_t roberta_padding_id = -1);

class BertModel {
 public:
  enum class Attention {
    kPacked,  // the packed tokens: variable-length flash attention, or the short-sequence
              // kernel for batches it takes (CUDA, fp16/bf16)
    kPadded,  // scaled_dot_product_attention on a padded copy (CPU, fp32, or when forced)
  };

  // Loads and checks every weight against config.json (names, shapes, floating dtypes), converts
  // them to `dtype` on `device`. `output_layer` follows transformers' hidden_states: 0 is the
  // embeddings, k the output of layer k, -1 the last layer. Throws ModelError naming the weight.
  BertModel(const ModelFolder& folder, const c10::Device& device, at::ScalarType dtype,
            int output_layer);

  // The output layer's hidden states of every token, [T, hidden_size].
  at::Tensor forward(const PackedBatch& batch) const;

  int64_t hidden_size() const { return hidden_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t max_positions() const { return max_positions_; }
  // The longest sequence the positions allow (fewer than max_positions() for XLM-RoBERTa).
  int64_t max_sequence_length() const { return max_sequence_length_; }
  // The argument pack_sequences needs for this model.
  int64_t roberta_padding_id() const { return roberta_padding_id_; }
  Attention attention() const { return attention_; }
  // Whether `batch` runs the short-sequence kernel rather than flash attention (CUDA builds;
  // Note [Attention for short sequences]).
  bool takes_short_attention(const PackedBatch& batch) const;
  // Every weight tensor the model holds.
  std::vector<at::Tensor> weights() const;

 private:
  struct Layer {
    at::Tensor qkv_weight, qkv_bias;  // query, key and value fused: [3H, H], [3H]
    at::Tensor out_weight, out_bias;
    at::Tensor attn_norm_weight, attn_norm_bias;
    at::Tensor ffn_in_weight, ffn_in_bias;
    at::Tensor ffn_out_weight, ffn_out_bias;
    at::Tensor ffn_norm_weight, ffn_norm_bias;
  };

  at::Tensor attend(const at::Tensor& qkv, const PackedBatch& batch) const;
  at::Tensor activation(const at::Tensor& x) const;

  int64_t hidden_ = 0;
  int64_t heads_ = 0;
  int64_t head_dim_ = 0;
  int64_t vocab_size_ = 0;
  int64_t max_positions_ = 0;
  int64_t max_sequence_length_ = 0;
  int64_t roberta_padding_id_ = -1;
  double eps_ = 1e-12;
  std::string activation_;
  Attention attention_ = Attention::kPadded;
  bool short_attention_ = false;  // the kernel may run (CUDA, kPacked, a head size it takes)
  at::Tensor word_, position_, token_type0_, embed_norm_weight_, embed_norm_bias_;
  std::vector<Layer> layers_;  // only up to the output layer
};

}  // namespace precompute
