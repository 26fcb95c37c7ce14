#pragma once
// The model behind a video or audio encoder, whatever its file format: a TorchScript module or
// an AOTInductor package, loaded once onto one device in one dtype. Internal to encoders/: it
// includes LibTorch. Not thread-safe: one thread calls forward() at a time (its Encoder's).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <filesystem>
#include <memory>
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

class EncoderModel {
 public:
  virtual ~EncoderModel() = default;

  // Runs the model on `inputs` (already on device) and returns its one tensor output. Throws
  // ModelError naming the file, the inputs given and the keys that shape them, with the model's
  // own message in one line (Note [A model's failure in one line]), and ModelError for an output
  // that is not one tensor (Note [One tensor out]). An out-of-memory error passes through as
  // c10::OutOfMemoryError, for the encode stage to split the batch.
  virtual at::Tensor forward(std::vector<at::Tensor> inputs) = 0;

  // Inputs the model takes: lets encoders pass optional extras (lengths) only to models that
  // take them.
  virtual size_t num_inputs() const = 0;
  virtual const c10::Device& device() const = 0;
  // The dtype of the floating-point input the model takes (and computes in).
  virtual at::ScalarType dtype() const = 0;
  virtual const std::filesystem::path& file() const = 0;
  // The model's parameters and buffers (an AOTInductor package: its constants).
  virtual std::vector<at::Tensor> weights() const = 0;
};

// Loads `spec` (type torchscript or pt2) onto `device`, computing in `dtype`. Throws ModelError
// naming the file and the fix when it cannot.
std::unique_ptr<EncoderModel> load_encoder_model(const EncoderSpec& spec,
                                                 const c10::Device& device, ComputeDtype dtype,
                                                 ModelUse use);

at::ScalarType to_scalar_type(ComputeDtype dtype);

// The ModelError of a model that failed on `given` (described inputs) with LibTorch's `what`:
// its one-line message, what it was given and the keys that shaped it. An out-of-memory `what`
// is rethrown as c10::OutOfMemoryError instead.
[[noreturn]] void throw_model_failure(const std::filesystem::path& file, const ModelUse& use,
                                      const c10::Device& device, const std::string& given,
                                      const std::string& what);

}  // namespace precompute
