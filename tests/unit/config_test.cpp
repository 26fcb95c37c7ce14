#include "pipeline/core/config.hpp"

#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

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

TEST(ConfigTest, VideoDecoderChoices) {
  const std::string base = "video: {encoder: {path: v.pt}, sampling: {fps: 1}";
  EXPECT_EQ(parse_config(base + "}\n", "/x").video.decoder, VideoDecoderKind::kAuto);
  EXPECT_EQ(parse_config(base + ", decoder: auto}\n", "/x").video.decoder,
            VideoDecoderKind::kAuto);
  EXPECT_EQ(parse_config(base + "}\n", "/x").video.nvdec_sessions, 0);  // two per engine
  EXPECT_EQ(parse_config(base + ", decoder: cpu}\n", "/x").video.decoder, VideoDecoderKind::kCpu);
  const Config nvdec = parse_config(base + ", decoder: nvdec, nvdec_sessions: 7}\n", "/x");
  EXPECT_EQ(nvdec.video.decoder, VideoDecoderKind::kNvdec);
  EXPECT_EQ(nvdec.video.nvdec_sessions, 7);
  const auto e = error_of("video: {decoder: gpu}");
  EXPECT_NE(e.find("'video.decoder' is 'gpu'"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, cpu, nvdec"), std::string::npos) << e;
  // Where frames are decoded is not what they mean: a resume may switch decoders.
  EXPECT_EQ(semantic_config_json(parse_config(base + ", decoder: cpu}\n", "/x")),
            semantic_config_json(parse_config(base + ", decoder: nvdec}\n", "/x")));
}

TEST(ConfigTest, DevicesAndChoicesAreShownWithoutCuttingOrOverflowing) {
  const auto validate_error = [](const std::string& yaml) -> std::string {
    try {
      validate(parse_config(yaml, "/x"));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string video =
      "input: {manifest: m.jsonl}\noutput: {path: out}\n"
      "video: {encoder: {path: " + std::string(PRECOMPUTE_SOURCE_DIR) +
      "/CMakeLists.txt}, sampling: {fps: 1}, device: ";
  // A device listed twice: the run would load one encoder there all the same.
  for (const char* twice : {"[cuda:0, cuda:1, cuda:0]", "[cpu, cpu]", "[cuda:7, cuda:007]"}) {
    const auto refused = validate_error(video + std::string(twice) + "}\n");
    EXPECT_NE(refused.find("' twice; list each device once"), std::string::npos)
        << twice << refused;
    EXPECT_NE(refused.find("'video.device'"), std::string::npos) << refused;
  }
  EXPECT_EQ(validate_error(video + "[cuda:0, cuda:10, cuda:1]}\n").find("twice"),
            std::string::npos);
  EXPECT_EQ(validate_error(video + "[cuda, cuda:1]}\n").find("twice"), std::string::npos);
  EXPECT_NE(validate_error("run: {device: [cpu, cpu]}\n" + video + "cpu}\n")
                .find("'run.device' lists"),
            std::string::npos);
  // Past an int: refused as a device, not an overflow later.
  auto e = validate_error(video + "'cuda:99999999999'}\n");
  EXPECT_NE(e.find("has device 'cuda:99999999999'; use cpu, cuda or cuda:N"), std::string::npos)
      << e;
  EXPECT_EQ(validate_error(video + "'cuda:9999'}\n").find("has device"), std::string::npos);
  // A NUL is shown, and the message goes on past it.
  e = validate_error(video + "\"cuda:1\\0\"}\n");
  EXPECT_NE(e.find("'cuda:1\\x00'; use cpu"), std::string::npos) << e;
  e = error_of("video: {decoder: \"cpu\\0\"}");
  EXPECT_NE(e.find("is 'cpu\\x00'; use one of: auto, cpu, nvdec"), std::string::npos) << e;
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
  o.set("--device", "cpu");
  o.set("--batch-size", 9);
  o.set("--output", "relative-out");
  o.set("--max-failures", "12");
  apply_overrides(c, o);
  EXPECT_EQ(c.devices_for(Modality::kVideo), std::vector<std::string>{"cpu"});
  EXPECT_EQ(c.video.batch_size, 9);
  EXPECT_TRUE(c.output.path.is_absolute());
  EXPECT_EQ(c.run.max_failures, 12);
  EXPECT_LT(c.run.max_failure_fraction, 0);
}

TEST(ConfigTest, MaxFailuresAcceptsCountsAndPercentages) {
  RunSection run;
  // The default: more than half (Note [The default failure limit] in pipeline/runner.cpp).
  EXPECT_EQ(run.max_failures, -1);
  EXPECT_DOUBLE_EQ(run.max_failure_fraction, 0.5);
  parse_max_failures("-1", run);
  EXPECT_EQ(run.max_failures, -1);
  EXPECT_LT(run.max_failure_fraction, 0);  // no limit at all
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

// One numeric key put through its boundaries: `format` is how a value is written at `set`
// ("%" stands for it), `accepted` the probes and values that must pass, `refused` values just
// past the range. A refusal must name the key, its flag and the range's `mentions`.
struct BoundCase {
  std::string key;
  std::string set;
  std::string format;
  std::vector<std::string> accepted;
  std::vector<std::string> refused;
  std::string mentions;
  std::string flag;
};

// Zero, negative, beyond every type, and what YAML spells as infinities and NaN.
const std::vector<std::string> kProbes = {"0",     "-1",   "1e10",  "99999999999",
                                          "1e300", ".inf", "-.inf", ".nan"};

// A valid config with every modality, whose one node `path` (dotted) is replaced by `value`.
std::string bound_config(const std::string& path, const std::string& value) {
  const auto sources = std::string(PRECOMPUTE_SOURCE_DIR);
  YAML::Node root = YAML::Load(
      "input: {manifest: m.jsonl}\n"
      "output: {path: out}\n"
      "run: {}\n"
      "video: {encoder: {path: " + sources + "/CMakeLists.txt}, sampling: {fps: 1}}\n"
      "audio: {encoder: {path: " + sources + "/CMakeLists.txt}, window_s: 1}\n"
      "text: {encoder: {type: bert, path: " + sources + "}, tokenizer: {}}\n");
  std::vector<std::string> parts;
  std::stringstream dotted(path);
  for (std::string part; std::getline(dotted, part, '.');) parts.push_back(part);
  // Assigning one YAML::Node to another writes through to what the first refers to (here the
  // whole document), so the walk down rebinds with reset().
  YAML::Node node = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) node.reset(node[parts[i]]);
  node[parts.back()] = YAML::Load(value);
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

std::string validate_error(const std::string& yaml) {
  try {
    validate(parse_config(yaml, "/base"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, EveryNumericKeyRefusesValuesOutsideItsRangeNamingItAndTheRange) {
  const std::vector<BoundCase> cases = {
      {"output.shard_size", "output.shard_size", "%", {"1", "1000000000"}, {"1000000001"},
       "1000000000", "--shard-size"},
      {"output.chunk_rows", "output.chunk_rows", "%", {"1", "1048576"}, {"1048577"}, "1048576", ""},
      {"run.decode_threads", "run.decode_threads", "%", {"0", "1024"}, {"1025", "100000"},
       "1024", "--decode-threads"},
      {"run.torch_threads", "run.torch_threads", "%", {"0", "1024"}, {"1025"}, "1024",
       "--torch-threads"},
      {"run.max_in_flight", "run.max_in_flight", "%", {"0", "1000000"}, {"1000001"}, "1000000", ""},
      {"run.progress_interval_s", "run.progress_interval_s", "%", {"0", "0.001", "86400"},
       {"86400.5", "0.0001", "1e-300"}, "86400", "--progress-interval"},
      {"run.sample_timeout_s", "run.sample_timeout_s", "%", {"0.5", "604800"}, {"604801"},
       "604800", ""},
      {"run.max_file_bytes", "run.max_file_bytes", "%", {"1", "99999999999", "1125899906842624"},
       {"1125899906842625"}, "1125899906842624", ""},
      {"run.max_restarts", "run.max_restarts", "%", {"0", "1000"}, {"1001"}, "1000", ""},
      {"run.max_failures", "run.max_failures", "%", {"0", "-1", "99999999999", "100%"},
       {"-2", "101%", "1e10%", ".nan%"}, "100%", "--max-failures"},
      {"run.host_memory_budget", "run.host_memory_budget", "%", {"0", "1e10", "99999999999"},
       {"1e19"}, "GiB", ""},
      {"run.gpu_memory_budget", "run.gpu_memory_budget", "%", {"1e10", "99999999999", "0.5"},
       {"101%"}, "GiB", ""},
      {"video.batch_size", "video.batch_size", "%", {"1", "65536"}, {"65537"}, "65536",
       "--batch-size"},
      {"audio.batch_size", "audio.batch_size", "%", {"65536"}, {"65537"}, "65536", "--batch-size"},
      {"text.batch_size", "text.batch_size", "%", {"65536"}, {"65537"}, "65536", "--batch-size"},
      // fps 0 reads as "no fps": the refusal then names the sampling section and both ranges.
      {"video.sampling", "video.sampling", "{fps: %}", {"0.001", "1000"},
       {"1000.5", "0.0009", "1e-300"}, "1000", ""},
      {"video.sampling", "video.sampling", "{num_frames: %}", {"1", "100000"}, {"100001"},
       "100000", ""},
      {"video.size", "video.size", "[%, 224]", {"8", "4096"}, {"7", "4097"}, "4096", ""},
      {"video.size", "video.size", "%", {"8", "4096"}, {"7", "4097"}, "4096", ""},
      {"video.mean", "video.mean", "[0.5, %, 0.5]", {"0", "-1", "1000000"}, {"1000001"},
       "1000000", ""},
      {"video.std", "video.std", "[0.5, 0.5, %]", {"1e-3", "1000000"}, {"1000001", "1e-300"},
       "1000000", ""},
      {"video.max_batch_frames", "video.max_batch_frames", "%", {"0", "1000000000"},
       {"1000000001"}, "1000000000", ""},
      {"video.max_duration_s", "video.max_duration_s", "%", {"0.5", "2592000"}, {"2592001"},
       "2592000", ""},
      {"video.max_frames", "video.max_frames", "%", {"1", "1000000"}, {"1000001"}, "1000000", ""},
      {"video.decoder_threads", "video.decoder_threads", "%", {"0", "64"}, {"65"}, "64", ""},
      {"video.max_pixels", "video.max_pixels", "%", {"1", "99999999999", "1000000000000"},
       {"1000000000001"}, "1000000000000", ""},
      {"video.max_decoded_frames", "video.max_decoded_frames", "%",
       {"1", "99999999999", "1000000000000"}, {"1000000000001"}, "1000000000000", ""},
      {"video.nvdec_sessions", "video.nvdec_sessions", "%", {"0", "1", "64"}, {"-1", "65"}, "64", ""},
      {"audio.sample_rate", "audio.sample_rate", "%", {"1000", "384000"}, {"999", "384001"},
       "384000", ""},
      {"audio.window_s", "audio.window_s", "%", {"0", "0.5", "86400"}, {"86401", "1e-300"},
       "86400", ""},
      {"audio.hop_s", "audio.hop_s", "%", {"0", "0.5", "86400"}, {"86401", "1e-300"}, "86400", ""},
      {"audio.max_batch_seconds", "audio.max_batch_seconds", "%", {"0", "2592000"}, {"2592001"},
       "2592000", ""},
      {"audio.max_duration_s", "audio.max_duration_s", "%", {"0.5", "2592000"}, {"2592001"},
       "2592000", ""},
      {"text.max_batch_tokens", "text.max_batch_tokens", "%", {"0", "1000000000"},
       {"1000000001"}, "1000000000", ""},
      {"text.tokenizer.max_length", "text.tokenizer.max_length", "%", {"3", "65536"},
       {"2", "65537"}, "65536", ""},
      {"text.output_layer", "text.output_layer", "%", {"-1", "0", "1000"}, {"-2", "1001"},
       "1000", ""},
      {"text.max_text_bytes", "text.max_text_bytes", "%", {"1", "1073741824"}, {"1073741825"},
       "1073741824", ""},
  };
  ASSERT_EQ(validate_error(bound_config("run.decode_threads", "0")), "");
  for (const auto& c : cases) {
    const auto config = [&](const std::string& value) {
      auto text = c.format;
      text.replace(text.find('%'), 1, value);
      return bound_config(c.set, text);
    };
    std::vector<std::string> refused = c.refused;
    for (const auto& probe : kProbes) {
      if (std::find(c.accepted.begin(), c.accepted.end(), probe) == c.accepted.end()) {
        refused.push_back(probe);
      }
    }
    for (const auto& value : c.accepted) {
      EXPECT_EQ(validate_error(config(value)), "") << c.key << ": " << value;
    }
    for (const auto& value : refused) {
      const auto e = validate_error(config(value));
      EXPECT_NE(e.find("'" + c.key), std::string::npos)
          << c.key << ": " << value << " gave: '" << e << "'";
      EXPECT_NE(e.find(c.mentions), std::string::npos)
          << c.key << ": " << value << " should give the range (" << c.mentions << "): " << e;
      if (!c.flag.empty()) {
        EXPECT_NE(e.find(c.flag), std::string::npos) << c.key << ": " << value << ": " << e;
      }
    }
  }
}

TEST(ConfigTest, FlagValuesAreCheckedByValidate) {
  const auto refusal = [](const std::function<void(Config&)>& change) {
    auto c = parse_config(bound_config("run.decode_threads", "0"), "/base");
    change(c);
    try {
      validate(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refusal([](Config& c) { c.run.progress_interval_s = 1e10; })
                .find("--progress-interval"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.run.progress_interval_s = 1e300; })
                .find("run.progress_interval_s"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.run.sample_timeout_s = INFINITY; })
                .find("run.sample_timeout_s"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.run.progress_interval_s = NAN; })
                .find("run.progress_interval_s"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.video.fps = NAN; }).find("video.sampling"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.video.mean[1] = NAN; }).find("video.mean"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.audio.hop_s = NAN; }).find("audio.hop_s"),
            std::string::npos);
  EXPECT_NE(refusal([](Config& c) { c.text.max_length = 2; }).find("text.tokenizer.max_length"),
            std::string::npos);
  ConfigOverrides o;
  o.set("--decode-threads", 100000);
  EXPECT_NE(refusal([&](Config& c) { apply_overrides(c, o); }).find("--decode-threads"),
            std::string::npos);
  o = {};
  o.set("--batch-size", 1 << 20);
  EXPECT_NE(refusal([&](Config& c) { apply_overrides(c, o); }).find("--batch-size"),
            std::string::npos);
  o = {};
  o.set("--shard-size", int64_t{INT64_MAX});
  EXPECT_NE(refusal([&](Config& c) { apply_overrides(c, o); }).find("--shard-size"),
            std::string::npos);
  EXPECT_EQ(refusal([](Config& c) { c.run.progress_interval_s = 0.001; }), "");
}

// output.keep_columns (Note [Kept columns]): a list of names, read, checked and written by the
// table's NameList kind, and the rules of validate() for the names a manifest column may have.
TEST(ConfigTest, KeepColumnsIsAListOfNamesCheckedBeforeAnyWork) {
  const auto with = [](const std::string& value) {
    return bound_config("output.keep_columns", value);
  };
  EXPECT_EQ(parse_config(with("[label, split]"), "/b").output.keep_columns.names,
            (std::vector<std::string>{"label", "split"}));
  EXPECT_TRUE(parse_config(with("[]"), "/b").output.keep_columns.empty());
  EXPECT_TRUE(parse_config(with("null"), "/b").output.keep_columns.empty());
  EXPECT_EQ(validate_error(with("[label, split, \"caf\u00e9\", \"50%\", \"a b\"]")), "");
  EXPECT_EQ(validate_error(with("[]")), "");

  const auto refused = [&](const std::string& value, const std::string& part) {
    std::string message;
    try {
      validate(parse_config(with(value), "/b"));
    } catch (const ConfigError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(part), std::string::npos) << value << ": " << message;
  };
  refused("label", "must be a list of names");
  refused("{a: 1}", "must be a list of names");
  refused("[[a]]", "output.keep_columns[0]");
  refused("[label, \"\"]", "output.keep_columns[1]' is an empty name");
  refused("[label, split, label]", "names 'label' twice");
  refused("[\"a\\0b\"]", "NUL");
  refused("[id]", "the manifest's own columns");
  refused("[Text]", "the manifest's own columns");
  refused("[video]", "the manifest's own columns");
  refused("[audio]", "the manifest's own columns");
  refused("[a/b]", "cannot hold '/'");
  refused("[\".\"]", "cannot hold '/'");
  refused("[\"..\"]", "cannot hold '/'");
  refused("[" + std::string(kMaxNameBytes + 1, 'x') + "]", "bytes long");
  std::string many = "[";
  for (size_t i = 0; i <= kMaxListedNames; ++i) many += (i ? ", c" : "c") + std::to_string(i);
  refused(many + "]", "at most 1024");
  // Bytes that are not UTF-8 reach the list only from a file's raw bytes.
  auto c = parse_config(with("[label]"), "/b");
  c.output.keep_columns.names = {"caf\xE9"};
  try {
    validate(c);
    ADD_FAILURE() << "a name that is not UTF-8 must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
  }
  // A folder input has no columns.
  c = parse_config(with("[label]"), "/b");
  c.input = {};
  c.input.folder = "/media";
  try {
    validate(c);
    ADD_FAILURE() << "kept columns of a folder input must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a manifest"), std::string::npos) << e.what();
  }
}

// input.tars: one path or a list of them, each resolved against the config's folder; one path
// is written back as a path, so that configs recorded before lists were allowed read the same.
TEST(ConfigTest, TarInputIsAPathOrAListOfPaths) {
  const auto tars_of = [](const std::string& value) {
    return parse_config("input: {tars: " + value + "}\noutput: {path: out}\n", "/b").input.tars;
  };
  EXPECT_EQ(tars_of("\"s/{000..009}.tar\"").paths,
            (std::vector<std::filesystem::path>{"/b/s/{000..009}.tar"}));
  EXPECT_EQ(tars_of("[a.tar, /d/shards, \"x/{0..3}.tar\"]").paths,
            (std::vector<std::filesystem::path>{"/b/a.tar", "/d/shards", "/b/x/{0..3}.tar"}));
  EXPECT_EQ(tars_of("[a.tar]"), tars_of("a.tar"));
  EXPECT_EQ(tars_of("[a.tar, b.tar]").text(), "/b/a.tar, /b/b.tar");

  Config one = parse_config("input: {tars: [a.tar]}\noutput: {path: out}\n", "/b");
  const std::string recorded_one = full_config_json(one);
  EXPECT_NE(recorded_one.find("\"tars\":\"/b/a.tar\""), std::string::npos) << recorded_one;
  Config two = parse_config("input: {tars: [a.tar, b.tar]}\noutput: {path: out}\n", "/b");
  const std::string recorded_two = full_config_json(two);
  EXPECT_NE(recorded_two.find("\"tars\":[\"/b/a.tar\",\"/b/b.tar\"]"), std::string::npos)
      << recorded_two;

  const auto refused = [](const std::string& value, const std::string& part) {
    const std::string message =
        validate_error("input: {tars: " + value + "}\noutput: {path: out}\n");
    EXPECT_NE(message.find(part), std::string::npos) << value << ": " << message;
  };
  refused("[]", "'input.tars' lists no path");
  refused("\"\"", "'input.tars' is empty; give a path");
  refused("[a.tar, \"\"]", "'input.tars[1]' is empty; give a path");
  refused("[[a.tar]]", "input.tars[0]");
  refused("{a: b}", "input.tars");
  refused("[a.tar, \"b\\0.tar\"]", "input.tars[1] contains a NUL character");
  refused("\"b\\0.tar\"", "input.tars contains a NUL character");
  EXPECT_NE(validate_error("input: {tars: [a.tar], manifest: m.jsonl}\noutput: {path: out}\n")
                .find("give exactly one input"),
            std::string::npos);
}

TEST(ConfigTest, KeepColumnsFlagIsCommaSeparatedAndEntersTheFingerprintOnlyWhenSet) {
  auto c = parse_config("output: {keep_columns: [a]}\nvideo: {encoder: {path: v.pt}, "
                        "sampling: {fps: 1}}\n", "/b");
  const auto without = parse_config("video: {encoder: {path: v.pt}, sampling: {fps: 1}}\n", "/b");
  EXPECT_NE(semantic_config_json(c), semantic_config_json(without));
  EXPECT_NE(semantic_config_json(c).find(R"("keep_columns":["a"])"), std::string::npos);
  EXPECT_EQ(semantic_config_json(without).find("keep_columns"), std::string::npos);
  EXPECT_EQ(full_config_json(without).find("keep_columns"), std::string::npos);
  ConfigOverrides o;
  o.set("--keep-columns", std::string("label,split"));
  apply_overrides(c, o);
  EXPECT_EQ(c.output.keep_columns.names, (std::vector<std::string>{"label", "split"}));
  o.set("--keep-columns", std::string(""));
  apply_overrides(c, o);
  EXPECT_TRUE(c.output.keep_columns.empty());
  EXPECT_EQ(semantic_config_json(c), semantic_config_json(without));
  o.set("--keep-columns", std::string("label,,split"));
  apply_overrides(c, o);
  c.input.manifest = "/m.jsonl";
  c.output.path = "/out";
  c.video.encoder.path = std::string(PRECOMPUTE_SOURCE_DIR) + "/CMakeLists.txt";
  try {
    validate(c);
    ADD_FAILURE() << "an empty name from the flag must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--keep-columns"), std::string::npos) << e.what();
  }
}

