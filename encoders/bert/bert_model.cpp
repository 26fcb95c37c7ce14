#include "encoders/bert/bert_model.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "encoders/bert/safetensors_file.hpp"
#include "encoders/bert/short_attention_kernel.hpp"
#include "pipeline/core/error.hpp"

#if PRECOMPUTE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace precompute {

// Note [Packed batches]
// Captions differ in length (the benchmark's short captions: 3 to 40 tokens). A padded batch
// spends matmul and attention time on padding in proportion to max/mean length. Packing puts
// the B sequences' T tokens end to end: embeddings, the QKV/output projections, the FFN and the
// LayerNorms then run on [T, H] with no padding at all, and attention runs per sequence through
// the variable-length flash-attention kernel, driven by cu_seqlens, or, for batches of short
// sequences, through precompute's own kernel (Note [Attention for short sequences]). Where
// neither applies (CPU, fp32), attention alone scatters into a padded [B, L] layout and back.

// Note [RoBERTa's positions]
// transformers' XLM-RoBERTa numbers the tokens that are not <pad> from pad_token_id + 1 on, and
// gives a <pad> the position pad_token_id without counting it: [<s>, a, <pad>, b, </s>] with
// pad_token_id 1 has positions [2, 3, 1, 4, 5]. A <pad> in a sequence is rare (the text holds
// "<pad>" literally) but it must not shift the rest.
PackedBatch pack_sequences(const std::vector<const std::vector<int32_t>*>& sequences,
                           const c10::Device& device, int64_t roberta_padding_id) {
  PackedBatch b;
  const auto count = static_cast<int64_t>(sequences.size());
  for (const auto* s : sequences) {
    b.lengths.push_back(static_cast<int64_t>(s->size()));
    b.total += static_cast<int64_t>(s->size());
    b.max_length = std::max<int64_t>(b.max_length, static_cast<int64_t>(s->size()));
    b.squared_lengths += static_cast<int64_t>(s->size()) * static_cast<int64_t>(s->size());
  }
  const auto host = [&](at::ScalarType type, int64_t n) {
    return at::empty({n}, at::TensorOptions().dtype(type).pinned_memory(device.is_cuda()));
  };
  auto ids = host(at::kLong, b.total);
  auto positions = host(at::kLong, b.total);
  auto padded_index = host(at::kLong, b.total);
  auto cu = host(at::kInt, count + 1);
  auto mask = at::zeros({count, 1, 1, b.max_length},
                        at::TensorOptions().dtype(at::kBool).pinned_memory(device.is_cuda()));
  auto* id = ids.data_ptr<int64_t>();
  auto* pos = positions.data_ptr<int64_t>();
  auto* pad = padded_index.data_ptr<int64_t>();
  auto* start = cu.data_ptr<int32_t>();
  auto* keep = mask.data_ptr<bool>();
  int64_t t = 0;
  for (int64_t i = 0; i < count; ++i) {
    start[i] = static_cast<int32_t>(t);
    const auto& s = *sequences[static_cast<size_t>(i)];
    int64_t counted = 0;  // tokens that are not <pad>, for RoBERTa's numbering
    for (size_t k = 0; k < s.size(); ++k, ++t) {
      id[t] = s[k];
      if (roberta_padding_id < 0) {
        pos[t] = static_cast<int64_t>(k);
      } else if (s[k] == roberta_padding_id) {
        pos[t] = roberta_padding_id;
      } else {
        pos[t] = roberta_padding_id + ++counted;
      }
      pad[t] = i * b.max_length + static_cast<int64_t>(k);
      keep[i * b.max_length + static_cast<int64_t>(k)] = true;
    }
  }
  start[count] = static_cast<int32_t>(t);
  b.ids = ids.to(device, /*non_blocking=*/true);
  b.positions = positions.to(device, /*non_blocking=*/true);
  b.padded_index = padded_index.to(device, /*non_blocking=*/true);
  b.cu_seqlens = cu.to(device, /*non_blocking=*/true);
  b.key_mask = mask.to(device, /*non_blocking=*/true);
  return b;
}

