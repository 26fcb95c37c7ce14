#pragma once
// A TorchScript module as an EncoderModel (encoders/encoder_model.hpp), run under inference
// mode.

#include <torch/script.h>

#include "encoders/encoder_model.hpp"

namespace precompute {

class TorchScriptModel final : public EncoderModel {
 public:
  // Throws ModelError naming the file when it is not a TorchScript archive or cannot be moved to
  // the device or dtype.
  TorchScriptModel(const std::filesystem::path& file, const c10::Device& device,
                   ComputeDtype dtype, ModelUse use);

  at::Tensor forward(std::vector<at::Tensor> inputs) override;
  // Arguments of forward(), self excluded.
  size_t num_inputs() const override { return num_inputs_; }
  const c10::Device& device() const override { return device_; }
  at::ScalarType dtype() const override { return dtype_; }
  const std::filesystem::path& file() const override { return file_; }
  std::vector<at::Tensor> weights() const override;

 private:
  std::filesystem::path file_;
  c10::Device device_;
  at::ScalarType dtype_;
  ModelUse use_;
  torch::jit::Module module_;
  size_t num_inputs_ = 0;
};

}  // namespace precompute
