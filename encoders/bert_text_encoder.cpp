#include "encoders/bert_text_encoder.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>

#include "encoders/bert/bert_model.hpp"
#include "encoders/bert/model_folder.hpp"
#include "encoders/bert/text_settings.hpp"
#include "encoders/embedding_output.hpp"
#include "encoders/torch_encoder.hpp"
#include "encoders/encoder_model.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {
namespace {

// Note [Native text encoder]
// A batch's captions are packed end to end (Note [Packed batches]), the model returns one
// vector per token [T, H], and pooling runs on those rows per caption: mean, cls or max, or none
// to store every token. The batcher caps a batch by captions (batch_size) and by real tokens
// (max_batch_tokens), which is the model's cost when nothing is padded.

// Note [Text encode timeline]
// With --log-level debug every call logs its phases: packing the tokens on the host, queueing the
// kernels, the wait until the device has run them (a synchronisation added only at debug level),
// and pooling with the copy out; the encode stage logs how long the batch waited for an
// encoder. With the summary's busy seconds ("text batches queued" among them) they tell whether
// the device waits for batches or batches wait for the device.

class BertTextEncoder final : public TorchEncoder {
 public:
  // `hash`: the folder's identity, on its way on another thread (440 MB for BERT-base): it
  // overlaps the loading, and is waited for last.
  BertTextEncoder(const TextSection& section, const std::string& device, ModelHash hash)
      : BertTextEncoder(section, device, read_model_folder(section.encoder.path),
                        std::move(hash)) {}

 protected:
  std::vector<SampleEmbedding> run(const std::vector<PreparedSamplePtr>& batch) override {
    std::vector<const std::vector<int32_t>*> sequences;
    sequences.reserve(batch.size());
    for (const auto& sample : batch) sequences.push_back(&sample->text->ids);
    // At debug level, where a call's time goes (Note [Text encode timeline]).
    const bool timed = log_enabled(LogLevel::kDebug);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const auto packed = pack_sequences(sequences, device_, model_.roberta_padding_id());
    const auto t1 = Clock::now();
    const auto hidden = model_.forward(packed);
    const auto t2 = Clock::now();
    if (timed) wait_for_device();
    const auto t3 = Clock::now();
    auto out = embeddings_from_rows(hidden, packed.lengths, section_.pooling_mode(),
                                    section_.normalized());
    for (size_t i = 0; i < out.size(); ++i) out[i].truncated = batch[i]->text->truncated;
    if (timed) {
      const auto ms = [](Clock::duration d) {
        return std::chrono::duration<double, std::milli>(d).count();
      };
      char line[256];
      std::snprintf(line, sizeof line,
                    "text encode on %s: %zu captions, %lld tokens: packed %.1f ms, kernels "
                    "queued %.1f ms, then done on the device %.1f ms later, pooled and copied "
                    "out %.1f ms",
                    info_.device.c_str(), batch.size(), static_cast<long long>(packed.total),
                    ms(t1 - t0), ms(t2 - t1), ms(t3 - t2), ms(Clock::now() - t3));
      log_message(LogLevel::kDebug, line);
    }
    return out;
  }

 protected:
  std::vector<at::Tensor> weights() const override { return model_.weights(); }
  at::ScalarType compute_dtype() const override { return dtype_; }

 private:
  BertTextEncoder(const TextSection& section, const std::string& device,
                  const ModelFolder& folder, ModelHash folder_hash)
      : TorchEncoder(Modality::kText, section, device, /*model_sha256=*/""),
        model_(folder, device_, to_scalar_type(section.dtype), section.output_layer),
        dtype_(to_scalar_type(section.dtype)),
        section_(section) {
    const auto tokenizer = make_text_tokenizer(section);
    PC_CHECK(static_cast<int64_t>(tokenizer->vocab_size()) <= model_.vocab_size(), ModelError,
             "the tokenizer's vocabulary has ", tokenizer->vocab_size(), " tokens but ",
             section.encoder.path, " embeds only ", model_.vocab_size(),
             "; use the model folder's own vocabulary");
    PC_CHECK(section.max_length.value_or(0) <= model_.max_sequence_length(), ConfigError,
             "text.tokenizer.max_length ", section.max_length.value_or(0), " exceeds the ",
             model_.max_sequence_length(), " tokens the positions of ", section.encoder.path,
             " allow");
    // Each step's end at debug level: with the log's timestamps, where the loading goes.
    log_message(LogLevel::kDebug, "start-up: the text model's weights read and on " + info_.device);
    PreparedSample dummy;
    dummy.text.emplace();
    dummy.text->ids = tokenizer->encode("").ids;  // [CLS] [SEP], or <s> </s>
    warm_up(std::move(dummy));
    log_message(LogLevel::kDebug, "start-up: the text model warmed up");
    info_.model_sha256 = folder_hash.get();
    log_message(LogLevel::kDebug, "start-up: the text model's folder hashed");
  }

  BertModel model_;
  at::ScalarType dtype_;
  TextSection section_;
};

}  // namespace

std::unique_ptr<Encoder> make_bert_text_encoder(const TextSection& section,
                                                const std::string& device, ModelHash hash) {
  return std::make_unique<BertTextEncoder>(section, device, std::move(hash));
}

}  // namespace precompute
