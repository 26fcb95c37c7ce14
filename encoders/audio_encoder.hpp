#pragma once
// The audio encoder: mono windows at the encoder's rate -> TorchScript model -> pooled or
// per-window vectors (Note [Audio model contract] in audio_encoder.cpp).

#include <memory>
#include <string>

#include "encoders/encoder.hpp"

namespace precompute {

std::unique_ptr<Encoder> make_audio_encoder(const AudioSection& section, const std::string& device,
                                           ModelHash hash);

}  // namespace precompute
