#include "encoders/pt2_model.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "encoders/model_failure_message.hpp"
#include "encoders/unpacked_packages.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {
namespace {

// Note [A package declares its inputs]
// An AOTInductor package runs whatever it is given: a 96x96 image into a model exported at
// 112x112, fp16 into an fp32 model, and the output is wrong without a word (its own input checks,
// AOTI_RUNTIME_CHECK_INPUTS=1, report only on stderr and refuse a batch of 1). So precompute runs
// a package only when it says what it takes, and checks every call against that: the JSON
//   {"inputs": [{"shape": [-1, 3, 224, 224], "dtype": "float32"}, ...]}
// (-1: a dimension the export left dynamic), stored in the package itself under the metadata
// key "precompute.encoder" (inductor_configs={"aot_inductor.metadata": {...}} at packaging, so
// it cannot be separated from the code it describes), or, for a package made without it, in a
// file beside it named like it plus ".json".
constexpr const char* kMetadataKey = "precompute.encoder";
constexpr const char* kDeviceKey = "AOTI_DEVICE_KEY";

// A package's declaration (Note [A package declares its inputs]) and where it was found, for
// messages: its metadata, else the file beside it.
struct Declaration {
  std::string text;
  std::string where;
};

std::optional<Declaration> find_declaration(
    const std::unordered_map<std::string, std::string>& metadata,
    const std::filesystem::path& file) {
  if (const auto it = metadata.find(kMetadataKey); it != metadata.end()) {
    return Declaration{it->second,
                       detail::concat(file.string(), " (metadata '", kMetadataKey, "')")};
  }
  const std::string sidecar = file.string() + ".json";
  std::ifstream in(sidecar);
  if (!in.good()) return std::nullopt;
  return Declaration{
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), sidecar};
}

std::string sidecar_hint(const std::filesystem::path& file) {
  return detail::concat("store what it takes in it (aot_inductor.metadata {\"", kMetadataKey,
                        "\": JSON}) or write ", file.string(),
                        ".json: {\"inputs\": [{\"shape\": [-1, 3, 224, "
                        "224], \"dtype\": \"float32\"}]} (-1 for a dynamic dimension)");
}

at::ScalarType parse_dtype(const std::string& name, const std::filesystem::path& where) {
  static const std::pair<const char*, at::ScalarType> kNames[] = {
      {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},    {"uint8", at::kByte}};
  for (const auto& [n, t] : kNames) {
    if (name == n) return t;
  }
  PC_THROW(ModelError, where, ": input dtype '", name,
           "' is not one of float32, float16, bfloat16, int64, int32, uint8");
}

std::vector<Pt2Input> parse_inputs(const std::string& text, const std::filesystem::path& where) {
  std::vector<Pt2Input> inputs;
  try {
    const auto json = nlohmann::json::parse(text);
    PC_CHECK(json.is_object() && json.contains("inputs") && json["inputs"].is_array() &&
                 !json["inputs"].empty(),
             ModelError, where, ": needs a non-empty \"inputs\" list");
    for (const auto& item : json["inputs"]) {
      PC_CHECK(item.is_object() && item.contains("shape") && item["shape"].is_array() &&
                   item.contains("dtype") && item["dtype"].is_string(),
               ModelError, where, ": each input needs \"shape\" (a list) and \"dtype\"");
      Pt2Input input;
      for (const auto& d : item["shape"]) {
        PC_CHECK(d.is_number_integer() && d.get<int64_t>() >= -1 && d.get<int64_t>() != 0 &&
                     d.get<int64_t>() <= (int64_t{1} << 40),
                 ModelError, where, ": shape ", item["shape"].dump(), " holds ", d.dump(),
                 "; each dimension is a positive size, or -1 (dynamic)");
        input.shape.push_back(d.get<int64_t>());
      }
      PC_CHECK(!input.shape.empty(), ModelError, where, ": an input of shape [] (a scalar)");
      input.dtype = parse_dtype(item["dtype"].get<std::string>(), where);
      inputs.push_back(std::move(input));
    }
  } catch (const nlohmann::json::exception& e) {
    PC_THROW(ModelError, where, ": not valid JSON (", e.what(), ")");
  }
  return inputs;
}

