#pragma once
// The video encoder: sampled RGB frames -> normalised float frames on the device -> TorchScript
// model -> pooled or per-frame vectors (Note [Video model contract] in video_encoder.cpp).

#include <memory>
#include <string>

#include "encoders/encoder.hpp"

namespace precompute {

std::unique_ptr<Encoder> make_video_encoder(const VideoSection& section, const std::string& device,
                                           ModelHash hash);

}  // namespace precompute
