#include "encoders/package_settings.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "encoders/pt2_model.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {
namespace {

using nlohmann::json;

constexpr const char* kFromPackage = "model package";
constexpr const char* kFromConfig = "config file";
constexpr const char* kFromDefault = "default";

bool in_file(const EncoderSection& s, const char* key) {
  return std::find(s.keys_in_file.begin(), s.keys_in_file.end(), key) != s.keys_in_file.end();
}

// One setting a package may decide: its value in the config (as JSON), how to read the package's
// JSON into the section, and the config file's key that sets it.
template <class Section>
struct Setting {
  const char* name;      // in the package's JSON and in messages: "size"
  const char* file_key;  // the section's key in a config file: "size", "sampling"
  json (*current)(const Section&);
  void (*apply)(Section&, const json&);
};

json size_of(const VideoSection& v) { return json::array({v.height, v.width}); }
void set_size(VideoSection& v, const json& j) {
  if (j.is_number_integer()) {
    v.height = v.width = j.get<int>();
  } else {
    PC_CHECK(j.is_array() && j.size() == 2, ModelError, "size must be N or [height, width]");
    v.height = j[0].get<int>();
    v.width = j[1].get<int>();
  }
}
// A float as the shortest decimal that reads back as it: 0.485, not 0.48500001430511475.
json decimal(float f) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(text, nullptr) == f) break;
  }
  return json(std::strtod(text, nullptr));
}
json float3(const Float3& f) { return json::array({decimal(f[0]), decimal(f[1]), decimal(f[2])}); }
Float3 read_float3(const json& j) {
  PC_CHECK(j.is_array() && j.size() == 3, ModelError, "needs 3 numbers, one per channel");
  return {j[0].get<float>(), j[1].get<float>(), j[2].get<float>()};
}

const Setting<VideoSection> kVideo[] = {
    {"size", "size", size_of, set_size},
    {"mean", "mean", [](const VideoSection& v) { return float3(v.mean); },
     [](VideoSection& v, const json& j) { v.mean = read_float3(j); }},
    {"std", "std", [](const VideoSection& v) { return float3(v.std); },
     [](VideoSection& v, const json& j) { v.std = read_float3(j); }},
    {"resize", "resize",
     [](const VideoSection& v) { return json(std::string(resize_mode_name(v.resize))); },
     [](VideoSection& v, const json& j) {
       const auto name = j.get<std::string>();
       PC_CHECK(name == "shorter_side_crop" || name == "stretch", ModelError, "resize '", name,
                "' is not shorter_side_crop or stretch");
       v.resize = name == "stretch" ? ResizeMode::kStretch : ResizeMode::kShorterSideCrop;
     }},
    {"layout", "layout",
     [](const VideoSection& v) { return json(std::string(video_layout_name(v.layout))); },
     [](VideoSection& v, const json& j) {
       const auto name = j.get<std::string>();
       PC_CHECK(name == "frames" || name == "clips", ModelError, "layout '", name,
                "' is not frames or clips");
       v.layout = name == "clips" ? VideoLayout::kClips : VideoLayout::kFrames;
     }},
    {"frames", "sampling", [](const VideoSection& v) { return json(v.num_frames); },
     [](VideoSection& v, const json& j) {
       v.num_frames = j.get<int>();
       v.fps = 0;  // a clip model takes a number of frames, not a rate
     }},
};

const Setting<AudioSection> kAudio[] = {
    {"sample_rate", "sample_rate", [](const AudioSection& a) { return json(a.sample_rate); },
     [](AudioSection& a, const json& j) { a.sample_rate = j.get<int>(); }},
    {"window_s", "window_s", [](const AudioSection& a) { return json(a.window_s); },
     [](AudioSection& a, const json& j) { a.window_s = j.get<double>(); }},
};

template <class Section, size_t N>
void resolve(Section& section, const char* name, const Setting<Section> (&settings)[N]) {
  if (!section.enabled || section.encoder.type != EncoderType::kPt2) return;
  json declared;
  try {
    const auto text = pt2_declaration(section.encoder.path);
    if (!text) return;
    const auto all = json::parse(*text);
    if (!all.is_object() || !all.contains(name)) return;
    declared = all[name];
  } catch (const std::exception&) {
    return;  // the model's loader names what is wrong with the package
  }
  PC_CHECK(declared.is_object(), ModelError, "package ", section.encoder.path, ": its \"", name,
           "\" settings are not a JSON object");
  for (const auto& s : settings) {
    const std::string key = std::string(name) + "." + s.name;
    const bool given = in_file(section, s.file_key);
    if (!declared.contains(s.name)) {
      section.origins.push_back({key, s.current(section).dump(), given ? kFromConfig : kFromDefault});
      continue;
    }
    if (given) {
      Section theirs = section;
      try {
        s.apply(theirs, declared[s.name]);
      } catch (const std::exception&) {
      }
      if (s.current(theirs) != s.current(section)) {
        log_message(LogLevel::kWarn,
                    detail::concat(key, " is ", s.current(section).dump(),
                                   " in the config file and ", declared[s.name].dump(),
                                   " in the model package ", section.encoder.path.string(),
                                   ": the config's is used; remove the key to take the "
                                   "package's"));
      }
      section.origins.push_back({key, s.current(section).dump(), kFromConfig});
      continue;
    }
    try {
      s.apply(section, declared[s.name]);
    } catch (const std::exception& e) {
      PC_THROW(ModelError, "package ", section.encoder.path, " declares ", key, " ",
               declared[s.name].dump(), ", which precompute cannot use: ", e.what());
    }
    section.origins.push_back({key, s.current(section).dump(), kFromPackage});
  }
}

}  // namespace

void resolve_package_settings(Config& config) {
  resolve(config.video, "video", kVideo);
  resolve(config.audio, "audio", kAudio);
}

}  // namespace precompute
