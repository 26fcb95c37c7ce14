#pragma once
// A TorchScript module loaded once onto one device in one dtype, run under inference mode.
// Internal to encoders/: it includes LibTorch. Not thread-safe: one thread calls forward() at a
// time (its Encoder's).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/script.h>

#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"

namespace precompute {

class TorchScriptModel {
 public:
  // Throws ModelError naming the file when it is not a TorchScript archive or cannot be moved to
  // the device or dtype.
  TorchScriptModel(const std::filesystem::path& file, const c10::Device& device,
                   ComputeDtype dtype);

  // Runs forward() on `inputs` (already on device) and returns its tensor output; for a tuple or
  // list output, its first element. Throws ModelError naming the model for any other output.
  at::Tensor forward(std::vector<c10::IValue> inputs);

  // Arguments of forward(), self excluded: lets encoders pass optional extras (lengths,
  // token_type_ids) only to models that take them.
  size_t num_inputs() const { return num_inputs_; }
  const c10::Device& device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  const std::filesystem::path& file() const { return file_; }
  // The module's parameters and buffers.
  std::vector<at::Tensor> weights() const;

 private:
  std::filesystem::path file_;
  c10::Device device_;
  at::ScalarType dtype_;
  torch::jit::Module module_;
  size_t num_inputs_ = 0;
};

at::ScalarType to_scalar_type(ComputeDtype dtype);

}  // namespace precompute
