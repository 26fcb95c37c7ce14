#include "pipeline/core/config.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_config(yaml, "/base");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, ReadsSectionsAndResolvesPathsAgainstTheConfigFolder) {
  const auto c = parse_config(R"(
input: {manifest: data/m.jsonl}
output: {path: /abs/out, shard_size: 7, dtype: float32}
run: {device: [cuda:0, cuda:1], max_failures: "2.5%"}
video:
  encoder: {path: models/v.pt}
  sampling: {num_frames: 8}
  size: [120, 160]
  layout: clips
  pooling: model
text:
  encoder: {path: t.pt}
  tokenizer: {vocab: vocab.txt, max_length: 64, strip_accents: false}
  pooling: cls
)",
                              "/base/cfg");
  EXPECT_EQ(c.input.manifest, "/base/cfg/data/m.jsonl");
  EXPECT_EQ(c.output.path, "/abs/out");
  EXPECT_EQ(c.output.shard_size, 7);
  EXPECT_EQ(c.output.dtype, StorageDtype::kFloat32);
  EXPECT_EQ(c.run.devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_DOUBLE_EQ(c.run.max_failure_fraction, 0.025);
  EXPECT_TRUE(c.video.enabled);
  EXPECT_FALSE(c.audio.enabled);
  EXPECT_EQ(c.video.encoder.path, "/base/cfg/models/v.pt");
  EXPECT_EQ(c.video.num_frames, 8);
  EXPECT_EQ(c.video.height, 120);
  EXPECT_EQ(c.video.width, 160);
  EXPECT_EQ(c.video.layout, VideoLayout::kClips);
  EXPECT_EQ(c.video.pooling, Pooling::kModel);
  EXPECT_EQ(c.text.vocab, "/base/cfg/vocab.txt");
  EXPECT_EQ(c.text.max_length, 64);
  EXPECT_FALSE(c.video.normalize.has_value());
  ASSERT_TRUE(c.text.strip_accents.has_value());
  EXPECT_FALSE(*c.text.strip_accents);
  EXPECT_FALSE(c.text.lower_case.has_value());  // unset: the model's, or BERT's default
  EXPECT_EQ(c.text.pooling, Pooling::kCls);
  EXPECT_EQ(c.devices_for(Modality::kText), c.run.devices);
}

TEST(ConfigTest, UnknownKeysAreRejectedWithTheirPath) {
  EXPECT_NE(error_of("vidoe: {}").find("unknown config key 'vidoe'"), std::string::npos);
  const auto e = error_of("video: {sampling: {fsp: 1}}");
  EXPECT_NE(e.find("'video.sampling.fsp'"), std::string::npos) << e;
  EXPECT_NE(e.find("fps"), std::string::npos) << "should list the known keys: " << e;
}

TEST(ConfigTest, WrongTypesAndValuesNameTheKeyAndTheChoices) {
  EXPECT_NE(error_of("output: {shard_size: many}").find("'output.shard_size' must be an integer"),
            std::string::npos);
  const auto e = error_of("video: {pooling: average}");
  EXPECT_NE(e.find("'video.pooling' is 'average'"), std::string::npos) << e;
  EXPECT_NE(e.find("mean, none"), std::string::npos) << e;
  EXPECT_NE(error_of("video: {sampling: {fps: 1, num_frames: 8}}").find("exactly one"),
            std::string::npos);
  EXPECT_NE(error_of(": [").find("not valid YAML"), std::string::npos);
}

TEST(ConfigTest, ValidateExplainsMissingPieces) {
  Config c;
  EXPECT_THROW(validate(c), ConfigError);  // no input
  c.input.manifest = "/m.jsonl";
  c.output.path = "/out";
  try {
    validate(c);
    FAIL() << "a config without encoders must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no encoder configured"), std::string::npos);
  }
  c.video.enabled = true;
  c.video.encoder.path = "/does/not/exist.pt";
  c.video.fps = 1;
  try {
    validate(c);
    FAIL() << "a missing model file must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
}

