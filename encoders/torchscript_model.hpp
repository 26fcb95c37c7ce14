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
#include "pipeline/core/modality.hpp"

namespace precompute {

// What a model is for, for its messages: its modality, and the config keys that shape its
// inputs with their values ("video.size [224, 224], video.layout frames, video.dtype float32").
struct ModelUse {
  Modality modality = Modality::kVideo;
  std::string input_keys;
};

class TorchScriptModel {
 public:
  // Throws ModelError naming the file when it is not a TorchScript archive or cannot be moved to
  // the device or dtype.
  TorchScriptModel(const std::filesystem::path& file, const c10::Device& device,
                   ComputeDtype dtype, ModelUse use);

  // Runs forward() on `inputs` (already on device) and returns its tensor output. Throws
  // ModelError naming the file, the inputs given and the keys that shape them, with the model's
  // own message in one line (Note [A model's failure in one line]; the whole traceback is logged
  // at debug level), and ModelError for an output that is not one tensor (a tuple or a list is
  // refused, not guessed at: Note [One tensor out]).
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
  // Throws the ModelError of a failed forward() on `inputs`; `what` is LibTorch's text.
  [[noreturn]] void throw_failure(const std::vector<c10::IValue>& inputs,
                                  const std::string& what) const;

  std::filesystem::path file_;
  c10::Device device_;
  at::ScalarType dtype_;
  ModelUse use_;
  torch::jit::Module module_;
  size_t num_inputs_ = 0;
};

at::ScalarType to_scalar_type(ComputeDtype dtype);

}  // namespace precompute