// A package's compiled code names libtorch.so among its libraries, which precompute itself does not
// need (the linker drops it), and a library opened at run time finds its own dependencies only on
// the system's path or LD_LIBRARY_PATH, not on this binary's run path: opened here first, through
// the run path, the package's reference resolves to the copy already loaded.
void load_libtorch_for_packages() {
  static const bool loaded = ::dlopen("libtorch.so", RTLD_NOW | RTLD_GLOBAL) != nullptr;
  (void)loaded;  // when it fails, the package's own load fails and says what is missing
}

// LibTorch's text of an exception, without the C++ backtrace its errors carry.
std::string error_text(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

std::string describe_shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

}  // namespace

// Note [Builds in one package]
// A package may hold several builds of one model, each under its own name in
// data/aotinductor/ (python/precompute/export.py names them "<device>_<dtype>": cpu_float32,
// cuda_float16), so that one file serves every device and dtype it was built for, as a
// TorchScript file does. A package of one build names it "model" (what
// torch._inductor.aoti_compile_and_package writes). precompute loads the build named after the
// section's device kind and dtype, or the only one, and refuses a package with several builds
// but none for the section, naming those it has. The builds of one package declare the same
// preprocessing.
std::vector<std::string> pt2_builds(const std::filesystem::path& file) {
  caffe2::serialize::PyTorchStreamReader reader(file.string());
  std::vector<std::string> names;
  const std::string prefix = "data/aotinductor/";
  for (const auto& record : reader.getAllRecords()) {
    if (record.rfind(prefix, 0) != 0) continue;
    const auto slash = record.find('/', prefix.size());
    if (slash == std::string::npos) continue;
    auto name = record.substr(prefix.size(), slash - prefix.size());
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::optional<std::string> pt2_declaration(const std::filesystem::path& file) {
  const auto builds = pt2_builds(file);
  const bool single = std::find(builds.begin(), builds.end(), "model") != builds.end();
  const std::string build = single || builds.empty() ? "model" : builds.front();
  const auto found = find_declaration(
      torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(file.string(), build),
      file);
  return found ? std::optional<std::string>(found->text) : std::nullopt;
}

std::string describe_pt2_input(const Pt2Input& input) {
  return describe_shape(input.shape) + " " + dtype_name(input.dtype);
}

Pt2Model::Pt2Model(const std::filesystem::path& file, const c10::Device& device, ComputeDtype dtype,
                   ModelUse use)
    : file_(file), device_(device), dtype_(to_scalar_type(dtype)), use_(std::move(use)) {
  // From before the metadata is read: LibTorch unpacks the package for that too (Note
  // [Unpacked packages] in encoders/unpacked_packages.cpp).
  PackageUnpacking unpacking;
  const std::string what = detail::concat(modality_name(use_.modality), " model ", file.string());
  const std::string wanted = device.is_cuda() ? "cuda" : "cpu";
  std::vector<std::string> builds;
  try {
    builds = pt2_builds(file);
  } catch (const std::exception& e) {
    PC_THROW(ModelError, what, " is not an AOTInductor package (",
             model_message_line(error_text(e)),
             "); make one with torch._inductor.aoti_compile_and_package, or use a TorchScript "
             "file (encoder.type: torchscript)");
  }
  // Which build (Note [Builds in one package]).
  const std::string named = detail::concat(wanted, "_", compute_dtype_name(dtype));
  if (std::find(builds.begin(), builds.end(), named) != builds.end()) {
    build_ = named;
  } else if (builds.size() == 1) {
    build_ = builds.front();
  } else {
    std::string have;
    for (const auto& b : builds) have += (have.empty() ? "" : ", ") + b;
    PC_CHECK(!builds.empty(), ModelError, what,
             " is not an AOTInductor package: it holds no model under data/aotinductor/; make "
             "one with torch._inductor.aoti_compile_and_package, or use a TorchScript file "
             "(encoder.type: torchscript)");
    PC_THROW(ModelError, what, " holds the builds ", have, " and none named ", named, " for ",
             modality_name(use_.modality), " on ", device.str(), " in ",
             compute_dtype_name(dtype), ": set ", modality_name(use_.modality),
             ".device and .dtype to one of them, or export it again with that build");
  }
  if (builds.size() > 1) {
    log_message(LogLevel::kInfo, detail::concat(what, ": build ", build_, " of ", builds.size()));
  }
  std::unordered_map<std::string, std::string> metadata;
  try {
    metadata =
        torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(file.string(), build_);
  } catch (const std::exception& e) {
    PC_THROW(ModelError, what, " is not an AOTInductor package with a model named '", build_,
             "' (", model_message_line(error_text(e)),
             "); make one with torch._inductor.aoti_compile_and_package, or use a TorchScript "
             "file (encoder.type: torchscript)");
  }
  // A package holds code for one kind of device: a CPU build cannot take device_index 0, a CUDA
  // build cannot run on the CPU.
  const auto compiled_for = metadata.count(kDeviceKey) ? metadata.at(kDeviceKey) : "";
  PC_CHECK(compiled_for == wanted, ModelError, what, " was compiled for ",
           compiled_for.empty() ? "an unknown device" : compiled_for, ", and ",
           modality_name(use_.modality), " runs on ", device.str(),
           ": export the package again for ", wanted, ", or set ", modality_name(use_.modality),
           ".device (or run.device) to ", compiled_for);
  const auto declaration = find_declaration(metadata, file);
  PC_CHECK(declaration.has_value(), ModelError, what,
           " does not say what input it takes, and a package runs a wrong-sized or "
           "wrong-typed input silently: ",
           sidecar_hint(file));
  inputs_ = parse_inputs(declaration->text, declaration->where);
  PC_CHECK(at::isFloatingType(inputs_.front().dtype) && inputs_.front().dtype == dtype_, ModelError,
           what, " takes ", describe_pt2_input(inputs_.front()), " and ",
           modality_name(use_.modality), ".dtype is ", compute_dtype_name(dtype), ": set ",
           modality_name(use_.modality), ".dtype to the package's, or export it again in ",
           compute_dtype_name(dtype));
  load_libtorch_for_packages();
  try {
    const c10::DeviceIndex index = device.is_cuda() ? (device.has_index() ? device.index() : 0)
                                                    : static_cast<c10::DeviceIndex>(-1);
    loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        file.string(), build_, /*run_single_threaded=*/false, /*num_runners=*/1, index);
    unpacking.settle(/*keep=*/device.is_cuda());
  } catch (const std::exception& e) {
    PC_THROW(ModelError, "cannot load ", what, " onto ", device.str(), ": ",
             model_message_line(error_text(e)));
  }
}

Pt2Model::~Pt2Model() {
  // LibTorch removes the package's folder with the model; its ledger entry goes too.
  loader_.reset();
  forget_removed_packages();
}

at::Tensor Pt2Model::forward(std::vector<at::Tensor> inputs) {
  const auto given = [&] {
    return describe_values(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  };
  bool fits = inputs.size() == inputs_.size();
  for (size_t i = 0; fits && i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    const auto& want = inputs_[i];
    fits = t.scalar_type() == want.dtype && t.dim() == static_cast<int64_t>(want.shape.size()) &&
           t.device() == device_ && t.is_contiguous();
    for (size_t d = 0; fits && d < want.shape.size(); ++d) {
      fits = want.shape[d] == -1 || want.shape[d] == t.size(static_cast<int64_t>(d));
    }
  }
  if (!fits) {
    std::string declared;
    for (const auto& in : inputs_)
      declared += (declared.empty() ? "" : ", ") + describe_pt2_input(in);
    PC_THROW(ModelError, modality_name(use_.modality), " model ", file_, " takes ", declared,
             " and was given ", given(), ", shaped by ", use_.input_keys,
             " (a package checks nothing itself: this call was refused, not run): change those "
             "keys, or export the package for this input");
  }
  std::vector<at::Tensor> outputs;
  try {
    outputs = loader_->run(inputs);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // TorchEncoder::encode releases cached memory; the encode stage splits the batch
  } catch (const std::exception& e) {
    throw_model_failure(file_, use_, device_, given(), error_text(e));
  }
  PC_CHECK(outputs.size() == 1, ModelError, modality_name(use_.modality), " model ", file_,
           " returned ", outputs.size(), " tensors (",
           describe_values(std::vector<c10::IValue>(outputs.begin(), outputs.end())),
           "); precompute stores one tensor per call: export a module whose forward returns "
           "the tensor to store");
  return std::move(outputs.front());
}

std::vector<at::Tensor> Pt2Model::weights() const {
  std::vector<at::Tensor> all;
  for (const auto& [name, tensor] : loader_->get_runner()->extract_constants_map(false)) {
    all.push_back(tensor);
  }
  return all;
}

}  // namespace precompute
