#include "encoders/video_encoder.hpp"

#include <ATen/ATen.h>

#include <cstring>

#include "encoders/embedding_output.hpp"
#include "encoders/torch_encoder.hpp"
#include "encoders/encoder_model.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// Note [Video model contract]
// Frames reach the model as float [0,1] pixels normalised per channel by (x - mean) / std, in the
// configured dtype, on the configured device.
//   layout frames: input [N, 3, H, W], all frames of the batch's samples in order; the model
//     returns [N, D], one vector per frame; pooling mean averages each sample's frames, none
//     keeps them with their timestamps.
//   layout clips: input [B, T, 3, H, W]; the model returns [B, D] (pooling: model) or
//     [B, T, D] (pooling mean or none).
// Frames are uploaded as uint8 and converted on the device: a quarter of the bytes cross PCIe.

// The keys that shape the model's input, for its messages.
ModelUse video_use(const VideoSection& v) {
  std::string keys = detail::concat("video.size [", v.height, ", ", v.width, "], video.layout ",
                                    video_layout_name(v.layout));
  if (v.layout == VideoLayout::kClips) {
    keys += detail::concat(", video.sampling.num_frames ", v.num_frames);
  }
  keys += detail::concat(", video.dtype ", compute_dtype_name(v.dtype));
  return {Modality::kVideo, keys};
}

class VideoEncoder final : public TorchEncoder {
 public:
  VideoEncoder(const VideoSection& section, const std::string& device, const ModelHash& hash)
      : TorchEncoder(Modality::kVideo, section, device, hash.get()),
        model_(load_encoder_model(section.encoder, device_, section.dtype, video_use(section))),
        section_(section) {
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device_);
    mean_ = at::tensor(at::ArrayRef<float>(section.mean.data(), 3), at::kFloat)
                .to(options.device())
                .view({1, 3, 1, 1});
    std_ = at::tensor(at::ArrayRef<float>(section.std.data(), 3), at::kFloat)
               .to(options.device())
               .view({1, 3, 1, 1});
    PreparedSample dummy;
    dummy.video.emplace();
    auto& frames = *dummy.video;
    frames.num_frames = section.num_frames > 0 ? section.num_frames : 1;
    frames.height = section.height;
    frames.width = section.width;
    frames.rgb.assign(static_cast<size_t>(frames.num_frames) * frames.height * frames.width * 3,
                      0);
    frames.timestamps.assign(static_cast<size_t>(frames.num_frames), 0.0);
    warm_up(std::move(dummy));
  }

 protected:
  std::vector<SampleEmbedding> run(const std::vector<PreparedSamplePtr>& batch) override {
    const int64_t h = section_.height;
    const int64_t w = section_.width;
    const int64_t frame_bytes = h * w * 3;
    std::vector<int64_t> counts;
    counts.reserve(batch.size());
    int64_t total = 0;
    for (const auto& sample : batch) {
      const auto& v = *sample->video;
      PC_ASSERT(v.height == h && v.width == w && v.num_frames >= 1, "frames of sample ",
                sample->id, " are ", v.height, "x", v.width, ", expected ", h, "x", w);
      counts.push_back(v.num_frames);
      total += v.num_frames;
    }
    auto host = host_buffer({total, h, w, 3}, at::kByte);
    auto* dst = host.data_ptr<uint8_t>();
    for (const auto& sample : batch) {
      const auto& rgb = sample->video->rgb;
      std::memcpy(dst, rgb.data(), rgb.size());
      dst += sample->video->num_frames * frame_bytes;
    }
    auto x = host.to(device_, /*non_blocking=*/true)
                 .permute({0, 3, 1, 2})
                 .to(at::kFloat)
                 .div_(255.0)
                 .sub_(mean_)
                 .div_(std_)
                 .to(model_->dtype())
                 .contiguous();

    std::vector<SampleEmbedding> out;
    if (section_.layout == VideoLayout::kFrames) {
      const auto y = model_->forward({x});
      PC_CHECK(y.dim() == 2 && y.size(0) == total, ModelError, "video model ",
               info_.model_file, " returned shape ", y.sizes(), " for input [", total, ", 3, ",
               h, ", ", w, "]; with layout: frames it must return [N, D], one vector per frame");
      out = embeddings_from_rows(y, counts, section_.pooling_mode(),
                                 section_.normalized());
    } else {
      const auto b = static_cast<int64_t>(batch.size());
      const int64_t t = counts.front();
      for (auto c : counts) {
        PC_ASSERT(c == t, "layout clips needs equal frame counts in a batch");
      }
      const auto y = model_->forward({x.view({b, t, 3, h, w})});
      if (section_.pooling_mode() == Pooling::kModel) {
        PC_CHECK(y.dim() == 2 && y.size(0) == b, ModelError, "video model ", info_.model_file,
                 " returned shape ", y.sizes(), " for [", b, ", ", t,
                 ", 3, H, W]; with pooling: model it must return [B, D]");
        out = embeddings_from_rows(y, std::vector<int64_t>(batch.size(), 1), Pooling::kModel,
                                   section_.normalized());
        for (auto& e : out) e.steps = static_cast<int32_t>(t);
      } else {
        PC_CHECK(y.dim() == 3 && y.size(0) == b && y.size(1) == t, ModelError, "video model ",
                 info_.model_file, " returned shape ", y.sizes(), " for [", b, ", ", t,
                 ", 3, H, W]; with pooling mean or none it must return [B, T, D] (or use "
                 "pooling: model for [B, D])");
        out = embeddings_from_rows(y.reshape({b * t, y.size(2)}), counts,
                                   section_.pooling_mode(), section_.normalized());
      }
    }
    if (section_.pooling_mode() == Pooling::kNone) {
      for (size_t i = 0; i < out.size(); ++i) out[i].timestamps = batch[i]->video->timestamps;
    }
    return out;
  }

 protected:
  std::vector<at::Tensor> weights() const override { return model_->weights(); }
  at::ScalarType compute_dtype() const override { return model_->dtype(); }

 private:
  std::unique_ptr<EncoderModel> model_;
  VideoSection section_;
  at::Tensor mean_;
  at::Tensor std_;
};

}  // namespace

std::unique_ptr<Encoder> make_video_encoder(const VideoSection& section, const std::string& device,
                                           ModelHash hash) {
  return std::make_unique<VideoEncoder>(section, device, hash);
}

}  // namespace precompute
