#pragma once
// An AOTInductor package (torch.export, then torch._inductor.aoti_compile_and_package) as an
// EncoderModel: compiled code and weights loaded with LibTorch alone, no Python or compiler at
// run time. Note [A package declares its inputs] in pt2_model.cpp says what it must carry.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "encoders/encoder_model.hpp"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace precompute {

// One input a package takes: its shape (-1 where the export left the dimension dynamic) and
// dtype.
struct Pt2Input {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

class Pt2Model final : public EncoderModel {
 public:
  // Throws ModelError naming the file and the fix when it is not an AOTInductor package, was
  // compiled for another kind of device, declares no inputs, or takes another dtype than
  // `dtype`.
  Pt2Model(const std::filesystem::path& file, const c10::Device& device, ComputeDtype dtype,
           ModelUse use);
  ~Pt2Model() override;

  // Checks every input against the declared ones before the call (a package checks nothing
  // itself): a mismatch is a ModelError naming both shapes and the keys that set them.
  at::Tensor forward(std::vector<at::Tensor> inputs) override;
  size_t num_inputs() const override { return inputs_.size(); }
  const c10::Device& device() const override { return device_; }
  at::ScalarType dtype() const override { return dtype_; }
  const std::filesystem::path& file() const override { return file_; }
  std::vector<at::Tensor> weights() const override;

  const std::vector<Pt2Input>& declared_inputs() const { return inputs_; }

 private:
  std::filesystem::path file_;
  c10::Device device_;
  at::ScalarType dtype_;
  ModelUse use_;
  std::vector<Pt2Input> inputs_;
  std::string build_ = "model";  // the package's build it runs (Note [Builds in one package])
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
};

// The JSON a package declares itself with (Note [A package declares its inputs] in
// pt2_model.cpp): from its metadata, else from the file beside it; nullopt when neither has it.
// Throws what LibTorch throws for a file that is not a package. Of a package with several
// builds, the first build's (they declare the same preprocessing).
std::optional<std::string> pt2_declaration(const std::filesystem::path& file);

// The names of a package's builds (data/aotinductor/NAME/), sorted; "model" for a package of
// one. Throws what LibTorch throws for a file that is not a zip archive.
std::vector<std::string> pt2_builds(const std::filesystem::path& file);

// "[-1, 3, 224, 224] float32", for messages.
std::string describe_pt2_input(const Pt2Input& input);

}  // namespace precompute
