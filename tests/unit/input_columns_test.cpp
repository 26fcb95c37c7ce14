// Note [A modality that no line feeds]: check_input_columns() against manifests read by the real
// reader, a misspelled column in each layout, and the inputs that must pass (audio from the video
// column, a modality fed by one line, CSV columns matched ignoring case).

#include "pipeline/input/input_columns.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/input/manifest.hpp"

namespace precompute {
namespace {

Config config_with(const std::string& sections) {
  return parse_config(sections, "/cfg");
}

const char* const kVideoAndText =
    "video: {encoder: {path: v.pt}, sampling: {fps: 1}}\ntext: {encoder: {path: t.pt}}\n";

// The message check_input_columns() refuses `manifest` with under `config`; "" when it passes.
std::string refusal(const std::string& manifest, ManifestFormat format, const Config& config) {
  std::istringstream in(manifest);
  InputColumns columns;
  const auto samples = parse_manifest(in, format, "/data", "manifest m", {}, &columns);
  try {
    check_input_columns(samples, columns, config);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(InputColumnsTest, AMisspelledJsonlKeyIsRefusedNamingTheKeysThere) {
  const auto error = refusal("{\"id\": \"a\", \"vid\": \"a.mp4\", \"text\": \"x\"}\n"
                             "{\"id\": \"b\", \"text\": \"y\", \"split\": \"val\"}\n",
                             ManifestFormat::kJsonl, config_with(kVideoAndText));
  EXPECT_NE(error.find("manifest m: no line gives the video section an input"), std::string::npos)
      << error;
  EXPECT_NE(error.find("each line's 'video' key"), std::string::npos) << error;
  EXPECT_NE(error.find("its lines have the keys 'id', 'vid', 'text', 'split'"), std::string::npos)
      << error;
  EXPECT_NE(error.find("keys are case-sensitive"), std::string::npos) << error;
  EXPECT_NE(error.find("remove the video section"), std::string::npos) << error;
}

TEST(InputColumnsTest, AMisspelledCsvColumnIsRefusedNamingTheHeader) {
  const auto error = refusal("id,video,caption\na,a.mp4,x\n", ManifestFormat::kCsv,
                             config_with(kVideoAndText));
  EXPECT_NE(error.find("each line's 'text' column (the caption)"), std::string::npos) << error;
  EXPECT_NE(error.find("its header names the columns 'id', 'video', 'caption'"),
            std::string::npos) << error;
  EXPECT_NE(error.find("matched ignoring case"), std::string::npos) << error;
}

TEST(InputColumnsTest, AColumnThatIsAlwaysEmptyIsRefusedSayingSo) {
  const auto error = refusal("id\tvideo\ttext\na\t\tx\nb\t\ty\n", ManifestFormat::kTsv,
                             config_with(kVideoAndText));
  EXPECT_NE(error.find("the column is there, but empty on every line"), std::string::npos)
      << error;
}

TEST(InputColumnsTest, WhatFeedsAModalityPasses) {
  // Audio from the video files' tracks; text from one line of two; 'VIDEO' as a CSV header.
  EXPECT_EQ(refusal("{\"id\": \"a\", \"video\": \"a.mp4\"}\n"
                    "{\"id\": \"b\", \"video\": \"b.mp4\", \"text\": \"y\"}\n",
                    ManifestFormat::kJsonl,
                    config_with("audio: {encoder: {path: a.pt}}\ntext: {encoder: {path: t.pt}}\n")),
            "");
  EXPECT_EQ(refusal("ID,VIDEO,Text\na,a.mp4,\n", ManifestFormat::kCsv,
                    config_with(kVideoAndText)),
            "");
  // A column that is not read only warns.
  EXPECT_EQ(refusal("{\"id\": \"a\", \"video\": \"a.mp4\", \"text\": \"x\", \"label\": 1}\n",
                    ManifestFormat::kJsonl, config_with(kVideoAndText)),
            "");
}

TEST(InputColumnsTest, UnusedColumnsAreThoseNothingReads) {
  const auto unused = [](InputLayout layout, std::vector<std::string> names,
                         const std::string& config) {
    InputColumns columns;
    columns.layout = layout;
    columns.names = std::move(names);
    return unused_columns(columns, config_with(config));
  };
  using Names = std::vector<std::string>;
  const std::string audio_and_text =
      "audio: {encoder: {path: a.pt}}\ntext: {encoder: {path: t.pt}}\n";
  // 'video' feeds an audio section; a kept column is read, matched as the reader matches it.
  EXPECT_EQ(unused(InputLayout::kJsonl, {"id", "video", "text", "Label", "label", "vid"},
                   audio_and_text + "output: {keep_columns: [Label]}\n"),
            (Names{"label", "vid"}));
  EXPECT_EQ(unused(InputLayout::kDelimited, {"ID", "Video", "AUDIO", "LABEL", "split"},
                   std::string(kVideoAndText) + "output: {keep_columns: [label]}\n"),
            (Names{"AUDIO", "split"}));
  InputColumns folder;
  folder.layout = InputLayout::kFolder;
  folder.video_files = 2;
  folder.audio_files = 1;
  folder.caption_files = 1;
  EXPECT_EQ(unused_columns(folder, config_with(kVideoAndText)), (Names{"audio"}));
  EXPECT_EQ(unused_columns(folder, config_with("audio: {encoder: {path: a.pt}}\n")),
            (Names{"caption"}));
}

TEST(InputColumnsTest, ListedNamesAreShownSafelyAndCut) {
  // A key with a NUL and a control character, a key of 200 bytes, a CSV name that is not UTF-8.
  const std::string long_key(200, 'k');
  auto error = refusal("{\"id\": \"a\", \"vi\\u0000d\": 1, \"t\\nxt\": 2, \"" + long_key +
                           "\": 3, \"text\": \"x\"}\n",
                       ManifestFormat::kJsonl, config_with(kVideoAndText));
  EXPECT_NE(error.find("'vi\\x00d', 't\\x0Axt', '" + long_key.substr(0, 64) + "...', 'text'"),
            std::string::npos) << error;
  error = refusal("id,\xE9\xFF,text\na,x,y\n", ManifestFormat::kCsv, config_with(kVideoAndText));
  EXPECT_NE(error.find("'id', '\\xE9\\xFF', 'text'"), std::string::npos) << error;
}

TEST(InputColumnsTest, AFolderWithoutCaptionsIsRefusedUnderATextSection) {
  InputColumns files;
  files.layout = InputLayout::kFolder;
  files.name = "input folder media";
  files.video_files = 2;
  files.caption_files = 1;
  files.lone_captions = 1;
  SampleSpec spec;
  spec.id = "a";
  spec.video = std::filesystem::path("/media/a.mp4");
  try {
    check_input_columns({spec}, files, config_with(kVideoAndText));
    FAIL() << "not refused";
  } catch (const InputError& e) {
    const std::string error = e.what();
    EXPECT_NE(error.find("no sample gives the text section an input"), std::string::npos) << error;
    EXPECT_NE(error.find("2 video file(s), 0 audio file(s) and 1 caption file(s) (.txt), 1 of "
                         "them beside no video or audio file of its name"),
              std::string::npos) << error;
  }
}

}  // namespace
}  // namespace precompute
