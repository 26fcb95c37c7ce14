#include "encoders/torchscript_model.hpp"

#include <torch/csrc/jit/api/function_impl.h>

#include "encoders/model_failure_message.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {
namespace {

// Note [Casting a TorchScript model to the compute dtype]
// torch::jit::Module::to(dtype) casts every parameter and buffer, integer ones included, where
// Python's nn.Module.to(dtype) casts floating-point tensors only. A traced Hugging Face vision
// tower keeps its position ids as an int64 buffer that indexes its position embedding; cast to
// float16 the lookup fails on every batch ("Expected tensor for argument #1 'indices' to have
// one of the following scalar types: Long, Int"). So only floating-point tensors are cast, as
// the module would have been in Python.
void cast_floating_state(torch::jit::Module& module, at::ScalarType dtype) {
  const auto cast = [dtype](at::Tensor tensor) {
    if (tensor.is_floating_point() && tensor.scalar_type() != dtype) {
      tensor.set_data(tensor.to(dtype));
    }
  };
  for (const at::Tensor& parameter : module.parameters(/*recurse=*/true)) cast(parameter);
  for (const at::Tensor& buffer : module.buffers(/*recurse=*/true)) cast(buffer);
}

}  // namespace

TorchScriptModel::TorchScriptModel(const std::filesystem::path& file, const c10::Device& device,
                                   ComputeDtype dtype, ModelUse use)
    : file_(file), device_(device), dtype_(to_scalar_type(dtype)), use_(std::move(use)) {
  try {
    module_ = torch::jit::load(file.string(), device);
  } catch (const c10::Error& e) {
    PC_THROW(ModelError, "cannot load TorchScript model ", file, " onto ", device.str(), ": ",
             e.what_without_backtrace(),
             " (the file must be written by torch.jit.save of a scripted or traced module)");
  }
  try {
    module_.eval();
    // Floating-point tensors only (Note [Casting a TorchScript model to the compute dtype]).
    if (dtype_ != at::kFloat) cast_floating_state(module_, dtype_);
  } catch (const c10::Error& e) {
    PC_THROW(ModelError, "cannot convert model ", file, " to ", c10::toString(dtype_), ": ",
             e.what_without_backtrace());
  }
  const auto method = module_.find_method("forward");
  PC_CHECK(method.has_value(), ModelError, "model ", file, " has no forward() method");
  const auto& arguments = method->function().getSchema().arguments();
  PC_CHECK(!arguments.empty(), ModelError, "model ", file, " has a forward() without self");
  num_inputs_ = arguments.size() - 1;
}

// Note [One tensor out]
// precompute stores one tensor per call, so a model must return one. For a model returning a
// tuple or a list (a traced Hugging Face model returns (last_hidden_state, pooler_output)),
// taking an element would be a guess: the vectors stored would be whatever came first, and
// nothing would say so. It is refused instead, at the warm-up pass, before any output is
// written, with what it returned and the one-line fix (return the tensor to store).
at::Tensor TorchScriptModel::forward(std::vector<at::Tensor> tensors) {
  // The inputs' shapes for a message, described only when one is needed.
  const std::vector<c10::IValue> given(tensors.begin(), tensors.end());
  std::vector<c10::IValue> inputs(std::make_move_iterator(tensors.begin()),
                                  std::make_move_iterator(tensors.end()));
  c10::IValue output;
  try {
    output = module_.forward(std::move(inputs));
  } catch (const c10::OutOfMemoryError&) {
    throw;  // TorchEncoder::encode releases cached memory; the encode stage splits the batch
  } catch (const c10::Error& e) {
    throw_model_failure(file_, use_, device_, describe_values(given), e.what_without_backtrace());
  } catch (const std::exception& e) {
    // A `raise` inside TorchScript arrives as torch::jit::JITException, a std::runtime_error;
    // so does an allocator failure deep inside a traced module (seen on an H200: ResNet-50
    // under a 650 MiB budget), which must reach the out-of-memory recovery, not be a model error.
    throw_model_failure(file_, use_, device_, describe_values(given), e.what());
  }
  if (output.isTensor()) return output.toTensor();
  std::string returned = output.tagKind();
  if (output.isTuple()) {
    const auto& e = output.toTupleRef().elements();
    returned += " (" + describe_values(std::vector<c10::IValue>(e.begin(), e.end())) + ")";
  } else if (output.isList()) {
    const auto e = output.toListRef();
    returned += " (" + describe_values(std::vector<c10::IValue>(e.begin(), e.end())) + ")";
  }
  PC_THROW(ModelError, modality_name(use_.modality), " model ", file_, " returned a ", returned,
           " for input ", describe_values(given), "; precompute stores one tensor per call: make forward() "
           "return the tensor to store (for example `return out[0]`, or "
           "`outputs.last_hidden_state` for a Hugging Face model), then save the model again "
           "with torch.jit.save");
}

std::vector<at::Tensor> TorchScriptModel::weights() const {
  std::vector<at::Tensor> all;
  for (const auto& p : module_.parameters()) all.push_back(p);
  for (const auto& b : module_.buffers()) all.push_back(b);
  return all;
}

}  // namespace precompute
