#include "encoders/encoder_model.hpp"

#include <c10/util/Exception.h>

#include "encoders/model_failure_message.hpp"
#include "encoders/pt2_model.hpp"
#include "encoders/torchscript_model.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

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

std::unique_ptr<EncoderModel> load_encoder_model(const EncoderSpec& spec,
                                                 const c10::Device& device, ComputeDtype dtype,
                                                 ModelUse use) {
  if (spec.type == EncoderType::kPt2) {
    return std::make_unique<Pt2Model>(spec.path, device, dtype, std::move(use));
  }
  PC_ASSERT(spec.type == EncoderType::kTorchScript, "no loader for encoder type ",
            encoder_type_name(spec.type));
  return std::make_unique<TorchScriptModel>(spec.path, device, dtype, std::move(use));
}

void throw_model_failure(const std::filesystem::path& file, const ModelUse& use,
                         const c10::Device& device, const std::string& given,
                         const std::string& what) {
  // A runtime may report an allocator failure as a plain error: the encode stage's
  // out-of-memory recovery must see it as one, not as a broken model.
  TORCH_CHECK_WITH(OutOfMemoryError, what.find("out of memory") == std::string::npos, what);
  if (log_enabled(LogLevel::kDebug)) {
    log_message(LogLevel::kDebug,
                detail::concat(modality_name(use.modality), " model ", file, " failed on input ",
                               given, "; its traceback:\n", what));
  }
  const std::string line = model_message_line(what);
  PC_THROW(ModelError, modality_name(use.modality), " model ", file, " failed on ",
           device.str(), ": ", line, ". It was given ", given, ", shaped by ", use.input_keys,
           ": make the model take this input, or change those keys (its traceback: --log-level "
           "debug).",
           dtype_mismatch_hint(line, modality_name(use.modality)));
}

}  // namespace precompute
