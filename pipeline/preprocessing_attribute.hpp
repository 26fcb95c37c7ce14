#pragma once
// The preprocessing each modality's embeddings were made with, stored with them in every shard
// (ModalitySchema::preprocessing_json) so that a reader knows how the inputs were made, and part
// of the output's fingerprint (Note [The stored preprocessing] in preprocessing_attribute.cpp).

#include <string>

#include "pipeline/core/config.hpp"
#include "pipeline/core/modality.hpp"

namespace precompute {

// Canonical JSON (keys by name). Reads the text section's vocab file to hash it.
std::string preprocessing_json(const Config& config, Modality m);

}  // namespace precompute
