// validate(): the rules that tie keys together, in the order a person would fix them; the range
// of each key is the table's (check_section below).

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <string>

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_bounds.hpp"
#include "pipeline/core/config_fields.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

std::string where(const Config& c) {
  return c.file.empty() ? std::string("config") : "config " + c.file.string();
}

// Every key of `section` against its range (Note [Config bounds]).
void check_section(const Config& c, std::string_view section) {
  for (const auto& f : config_fields()) {
    if (f.section() == section && f.check) f.check(f, c);
  }
}

// The model file or folder, then the pooling choices of the section `name`.
void validate_encoder(const EncoderSection& s, const std::string& name,
                      std::initializer_list<Pooling> poolings) {
  PC_CHECK(!s.encoder.path.empty(), ConfigError, "config section '", name,
           "' needs 'encoder: {path: MODEL}'");
  if (s.encoder.type == EncoderType::kBert) {
    PC_CHECK(std::filesystem::is_directory(s.encoder.path), ConfigError, "config key '", name,
             ".encoder.path': ", s.encoder.path,
             " is not a folder; type bert needs a Hugging Face model folder (config.json, "
             "model.safetensors, vocab.txt or tokenizer.json)");
  } else {
    PC_CHECK(s.encoder.type != EncoderType::kTorchScript || name != "text" ||
                 s.encoder.path.extension() != ".pt2",
             ConfigError, "config key 'text.encoder.path': ", s.encoder.path,
             " is an AOTInductor package; text encoders are TorchScript files or BERT folders "
             "(type: bert), packages are for video and audio");
    PC_CHECK(std::filesystem::is_regular_file(s.encoder.path), ConfigError, "config key '", name,
             ".encoder.path': model file ", s.encoder.path,
             " does not exist; export it first (tools/scripts/export_encoders.py makes the "
             "demo's)");
  }
  const bool allowed =
      std::find(poolings.begin(), poolings.end(), s.pooling_mode()) != poolings.end();
  std::string list;
  for (auto p : poolings) list += (list.empty() ? "" : ", ") + std::string(pooling_name(p));
  PC_CHECK(allowed, ConfigError, "config key '", name, ".pooling' is '",
           pooling_name(s.pooling_mode()), "'; for ", name, " use one of: ", list);
}

// output.keep_columns beyond what every name list is checked for (config_fields.cpp): names a
// manifest column can have and an HDF5 dataset can be named (/columns/<name>), none of them a
// column the manifest already gives a meaning (Note [Kept columns] in pipeline/input/manifest.cpp).
void validate_keep_columns(const Config& c) {
  const auto& names = c.output.keep_columns.names;
  if (names.empty()) return;
  PC_CHECK(c.input.folder.empty(), ConfigError, "config key 'output.keep_columns' needs a "
           "manifest: a folder input (input.folder or --input FOLDER) has no columns to keep");
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const std::string at = "output.keep_columns[" + std::to_string(i) + "]";
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    for (const char* reserved : {"id", "video", "audio", "text"}) {
      PC_CHECK(lower != reserved, ConfigError, "config key '", at, "' is '", name,
               "': id, video, audio and text are the manifest's own columns and are stored "
               "already (/ids, the embeddings); keep other columns (config file or "
               "--keep-columns)");
    }
    PC_CHECK(name.find('/') == std::string::npos && name != "." && name != "..", ConfigError,
             "config key '", at, "' is '", name, "': a kept column becomes the HDF5 dataset "
             "/columns/<name>, which cannot hold '/' or be '.' or '..'; rename the column "
             "(config file or --keep-columns)");
  }
}

}  // namespace