namespace {

at::ScalarType scalar_type(const SafetensorsTensor& view, const std::string& name) {
  switch (view.dtype) {
    case SafetensorsDtype::kF32:
      return at::kFloat;
    case SafetensorsDtype::kF16:
      return at::kHalf;
    case SafetensorsDtype::kBF16:
      return at::kBFloat16;
    case SafetensorsDtype::kF64:
      return at::kDouble;
    default:
      PC_THROW(ModelError, "weight ", name, " has dtype ", safetensors_dtype_name(view.dtype),
               "; a BERT weight must be a floating-point tensor (F32, F16, BF16 or F64)");
  }
}

// Note [Loading BERT's weights]
// Checkpoints are mostly float32 (save_pretrained's default) and a GPU run computes in bfloat16
// or float16. A blocking `.to(device, dtype)` converts on the CPU, one tensor at a time, before
// it copies, which made loading BERT-base's weights about four times slower than copying the
// file's bytes as they are and converting on the GPU (docs/benchmarks.md, "What bounds it, and
// the start-up timeline"). Both round to nearest even, so the weights are the same bits either
// way.

// Finds the folder's weights under their BertModel names, with or without the "bert." or
// "roberta." prefix that task heads (BertForMaskedLM, XLMRobertaForMaskedLM, ...) add, and checks
// each shape against config.json.
class WeightLoader {
 public:
  WeightLoader(const ModelFolder& folder, const c10::Device& device, at::ScalarType dtype)
      : weights_(folder.dir), folder_(folder.dir), device_(device), dtype_(dtype) {
    for (const char* prefix : {"", "bert.", "roberta."}) {
      if (weights_.find(std::string(prefix) + "embeddings.word_embeddings.weight") != nullptr) {
        prefix_ = prefix;
        return;
      }
    }
    PC_THROW(ModelError, folder_, ": no embeddings.word_embeddings.weight among the weights; "
                                  "is this a BERT checkpoint?");
  }

  // `alternative`: the older TensorFlow-era LayerNorm names (gamma/beta).
  at::Tensor load(const std::string& name, std::vector<int64_t> shape,
                  const std::string& alternative = "") {
    const SafetensorsTensor* view = weights_.find(prefix_ + name);
    if (view == nullptr && !alternative.empty()) view = weights_.find(prefix_ + alternative);
    PC_CHECK(view != nullptr, ModelError, folder_, ": weight ", prefix_, name,
             " is missing from the safetensors files; the folder does not hold a complete BERT");
    PC_CHECK(view->shape == shape, ModelError, folder_, ": weight ", prefix_, name,
             " has shape ", at::IntArrayRef(view->shape), " but config.json implies ",
             at::IntArrayRef(shape), "; config.json and the weights do not belong together");
    const auto type = scalar_type(*view, name);
    // from_blob aliases the read-only mapping; the copy to the target device and dtype is ours.
    const auto source =
        at::from_blob(const_cast<void*>(view->data), shape, at::TensorOptions().dtype(type));
    if (device_.is_cuda() && type != dtype_) {
      // The file's bytes go over as they are and the GPU converts them: a blocking .to() with
      // both a device and a dtype converts on the CPU first (Note [Loading BERT's weights]).
      return source.to(device_, type, /*non_blocking=*/false, /*copy=*/true).to(dtype_);
    }
    return source.to(device_, dtype_, /*non_blocking=*/false, /*copy=*/true);
  }

 private:
  SafetensorsWeights weights_;
  std::filesystem::path folder_;
  c10::Device device_;
  at::ScalarType dtype_;
  std::string prefix_;
};

std::string forced_attention() {
  const char* forced = std::getenv("PRECOMPUTE_BERT_ATTENTION");
  return forced == nullptr ? "" : forced;
}

BertModel::Attention choose_attention(const c10::Device& device, at::ScalarType dtype,
                                      int64_t head_dim) {
  // PRECOMPUTE_BERT_ATTENTION=padded forces the padded path, to measure what packing gains.
  if (forced_attention() == "padded") return BertModel::Attention::kPadded;
  const bool flash_dtype = dtype == at::kHalf || dtype == at::kBFloat16;
  const bool flash_shape = head_dim % 8 == 0 && head_dim <= 256;
  return device.is_cuda() && flash_dtype && flash_shape ? BertModel::Attention::kPacked
                                                        : BertModel::Attention::kPadded;
}

// Whether the model's packed batches may take the short-sequence kernel (each batch is then
// decided by takes_short_attention); PRECOMPUTE_BERT_ATTENTION=flash keeps them all on flash
// attention, to measure what the kernel gains.
bool choose_short_attention(BertModel::Attention attention, int64_t head_dim) {
#if PRECOMPUTE_WITH_CUDA
  return attention == BertModel::Attention::kPacked && forced_attention() != "flash" &&
         short_attention_takes_head_dim(head_dim);
#else
  (void)attention;
  (void)head_dim;
  return false;
#endif
}

}  // namespace

