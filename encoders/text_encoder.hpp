#pragma once
// The text encoder: token ids from the WordPiece tokenizer -> TorchScript model ->
// pooled or per-token vectors (Note [Text model contract] in text_encoder.cpp).

#include <memory>
#include <string>

#include "encoders/encoder.hpp"

namespace precompute {

std::unique_ptr<Encoder> make_text_encoder(const TextSection& section, const std::string& device,
                                           ModelHash hash);

}  // namespace precompute
