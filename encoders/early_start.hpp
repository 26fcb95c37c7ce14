#pragma once
// The work a run starts beside the reading of its input: the CUDA driver with a context on each
// device, and the models' identities (Note [Started beside the input's read] in
// encoders/early_start.cpp). Free of LibTorch, like encoders/encoder.hpp.

#include <array>
#include <atomic>
#include <string>
#include <thread>

#include "encoders/encoder.hpp"
#include "pipeline/core/config.hpp"

namespace precompute {

// Starts, on threads of their own, CUDA on each device that `config` runs an encoder on, and
// model_sha256() of each enabled modality. Best effort for CUDA: whatever fails there is left
// for load_encoder to report, where and as it always did. The destructor stops the hashing that
// nobody took and waits for the threads.
class EarlyStart {
 public:
  explicit EarlyStart(const Config& config);
  ~EarlyStart();
  EarlyStart(const EarlyStart&) = delete;
  EarlyStart& operator=(const EarlyStart&) = delete;

  // Waits for CUDA's start and returns describe_devices()'s line, which it computed.
  const std::string& devices();
  // `modality`'s model identity, for load_encoder; invalid for a modality the config leaves off.
  const ModelHash& model_hash(Modality modality) const {
    return hashes_[modality_index(modality)];
  }

 private:
  std::atomic<bool> cancelled_{false};
  std::array<ModelHash, kNumModalities> hashes_;
  std::string description_;
  std::thread cuda_;
};

}  // namespace precompute
