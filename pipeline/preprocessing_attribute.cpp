#include "pipeline/preprocessing_attribute.hpp"

#include <nlohmann/json.hpp>

#include <set>
#include <string_view>

#include "encoders/bert/text_settings.hpp"
#include "pipeline/core/config_fields.hpp"
#include "pipeline/core/sha256.hpp"

namespace precompute {
namespace {

// The section's fingerprint keys (the config key table's in_fingerprint entries), as the
// fingerprint writes them.
nlohmann::json fingerprint_keys(const Config& c, std::string_view section) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : config_fields()) {
    if (f.recorded == Recorded::kFingerprint && f.section() == section) f.write(f, c, j);
  }
  return j;
}

// Note [The stored preprocessing]
// The attribute says how the inputs were made in the values a reader needs: the effective ones
// (hop_s when 0 means window_s, the tokenizer's settings as resolved from a model folder, the
// normalisation applied) and what the code fixes (mono audio, RGB24 from swscale). Those are
// written by hand below. So that no setting that changes the inputs can be left out of it, every
// other fingerprint key of the modality's section in the config key table is added from the
// table, except those the shard stores on their own (the encoder's type, by its file and hash,
// and pooling, as ModalitySchema::pooling). A key added this way is written only where it is not
// its default, as output.keep_columns is left out of the fingerprint while empty: the attributes,
// fingerprints and output ids of runs made before it was stored stay as they were, and their
// resumes are not refused (video.autorotate came in so; `false` is stored, `true` is not).
void add_other_fingerprint_keys(const Config& c, Modality m, nlohmann::json& j) {
  static const std::set<std::string, std::less<>> kStoredApart = {"type", "pooling"};
  const std::string_view section = modality_name(m);
  Config defaults;
  enable_section(defaults, section);
  const nlohmann::json now = fingerprint_keys(c, section);
  const nlohmann::json by_default = fingerprint_keys(defaults, section);
  for (const auto& [key, value] : now.items()) {
    if (j.contains(key) || kStoredApart.count(key) > 0) continue;
    if (!by_default.contains(key) || by_default.at(key) != value) j[key] = value;
  }
}

}  // namespace

std::string preprocessing_json(const Config& c, Modality m) {
  nlohmann::json j;
  switch (m) {
    case Modality::kVideo:
      j = {{"fps", c.video.fps},
           {"num_frames", c.video.num_frames},
           {"size", {c.video.height, c.video.width}},
           {"resize", resize_mode_name(c.video.resize)},
           {"mean", c.video.mean},
           {"std", c.video.std},
           {"layout", video_layout_name(c.video.layout)},
           {"color", "RGB24 from swscale, full range"},
           {"dtype", compute_dtype_name(c.video.dtype)},
           {"normalize", c.video.normalized()}};
      break;
    case Modality::kAudio:
      j = {{"sample_rate", c.audio.sample_rate},
           {"channels", 1},
           {"window_s", c.audio.window_s},
           {"hop_s", c.audio.hop_s > 0 ? c.audio.hop_s : c.audio.window_s},
           {"dtype", compute_dtype_name(c.audio.dtype)},
           {"normalize", c.audio.normalized()}};
      break;
    case Modality::kText: {
      const auto t = tokenizer_options(c.text);
      j = {{"tokenizer", "bert-wordpiece"},
           {"encoder_type", encoder_type_name(c.text.encoder.type)},
           {"lower_case", t.lower_case},
           {"strip_accents", t.strip_accents.value_or(t.lower_case)},
           {"tokenize_chinese_chars", t.tokenize_chinese_chars},
           {"max_length", t.max_length},
           {"output_layer", c.text.output_layer},
           {"dtype", compute_dtype_name(c.text.dtype)},
           {"normalize", c.text.normalized()}};
      // A bert folder's vocabulary is part of the encoder's hash; a separate vocab file is not.
      if (!c.text.vocab.empty()) j["vocab_sha256"] = sha256_file(c.text.vocab);
      break;
    }
  }
  add_other_fingerprint_keys(c, m, j);
  return j.dump();
}

}  // namespace precompute
