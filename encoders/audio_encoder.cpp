#include "encoders/audio_encoder.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <map>

#include "encoders/embedding_output.hpp"
#include "encoders/torch_encoder.hpp"
#include "encoders/encoder_model.hpp"
#include "pipeline/core/config_bounds.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// Note [Audio model contract]
// The model takes a float waveform [N, S] (mono, at audio.sample_rate, in the configured dtype)
// and returns [N, D], one vector per window; a model whose forward() takes a second argument
// also receives lengths [N] (int64: samples before the zero padding of each window). Pooling
// mean averages a sample's windows, none keeps them with their start times.
// Windows of different lengths (whole-clip mode) are never padded into one forward pass: the
// batch runs as one pass per length, so a sample's vector does not depend on its batch.

// The keys that shape the model's input, for its messages.
ModelUse audio_use(const AudioSection& a) {
  return {Modality::kAudio,
          detail::concat("audio.sample_rate ", a.sample_rate, ", audio.window_s ",
                         value_text(a.window_s),
                         a.window_s > 0 ? "" : " (the whole clip)",
                         ", audio.dtype ", compute_dtype_name(a.dtype))};
}

class AudioEncoder final : public TorchEncoder {
 public:
  AudioEncoder(const AudioSection& section, const std::string& device, const ModelHash& hash)
      : TorchEncoder(Modality::kAudio, section, device, hash.get()),
        model_(load_encoder_model(section.encoder, device_, section.dtype, audio_use(section))),
        section_(section) {
    PC_CHECK(model_->num_inputs() == 1 || model_->num_inputs() == 2, ModelError, "audio model ",
             info_.model_file, " takes ", model_->num_inputs(),
             " inputs; it must take (waveform) or (waveform, lengths)");
    PreparedSample dummy;
    dummy.audio.emplace();
    auto& a = *dummy.audio;
    a.sample_rate = section.sample_rate;
    a.window_samples = section.window_s > 0
                           ? static_cast<int64_t>(std::llround(section.window_s * a.sample_rate))
                           : a.sample_rate;
    a.num_windows = 1;
    a.samples.assign(static_cast<size_t>(a.window_samples), 0.0f);
    a.timestamps = {0.0};
    a.valid_samples = {a.window_samples};
    warm_up(std::move(dummy));
  }

 protected:
  std::vector<SampleEmbedding> run(const std::vector<PreparedSamplePtr>& batch) override {
    // Group the batch's samples by window length, keeping the batch order inside each group.
    std::map<int64_t, std::vector<size_t>> by_length;
    for (size_t i = 0; i < batch.size(); ++i) {
      by_length[batch[i]->audio->window_samples].push_back(i);
    }
    std::vector<SampleEmbedding> out(batch.size());
    for (const auto& [length, members] : by_length) {
      auto part = run_equal_length(batch, members, length);
      for (size_t k = 0; k < members.size(); ++k) out[members[k]] = std::move(part[k]);
    }
    return out;
  }

 protected:
  std::vector<at::Tensor> weights() const override { return model_->weights(); }
  at::ScalarType compute_dtype() const override { return model_->dtype(); }

 private:
  std::vector<SampleEmbedding> run_equal_length(const std::vector<PreparedSamplePtr>& batch,
                                                const std::vector<size_t>& members,
                                                int64_t window_samples) {
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (auto i : members) {
      counts.push_back(batch[i]->audio->num_windows);
      total += batch[i]->audio->num_windows;
    }
    auto waves = host_buffer({total, window_samples}, at::kFloat);
    auto lengths = host_buffer({total}, at::kLong);
    auto* dst = waves.data_ptr<float>();
    auto* len = lengths.data_ptr<int64_t>();
    for (auto i : members) {
      const auto& a = *batch[i]->audio;
      std::memcpy(dst, a.samples.data(), a.samples.size() * sizeof(float));
      dst += a.samples.size();
      std::memcpy(len, a.valid_samples.data(), a.valid_samples.size() * sizeof(int64_t));
      len += a.valid_samples.size();
    }
    std::vector<at::Tensor> inputs;
    inputs.emplace_back(waves.to(device_, /*non_blocking=*/true).to(model_->dtype()));
    if (model_->num_inputs() == 2) {
      inputs.emplace_back(lengths.to(device_, /*non_blocking=*/true));
    }
    const auto y = model_->forward(std::move(inputs));
    PC_CHECK(y.dim() == 2 && y.size(0) == total, ModelError, "audio model ", info_.model_file,
             " returned shape ", y.sizes(), " for input [", total, ", ", window_samples,
             "]; it must return [N, D], one vector per window");
    auto out = embeddings_from_rows(y, counts, section_.pooling_mode(),
                                    section_.normalized());
    if (section_.pooling_mode() == Pooling::kNone) {
      for (size_t k = 0; k < members.size(); ++k) {
        out[k].timestamps = batch[members[k]]->audio->timestamps;
      }
    }
    return out;
  }

  std::unique_ptr<EncoderModel> model_;
  AudioSection section_;
};

}  // namespace

std::unique_ptr<Encoder> make_audio_encoder(const AudioSection& section, const std::string& device,
                                           ModelHash hash) {
  return std::make_unique<AudioEncoder>(section, device, hash);
}

}  // namespace precompute
