#include "encoders/text_encoder.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "encoders/bert/text_settings.hpp"
#include "encoders/embedding_output.hpp"
#include "encoders/torch_encoder.hpp"
#include "encoders/torchscript_model.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// Note [Text model contract]
// The model takes input_ids and attention_mask, both int64 [B, L], padded with the vocab's [PAD]
// id to the longest caption of the batch (a third forward() argument, token_type_ids, receives
// zeros). It returns token vectors [B, L, D], pooled here by `pooling` (mean over real tokens,
// cls, max, or none to keep every token), or one vector per caption [B, D] with pooling: model.

// The keys that shape the model's input, for its messages.
ModelUse text_use(const TextSection& t) {
  return {Modality::kText,
          detail::concat("text.tokenizer.max_length ", t.max_length.value_or(0),
                         " (L at most), text.tokenizer.vocab (the ids)")};
}

class TextEncoder final : public TorchEncoder {
 public:
  TextEncoder(const TextSection& section, const std::string& device, const ModelHash& hash)
      : TorchEncoder(Modality::kText, section, device, hash.get()),
        model_(section.encoder.path, device_, section.dtype, text_use(section)),
        section_(section) {
    PC_CHECK(model_.num_inputs() == 2 || model_.num_inputs() == 3, ModelError, "text model ",
             info_.model_file, " takes ", model_.num_inputs(),
             " inputs; it must take (input_ids, attention_mask[, token_type_ids])");
    const auto tokenizer = make_text_tokenizer(section);
    pad_id_ = tokenizer->pad_id();
    PreparedSample dummy;
    dummy.text.emplace();
    dummy.text->ids = tokenizer->encode("").ids;  // [CLS] [SEP]
    warm_up(std::move(dummy));
  }

 protected:
  std::vector<SampleEmbedding> run(const std::vector<PreparedSamplePtr>& batch) override {
    const auto b = static_cast<int64_t>(batch.size());
    int64_t length = 0;
    for (const auto& s : batch) {
      length = std::max<int64_t>(length, static_cast<int64_t>(s->text->ids.size()));
    }
    auto ids = host_buffer({b, length}, at::kLong);
    auto mask = host_buffer({b, length}, at::kLong);
    ids.fill_(pad_id_);
    mask.zero_();
    for (int64_t i = 0; i < b; ++i) {
      const auto& tokens = batch[static_cast<size_t>(i)]->text->ids;
      auto* row = ids.data_ptr<int64_t>() + i * length;
      auto* mrow = mask.data_ptr<int64_t>() + i * length;
      for (size_t k = 0; k < tokens.size(); ++k) {
        row[k] = tokens[k];
        mrow[k] = 1;
      }
    }
    const auto device = device_;
    std::vector<at::Tensor> inputs;
    const auto ids_dev = ids.to(device, /*non_blocking=*/true);
    const auto mask_dev = mask.to(device, /*non_blocking=*/true);
    inputs.emplace_back(ids_dev);
    inputs.emplace_back(mask_dev);
    if (model_.num_inputs() == 3) inputs.emplace_back(at::zeros_like(ids_dev));
    const auto y = model_.forward(std::move(inputs));

    std::vector<SampleEmbedding> out;
    if (section_.pooling_mode() == Pooling::kModel) {
      PC_CHECK(y.dim() == 2 && y.size(0) == b, ModelError, "text model ", info_.model_file,
               " returned shape ", y.sizes(), " for [", b, ", ", length,
               "] ids; with pooling: model it must return [B, D]");
      out = embeddings_from_rows(y, std::vector<int64_t>(batch.size(), 1), Pooling::kModel,
                                 section_.normalized());
    } else {
      PC_CHECK(y.dim() == 3 && y.size(0) == b && y.size(1) == length, ModelError, "text model ",
               info_.model_file, " returned shape ", y.sizes(), " for [", b, ", ", length,
               "] ids; with pooling ", pooling_name(section_.pooling_mode()),
               " it must return token vectors [B, L, D] (or use pooling: model for [B, D])");
      out = embeddings_from_tokens(y, mask_dev, section_.pooling_mode(), section_.normalized());
    }
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].steps = static_cast<int32_t>(batch[i]->text->ids.size());
      out[i].truncated = batch[i]->text->truncated;
    }
    return out;
  }

 protected:
  std::vector<at::Tensor> weights() const override { return model_.weights(); }
  at::ScalarType compute_dtype() const override { return model_.dtype(); }

 private:
  TorchScriptModel model_;
  TextSection section_;
  int64_t pad_id_ = 0;
};

}  // namespace

std::unique_ptr<Encoder> make_text_encoder(const TextSection& section, const std::string& device,
                                           ModelHash hash) {
  return std::make_unique<TextEncoder>(section, device, hash);
}

}  // namespace precompute