BertModel::BertModel(const ModelFolder& folder, const c10::Device& device, at::ScalarType dtype,
                     int output_layer) {
  const auto& c = folder.config;
  hidden_ = c.hidden_size;
  heads_ = c.num_attention_heads;
  PC_CHECK(heads_ > 0 && hidden_ % heads_ == 0, ModelError, folder.dir,
           ": hidden_size ", hidden_, " is not a multiple of num_attention_heads ", heads_);
  head_dim_ = hidden_ / heads_;
  vocab_size_ = c.vocab_size;
  max_positions_ = c.max_position_embeddings;
  max_sequence_length_ = c.max_sequence_length();
  roberta_padding_id_ = c.roberta_positions() ? c.pad_token_id.value_or(1) : -1;
  eps_ = c.layer_norm_eps;
  activation_ = c.hidden_act;
  attention_ = choose_attention(device, dtype, head_dim_);
  short_attention_ = choose_short_attention(attention_, head_dim_);
  const int layers = c.num_hidden_layers;
  const int used = output_layer < 0 ? layers + 1 + output_layer : output_layer;
  PC_CHECK(used >= 0 && used <= layers, ModelError, "text.output_layer ", output_layer,
           " does not exist: the model has ", layers, " layers (0: embeddings, 1..", layers,
           ", or -1 .. -", layers + 1, " from the end)");

  WeightLoader w(folder, device, dtype);
  const int64_t h = hidden_;
  const int64_t inter = c.intermediate_size;
  word_ = w.load("embeddings.word_embeddings.weight", {vocab_size_, h});
  position_ = w.load("embeddings.position_embeddings.weight", {max_positions_, h});
  // Every input is one segment: only token type 0's row is ever added.
  token_type0_ =
      w.load("embeddings.token_type_embeddings.weight", {c.type_vocab_size, h}).select(0, 0);
  embed_norm_weight_ = w.load("embeddings.LayerNorm.weight", {h}, "embeddings.LayerNorm.gamma");
  embed_norm_bias_ = w.load("embeddings.LayerNorm.bias", {h}, "embeddings.LayerNorm.beta");
  for (int i = 0; i < used; ++i) {
    const std::string p = "encoder.layer." + std::to_string(i) + ".";
    Layer l;
    l.qkv_weight = at::cat({w.load(p + "attention.self.query.weight", {h, h}),
                            w.load(p + "attention.self.key.weight", {h, h}),
                            w.load(p + "attention.self.value.weight", {h, h})});
    l.qkv_bias = at::cat({w.load(p + "attention.self.query.bias", {h}),
                          w.load(p + "attention.self.key.bias", {h}),
                          w.load(p + "attention.self.value.bias", {h})});
    l.out_weight = w.load(p + "attention.output.dense.weight", {h, h});
    l.out_bias = w.load(p + "attention.output.dense.bias", {h});
    l.attn_norm_weight = w.load(p + "attention.output.LayerNorm.weight", {h},
                                p + "attention.output.LayerNorm.gamma");
    l.attn_norm_bias = w.load(p + "attention.output.LayerNorm.bias", {h},
                              p + "attention.output.LayerNorm.beta");
    l.ffn_in_weight = w.load(p + "intermediate.dense.weight", {inter, h});
    l.ffn_in_bias = w.load(p + "intermediate.dense.bias", {inter});
    l.ffn_out_weight = w.load(p + "output.dense.weight", {h, inter});
    l.ffn_out_bias = w.load(p + "output.dense.bias", {h});
    l.ffn_norm_weight =
        w.load(p + "output.LayerNorm.weight", {h}, p + "output.LayerNorm.gamma");
    l.ffn_norm_bias = w.load(p + "output.LayerNorm.bias", {h}, p + "output.LayerNorm.beta");
    layers_.push_back(std::move(l));
  }
}

at::Tensor BertModel::activation(const at::Tensor& x) const {
  if (activation_ == "gelu") return at::gelu(x);
  if (activation_ == "relu") return at::relu(x);
  return at::gelu(x, "tanh");  // gelu_new, gelu_pytorch_tanh
}

bool BertModel::takes_short_attention(const PackedBatch& batch) const {
  return short_attention_ &&
         short_attention_takes_batch(batch.max_length, static_cast<int64_t>(batch.lengths.size()),
                                     batch.squared_lengths);
}

