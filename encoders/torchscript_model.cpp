#include "encoders/torchscript_model.hpp"

#include <torch/csrc/jit/api/function_impl.h>

#include "pipeline/core/error.hpp"

namespace precompute {

at::ScalarType to_scalar_type(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32:
      return at::kFloat;
    case ComputeDtype::kFloat16:
      return at::kHalf;
    case ComputeDtype::kBFloat16:
      return at::kBFloat16;
  }
  PC_ASSERT(false, "unknown dtype");
}

TorchScriptModel::TorchScriptModel(const std::filesystem::path& file, const c10::Device& device,
                                   ComputeDtype dtype)
    : file_(file), device_(device), dtype_(to_scalar_type(dtype)) {
  try {
    module_ = torch::jit::load(file.string(), device);
  } catch (const c10::Error& e) {
    PC_THROW(ModelError, "cannot load TorchScript model ", file, " onto ", device.str(), ": ",
             e.what_without_backtrace(),
             " (the file must be written by torch.jit.save of a scripted or traced module)");
  }
  try {
    module_.eval();
    if (dtype_ != at::kFloat) module_.to(dtype_);
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

at::Tensor TorchScriptModel::forward(std::vector<c10::IValue> inputs) {
  c10::IValue output;
  try {
    output = module_.forward(std::move(inputs));
  } catch (const c10::OutOfMemoryError&) {
    throw;  // TorchEncoder::encode releases cached memory; the encode stage splits the batch
  } catch (const c10::Error& e) {
    // The TorchScript interpreter may rethrow an allocator failure as a plain c10::Error.
    const std::string what = e.what_without_backtrace();
    TORCH_CHECK_WITH(OutOfMemoryError, what.find("out of memory") == std::string::npos, what);
    PC_THROW(ModelError, "model ", file_.filename(), " failed on ", device_.str(), ": ",
             e.what_without_backtrace());
  } catch (const std::exception& e) {
    // A `raise` inside TorchScript arrives as torch::jit::JITException, a std::runtime_error;
    // so does an allocator failure deep inside a traced module (seen on an H200: ResNet-50
    // under a 650 MiB budget), which must reach the out-of-memory recovery, not be a model error.
    const std::string what = e.what();
    TORCH_CHECK_WITH(OutOfMemoryError, what.find("out of memory") == std::string::npos, what);
    PC_THROW(ModelError, "model ", file_.filename(), " failed on ", device_.str(), ": ", what);
  }
  if (output.isTensor()) return output.toTensor();
  if (output.isTuple() && !output.toTupleRef().elements().empty() &&
      output.toTupleRef().elements()[0].isTensor()) {
    return output.toTupleRef().elements()[0].toTensor();
  }
  if (output.isList() && output.toListRef().size() > 0 && output.toListRef()[0].isTensor()) {
    return output.toListRef()[0].toTensor();
  }
  PC_THROW(ModelError, "model ", file_.filename(), " returned ", output.tagKind(),
           "; precompute needs a tensor (or a tuple/list whose first element is one)");
}

std::vector<at::Tensor> TorchScriptModel::weights() const {
  std::vector<at::Tensor> all;
  for (const auto& p : module_.parameters()) all.push_back(p);
  for (const auto& b : module_.buffers()) all.push_back(b);
  return all;
}

}  // namespace precompute