TEST(ConfigTest, ValidateChecksTheTextEncoderType) {
  const auto message = [](const std::string& yaml) {
    try {
      auto c = parse_config("input: {manifest: m.jsonl}\noutput: {path: o}\n" + yaml, "/");
      validate(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto sources = std::string(PRECOMPUTE_SOURCE_DIR);
  // A TorchScript text model needs its vocabulary.
  EXPECT_NE(message("text: {encoder: {path: " + sources + "/CMakeLists.txt}}")
                .find("text.tokenizer.vocab"),
            std::string::npos);
  // A bert encoder is a folder, not a file.
  EXPECT_NE(message("text: {encoder: {type: bert, path: " + sources + "/CMakeLists.txt}}")
                .find("is not a folder"),
            std::string::npos);
  const auto unknown = message("text: {encoder: {type: onnx, path: x}}");
  EXPECT_NE(unknown.find("torchscript, bert"), std::string::npos) << unknown;
  EXPECT_NE(message("video: {encoder: {type: bert, path: x}, sampling: {fps: 1}}")
                .find("for video use one of: torchscript"),
            std::string::npos);
}

TEST(ConfigTest, OverridesWinOverTheFile) {
  auto c = parse_config("run: {device: cuda}\nvideo: {device: cuda:1, batch_size: 4}\n", "/b");
  ConfigOverrides o;
  o.device = "cpu";
  o.batch_size = 9;
  o.output = "relative-out";
  o.max_failures = "12";
  apply_overrides(c, o);
  EXPECT_EQ(c.devices_for(Modality::kVideo), std::vector<std::string>{"cpu"});
  EXPECT_EQ(c.video.batch_size, 9);
  EXPECT_TRUE(c.output.path.is_absolute());
  EXPECT_EQ(c.run.max_failures, 12);
  EXPECT_LT(c.run.max_failure_fraction, 0);
}

TEST(ConfigTest, MaxFailuresAcceptsCountsAndPercentages) {
  RunSection run;
  parse_max_failures("-1", run);
  EXPECT_EQ(run.max_failures, -1);
  parse_max_failures("10%", run);
  EXPECT_DOUBLE_EQ(run.max_failure_fraction, 0.1);
  EXPECT_THROW(parse_max_failures("ten", run), ConfigError);
  EXPECT_THROW(parse_max_failures("150%", run), ConfigError);
  EXPECT_THROW(parse_max_failures("3x", run), ConfigError);
}

TEST(ConfigTest, SemanticFingerprintIgnoresThroughputSettingsOnly) {
  const std::string base = "video: {encoder: {path: v.pt}, sampling: {fps: 1}, batch_size: 4}\n";
  const auto a = semantic_config_json(parse_config(base, "/x"));
  EXPECT_EQ(a, semantic_config_json(parse_config(
                   "video: {encoder: {path: v.pt}, sampling: {fps: 1}, batch_size: 64}\n"
                   "run: {decode_threads: 3}\n",
                   "/y")));
  EXPECT_NE(a, semantic_config_json(parse_config(
                   "video: {encoder: {path: v.pt}, sampling: {fps: 2}, batch_size: 4}\n", "/x")));
  EXPECT_NE(a, semantic_config_json(parse_config(base + "output: {dtype: float32}\n", "/x")));
}

TEST(ConfigTest, MemoryBudgetsTakeSizesAndFractions) {
  EXPECT_EQ(parse_memory_budget("8GiB", "k").bytes, 8LL << 30);
  EXPECT_EQ(parse_memory_budget("512 MiB", "k").bytes, 512LL << 20);
  EXPECT_EQ(parse_memory_budget("4GB", "k").bytes, 4000000000LL);
  EXPECT_DOUBLE_EQ(parse_memory_budget("0.8", "k").fraction, 0.8);
  EXPECT_DOUBLE_EQ(parse_memory_budget("80%", "k").fraction, 0.8);
  EXPECT_EQ(parse_memory_budget("0.5", "k").bytes_of(100), 50);
  EXPECT_EQ(parse_byte_size("1000000", "k"), 1000000);
  for (const char* bad : {"", "lots", "8 parsecs", "150%", "-1GiB", "0"}) {
    EXPECT_THROW(parse_memory_budget(bad, "run.gpu_memory_budget"), ConfigError) << bad;
  }
  const auto c = parse_config("run: {gpu_memory_budget: 20GiB, host_memory_budget: 4GiB}\n"
                              "text: {encoder: {type: bert, path: m}}\n", "/x");
  EXPECT_EQ(c.run.gpu_memory_budget.bytes, 20LL << 30);
  EXPECT_EQ(c.run.host_memory_budget, 4LL << 30);
  // Budgets change batch sizes only, never what is stored.
  EXPECT_EQ(semantic_config_json(c),
            semantic_config_json(parse_config("text: {encoder: {type: bert, path: m}}\n", "/x")));
}

TEST(ConfigTest, ReferenceConfigParses) {
  const auto c = load_config(std::filesystem::path(PRECOMPUTE_SOURCE_DIR) / "configs/reference.yaml");
  EXPECT_TRUE(c.video.enabled && c.audio.enabled && c.text.enabled);
  EXPECT_DOUBLE_EQ(c.video.fps, 1.0);
}

}  // namespace
}  // namespace precompute