at::Tensor BertModel::attend(const at::Tensor& qkv, const PackedBatch& batch) const {
  const int64_t t = batch.total;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
#if PRECOMPUTE_WITH_CUDA
  if (takes_short_attention(batch)) {
    PC_ASSERT(qkv.is_contiguous(), "the fused projection is [T, 3 * hidden], row-major");
    auto out = at::empty({t, hidden_}, qkv.options());
    ShortAttentionParams p;
    p.qkv = qkv.data_ptr();
    p.out = out.data_ptr();
    p.cu_seqlens = batch.cu_seqlens.data_ptr<int32_t>();
    p.sequences = static_cast<int64_t>(batch.lengths.size());
    p.heads = static_cast<int>(heads_);
    p.head_dim = static_cast<int>(head_dim_);
    p.max_length = static_cast<int>(batch.max_length);
    p.scale = static_cast<float>(scale);
    p.bfloat16 = qkv.scalar_type() == at::kBFloat16;
    const int error = launch_short_attention(
        p, c10::cuda::getCurrentCUDAStream(qkv.device().index()).stream());
    PC_CHECK(error == 0, ModelError, "BERT's short-sequence attention kernel failed to start (",
             short_attention_error_name(error), ") on ", p.sequences, " sequences of at most ",
             p.max_length, " tokens; PRECOMPUTE_BERT_ATTENTION=flash runs flash attention instead");
    return out;
  }
#endif
  const auto parts = qkv.view({t, 3, heads_, head_dim_}).unbind(1);  // each [T, heads, d]
  if (attention_ == Attention::kPacked) {
    // The kernel takes q, k and v as strided views of the fused projection (it needs only the
    // last dimension contiguous): copying them out cost 36 passes over [T, H] a batch, 10% of
    // the encoder's time on 1,000,000 captions (docs/benchmarks.md).
    const auto out = std::get<0>(at::_flash_attention_forward(
        parts[0], parts[1], parts[2], batch.cu_seqlens,
        batch.cu_seqlens, batch.max_length, batch.max_length, /*dropout_p=*/0.0,
        /*is_causal=*/false, /*return_debug_mask=*/false, scale));
    return out.reshape({t, hidden_});
  }
  const auto b = static_cast<int64_t>(batch.lengths.size());
  const int64_t l = batch.max_length;
  const auto padded = [&](const at::Tensor& x) {
    return at::zeros({b * l, heads_, head_dim_}, x.options())
        .index_copy_(0, batch.padded_index, x)
        .view({b, l, heads_, head_dim_})
        .transpose(1, 2);  // [B, heads, L, d]
  };
  const auto out = at::scaled_dot_product_attention(padded(parts[0]), padded(parts[1]),
                                                    padded(parts[2]), batch.key_mask,
                                                    /*dropout_p=*/0.0, /*is_causal=*/false,
                                                    scale);
  return out.transpose(1, 2).reshape({b * l, hidden_}).index_select(0, batch.padded_index);
}

at::Tensor BertModel::forward(const PackedBatch& batch) const {
  PC_CHECK(batch.max_length <= max_sequence_length_, ModelError, "a sequence of ",
           batch.max_length, " tokens is longer than the model's ", max_sequence_length_,
           " positions; lower text.tokenizer.max_length");
  at::Tensor x = at::embedding(word_, batch.ids) + at::embedding(position_, batch.positions) +
                 token_type0_;
  x = at::layer_norm(x, {hidden_}, embed_norm_weight_, embed_norm_bias_, eps_);
  for (const auto& l : layers_) {
    const auto context = attend(at::linear(x, l.qkv_weight, l.qkv_bias), batch);
    x = at::layer_norm(x + at::linear(context, l.out_weight, l.out_bias), {hidden_},
                       l.attn_norm_weight, l.attn_norm_bias, eps_);
    const auto inner = activation(at::linear(x, l.ffn_in_weight, l.ffn_in_bias));
    x = at::layer_norm(x + at::linear(inner, l.ffn_out_weight, l.ffn_out_bias), {hidden_},
                       l.ffn_norm_weight, l.ffn_norm_bias, eps_);
  }
  return x;
}

std::vector<at::Tensor> BertModel::weights() const {
  std::vector<at::Tensor> all = {word_, position_, token_type0_, embed_norm_weight_,
                                 embed_norm_bias_};
  for (const auto& l : layers_) {
    for (const auto* t : {&l.qkv_weight, &l.qkv_bias, &l.out_weight, &l.out_bias,
                          &l.attn_norm_weight, &l.attn_norm_bias, &l.ffn_in_weight,
                          &l.ffn_in_bias, &l.ffn_out_weight, &l.ffn_out_bias,
                          &l.ffn_norm_weight, &l.ffn_norm_bias}) {
      all.push_back(*t);
    }
  }
  return all;
}

}  // namespace precompute
