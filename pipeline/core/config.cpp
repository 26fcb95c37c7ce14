#include "pipeline/core/config.hpp"

#include "pipeline/core/error.hpp"
#include "pipeline/core/media_names.hpp"

namespace precompute {

std::string_view compute_dtype_name(ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFloat32:
      return "float32";
    case ComputeDtype::kFloat16:
      return "float16";
    case ComputeDtype::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

std::string_view encoder_type_name(EncoderType t) {
  switch (t) {
    case EncoderType::kBert:
      return "bert";
    case EncoderType::kPt2:
      return "pt2";
    case EncoderType::kTorchScript:
      break;
  }
  return "torchscript";
}

std::string_view storage_dtype_name(StorageDtype d) {
  return d == StorageDtype::kFloat16 ? "float16" : "float32";
}

std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kMean:
      return "mean";
    case Pooling::kNone:
      return "none";
    case Pooling::kCls:
      return "cls";
    case Pooling::kMax:
      return "max";
    case Pooling::kModel:
      return "model";
  }
  return "?";
}

std::string_view video_decoder_name(VideoDecoderKind k) {
  return k == VideoDecoderKind::kAuto ? "auto" : k == VideoDecoderKind::kCpu ? "cpu" : "nvdec";
}

std::optional<int> cuda_ordinal(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0) return std::stoi(device.substr(5));
  return std::nullopt;
}

std::string_view resize_mode_name(ResizeMode r) {
  return r == ResizeMode::kShorterSideCrop ? "shorter_side_crop" : "stretch";
}

std::string_view video_layout_name(VideoLayout l) {
  return l == VideoLayout::kFrames ? "frames" : "clips";
}

const EncoderSection& Config::section(Modality m) const {
  switch (m) {
    case Modality::kVideo:
      return video;
    case Modality::kAudio:
      return audio;
    case Modality::kText:
      return text;
  }
  PC_ASSERT(false, "unknown modality");
}

std::vector<std::string> Config::devices_for(Modality m) const {
  const auto& own = section(m).devices;
  return own.empty() ? run.devices : own;
}

const VideoSection& default_video_section() {
  static const VideoSection section;
  return section;
}

const AudioSection& default_audio_section() {
  static const AudioSection section;
  return section;
}

const TextSection& default_text_section() {
  static const TextSection section;
  return section;
}

std::string PathList::text() const {
  std::string out;
  for (const auto& path : paths) out += (out.empty() ? "" : ", ") + path.string();
  return out;
}

InputSection input_section_for(const std::filesystem::path& argument) {
  InputSection input;
  if (names_tar_shards(argument)) {
    input.tars = PathList{{argument}};
  } else if (std::filesystem::is_directory(argument)) {
    input.folder = argument;
  } else {
    input.manifest = argument;
  }
  return input;
}

InputSection input_section_for(const std::vector<std::filesystem::path>& arguments) {
  if (arguments.size() == 1) return input_section_for(arguments[0]);
  InputSection input;
  for (const auto& argument : arguments) {
    PC_CHECK(names_tar_shards(argument), ConfigError, "--input is given ", arguments.size(),
             " times, which only a list of tar shards can be (as input.tars lists them), and '",
             argument.string(), "' names no .tar; give one manifest or folder, or only tars");
    input.tars.paths.push_back(argument);
  }
  return input;
}

const RunSection& default_run_section() {
  static const RunSection section;
  return section;
}

}  // namespace precompute
