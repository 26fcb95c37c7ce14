// The preprocessing stored with each modality (pipeline/preprocessing_attribute.cpp): every
// fingerprint key of the section is in it, and a key added from the config key table is written
// only where it is not its default, so earlier outputs' attributes stay as they were.
#include "pipeline/preprocessing_attribute.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "pipeline/core/config_fields.hpp"

namespace precompute {
namespace {

std::set<std::string> keys_of(const std::string& json) {
  const auto parsed = nlohmann::json::parse(json);
  std::set<std::string> keys;
  for (const auto& [key, value] : parsed.items()) keys.insert(key);
  return keys;
}

Config with(std::string_view section) {
  Config c;
  enable_section(c, section);
  return c;
}

TEST(PreprocessingAttribute, DefaultsKeepTheKeysEarlierOutputsStored) {
  EXPECT_EQ(keys_of(preprocessing_json(with("video"), Modality::kVideo)),
            (std::set<std::string>{"color", "dtype", "fps", "layout", "mean", "normalize",
                                   "num_frames", "resize", "size", "std"}));
  EXPECT_EQ(keys_of(preprocessing_json(with("audio"), Modality::kAudio)),
            (std::set<std::string>{"channels", "dtype", "hop_s", "normalize", "sample_rate",
                                   "window_s"}));
}

// video.autorotate changes every frame of a rotated clip: a reader must be able to tell.
TEST(PreprocessingAttribute, RecordsAutorotateOff) {
  Config c = with("video");
  const auto on = preprocessing_json(c, Modality::kVideo);
  c.video.autorotate = false;
  const auto off = preprocessing_json(c, Modality::kVideo);
  EXPECT_NE(on, off);
  EXPECT_EQ(nlohmann::json::parse(off).at("autorotate"), false);
}

// Every fingerprint key of a section, changed from its default, changes the attribute or is
// stored apart from it (the encoder's type, pooling): a key added to the table cannot be missed.
TEST(PreprocessingAttribute, EveryFingerprintKeyIsStored) {
  for (Modality m : {Modality::kVideo, Modality::kAudio}) {
    const std::string section(modality_name(m));
    const auto attribute = keys_of(preprocessing_json(with(section), m));
    for (const auto& f : config_fields()) {
      if (f.recorded != Recorded::kFingerprint || f.section() != section) continue;
      nlohmann::json written = nlohmann::json::object();
      f.write(f, with(section), written);
      for (const auto& [key, value] : written.items()) {
        if (key == "type" || key == "pooling" || key == "autorotate") continue;
        EXPECT_EQ(attribute.count(key), 1U) << section << "." << key;
      }
    }
  }
}

}  // namespace
}  // namespace precompute
