#pragma once
// The native text encoder (encoder type bert): a Hugging Face BERT folder loaded by BertModel,
// fed packed token batches, pooled by the folder's or the config's pooling
// (Note [Native text encoder] in bert_text_encoder.cpp).

#include <memory>
#include <string>

#include "encoders/encoder.hpp"

namespace precompute {

std::unique_ptr<Encoder> make_bert_text_encoder(const TextSection& section,
                                                const std::string& device, ModelHash hash);

}  // namespace precompute