void validate(const Config& c) {
  const int inputs = int{!c.input.manifest.empty()} + int{!c.input.folder.empty()} +
                     int{!c.input.tars.empty()};
  for (size_t i = 0; i < c.input.tars.size(); ++i) {
    PC_CHECK(c.input.tars.paths[i].native().find('\0') == std::string::npos, ConfigError,
             where(c), ": input.tars",
             c.input.tars.size() > 1 ? "[" + std::to_string(i) + "]" : std::string(),
             " contains a NUL character, which no file name can hold; fix the path");
  }
  PC_CHECK(inputs == 1, ConfigError, where(c),
           ": give exactly one input, 'input.manifest' (JSONL/CSV/TSV), 'input.folder' or "
           "'input.tars' (WebDataset shards), or pass --input");
  PC_CHECK(!c.output.path.empty(), ConfigError, where(c),
           ": no output folder; set 'output.path' or pass --output");
  check_section(c, "input");
  check_section(c, "output");
  validate_keep_columns(c);
  PC_CHECK(c.video.enabled || c.audio.enabled || c.text.enabled, ConfigError, where(c),
           ": no encoder configured; add a 'video', 'audio' or 'text' section");
  check_section(c, "run");
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn",
                                                "warning", "error", "critical", "off"};
  PC_CHECK(!(c.output.overwrite && c.output.retry_failed), ConfigError,
           "--overwrite starts over and --retry-failed resumes: give one of them");
  PC_CHECK(kLevels.count(c.run.log_level) == 1, ConfigError, "log level '", c.run.log_level,
           "' is unknown; use trace, debug, info, warn, error or off");

  if (c.video.enabled) {
    const auto& v = c.video;
    validate_encoder(v, "video", {Pooling::kMean, Pooling::kNone, Pooling::kModel});
    check_section(c, "video");
    PC_CHECK((v.fps != 0) != (v.num_frames != 0), ConfigError,
             "config key 'video.sampling' needs exactly one of 'fps', ",
             range_text(*config_field("video.sampling.fps").bound), ", or 'num_frames', ",
             range_text(*config_field("video.sampling.num_frames").bound));
    PC_CHECK(v.layout == VideoLayout::kClips || v.pooling_mode() != Pooling::kModel, ConfigError,
             "config key 'video.pooling: model' needs 'layout: clips' (the model sees whole "
             "clips); with layout: frames use mean or none");
    PC_CHECK(v.layout == VideoLayout::kFrames || v.num_frames > 0, ConfigError,
             "config key 'video.layout: clips' needs 'sampling: {num_frames: N}' so that every "
             "clip in a batch has the same number of frames");
  }
  if (c.audio.enabled) {
    const auto& a = c.audio;
    validate_encoder(a, "audio", {Pooling::kMean, Pooling::kNone});
    check_section(c, "audio");
    PC_CHECK(a.window_s > 0 || a.hop_s == 0, ConfigError,
             "config key 'audio.hop_s' needs 'audio.window_s' (whole-clip mode has no hop)");
    // A window or hop under one sample rounds to nothing (window) or to one sample (hop: a
    // window starting at every sample of the clip).
    for (const auto& [key, seconds] : {std::pair{"audio.window_s", a.window_s},
                                       std::pair{"audio.hop_s", a.hop_s}}) {
      PC_CHECK(seconds == 0 || seconds * a.sample_rate >= 1, ConfigError, "config key '", key,
               "' must be ", range_text(*config_field(key).bound), ", and at least one sample (1/",
               a.sample_rate, " s), got ", value_text(seconds));
    }
  }
  if (c.text.enabled) {
    const auto& t = c.text;
    if (t.encoder.type == EncoderType::kBert) {
      validate_encoder(t, "text", {Pooling::kMean, Pooling::kNone, Pooling::kCls, Pooling::kMax});
    } else {
      validate_encoder(t, "text", {Pooling::kMean, Pooling::kNone, Pooling::kCls, Pooling::kMax,
                                   Pooling::kModel});
      PC_CHECK(!t.vocab.empty(), ConfigError,
               "config key 'text.tokenizer.vocab' is missing: a TorchScript text model needs "
               "the WordPiece vocab.txt it was trained with");
    }
    PC_CHECK(t.vocab.empty() || std::filesystem::is_regular_file(t.vocab), ConfigError,
             "config key 'text.tokenizer.vocab': ", t.vocab,
             " does not exist; point it at the model's vocab.txt");
    check_section(c, "text");
    PC_CHECK(t.encoder.type == EncoderType::kBert || t.output_layer == -1, ConfigError,
             "config key 'text.output_layer' needs 'encoder.type: bert' (a TorchScript model "
             "returns what it returns)");
  }
}

}  // namespace precompute