TEST(ConfigTest, ReferenceConfigParses) {
  const auto c = load_config(std::filesystem::path(PRECOMPUTE_SOURCE_DIR) / "configs/reference.yaml");
  EXPECT_TRUE(c.video.enabled && c.audio.enabled && c.text.enabled);
  EXPECT_DOUBLE_EQ(c.video.fps, 1.0);
}

}  // namespace
}  // namespace precompute

namespace precompute {
namespace {

// The flags of `precompute run` come from the key table: the same names, and the same value
// types CLI11 parses them as, as when run_command.cpp declared them by hand.
TEST(ConfigTest, FlagsOfRunAreTheTablesWithTheirValueTypes) {
  std::vector<std::pair<std::string, FlagKind>> flags;
  for (const auto& f : config_flags()) flags.emplace_back(std::string(f.names), f.kind);
  const std::vector<std::pair<std::string, FlagKind>> want = {
      {"-i,--input", FlagKind::kText},          {"-o,--output", FlagKind::kText},
      {"--shard-size", FlagKind::kInt64},       {"--keep-columns", FlagKind::kText},
      {"--overwrite", FlagKind::kSwitch},
      {"--retry-failed", FlagKind::kSwitch},    {"--device", FlagKind::kText},
      {"--decode-threads", FlagKind::kInt},     {"--torch-threads", FlagKind::kInt},
      {"--max-failures", FlagKind::kText},      {"--progress-interval", FlagKind::kDouble},
      {"--log-level", FlagKind::kText},         {"--summary-json", FlagKind::kText},
      {"--metrics-file", FlagKind::kText},      {"--no-supervisor", FlagKind::kSwitch},
      {"--gpu-memory-budget", FlagKind::kText}, {"--host-memory-budget", FlagKind::kText},
      {"--batch-size", FlagKind::kInt},
  };
  EXPECT_EQ(flags, want);
}

// Where a run reports is not what it stores: a resume may change the files, and the record kept
// with the output does not name them.
TEST(ConfigTest, ReportFilesResolveAgainstTheConfigAndAreRecordedNowhere) {
  auto c = parse_config("run: {summary_json: reports/s.json, metrics_file: /m/x.prom}\n", "/b");
  EXPECT_EQ(c.run.summary_json, "/b/reports/s.json");
  EXPECT_EQ(c.run.metrics_file, "/m/x.prom");
  EXPECT_EQ(full_config_json(c).find("summary_json"), std::string::npos);
  EXPECT_EQ(full_config_json(c).find("metrics_file"), std::string::npos);
  EXPECT_EQ(semantic_config_json(c), semantic_config_json(parse_config("{}", "/b")));
  c = parse_config("run: {summary_json: null, metrics_file: null}\n", "/b");
  EXPECT_TRUE(c.run.summary_json.empty() && c.run.metrics_file.empty());
  ConfigOverrides o;
  o.set("--summary-json", std::string("here.json"));
  apply_overrides(c, o);
  EXPECT_EQ(c.run.summary_json, std::filesystem::absolute("here.json").lexically_normal());
}

TEST(ConfigTest, SwitchesAndTextFlagsApplyAsTheyDid) {
  auto c = parse_config("run: {supervise: true}\noutput: {overwrite: false}\n", "/b");
  ConfigOverrides o;
  o.set("--no-supervisor", true);
  o.set("--overwrite", true);
  o.set("--retry-failed", false);  // a switch not given leaves the file's value
  o.set("--host-memory-budget", std::string("4GiB"));
  o.set("--gpu-memory-budget", std::string("0.5"));
  o.set("--max-failures", std::string("2.5%"));
  apply_overrides(c, o);
  EXPECT_FALSE(c.run.supervise);
  EXPECT_TRUE(c.output.overwrite);
  EXPECT_FALSE(c.output.retry_failed);
  EXPECT_EQ(c.run.host_memory_budget, 4LL << 30);
  EXPECT_DOUBLE_EQ(c.run.gpu_memory_budget.fraction, 0.5);
  EXPECT_DOUBLE_EQ(c.run.max_failure_fraction, 0.025);
  o = {};
  o.set("--host-memory-budget", std::string("0"));
  EXPECT_THROW(apply_overrides(c, o), ConfigError);  // as before: the flag takes a size only
}

}  // namespace
}  // namespace precompute
