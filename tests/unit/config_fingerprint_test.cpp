// Pins both JSON forms of the config byte for byte. The semantic form is the fingerprint that
// decides whether an existing output may be resumed: a change here makes every earlier output
// refuse to resume, so a failure of this test is never fixed by updating the strings alone.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "pipeline/core/config.hpp"

namespace precompute {
namespace {

const std::filesystem::path kSources = PRECOMPUTE_SOURCE_DIR;

std::string file_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Parsed against a fixed folder, so that the full form's paths do not depend on the checkout.
Config parsed(const std::string& yaml) { return parse_config(yaml, "/cfg"); }

TEST(ConfigFingerprintTest, DefaultsOfEverySection) {
  const auto c = parsed(
      "video: {encoder: {path: v.pt}, sampling: {fps: 1}}\n"
      "audio: {encoder: {path: a.pt}}\n"
      "text: {encoder: {path: t.pt}}\n");
  EXPECT_EQ(semantic_config_json(c), R"json({"audio":{"dtype":"float32","hop_s":0.0,"normalize":null,"pooling":null,"sample_rate":16000,"type":"torchscript","window_s":0.0},"output":{"dtype":"float16"},"text":{"dtype":"float32","lower_case":null,"max_length":null,"normalize":null,"output_layer":-1,"pooling":null,"strip_accents":null,"tokenize_chinese_chars":null,"type":"torchscript"},"video":{"autorotate":true,"dtype":"float32","fps":1.0,"layout":"frames","mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":null,"num_frames":0,"pooling":null,"resize":"shorter_side_crop","size":[224,224],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
  EXPECT_EQ(full_config_json(c), R"json({"audio":{"batch_size":16,"devices":[],"dtype":"float32","hop_s":0.0,"max_batch_seconds":0,"max_duration_s":14400.0,"normalize":null,"path":"/cfg/a.pt","pooling":null,"sample_rate":16000,"type":"torchscript","window_s":0.0},"input":{"folder":"","manifest":""},"output":{"chunk_rows":256,"dtype":"float16","path":"","shard_size":1024},"run":{"decode_threads":0,"devices":["cpu"],"gpu_memory_budget":0.0,"host_memory_budget":0,"max_failure_fraction":0.5,"max_failures":-1,"max_file_bytes":68719476736,"max_in_flight":0,"sample_timeout_s":600.0,"torch_threads":0},"text":{"batch_size":16,"devices":[],"dtype":"float32","lower_case":null,"max_batch_tokens":0,"max_length":null,"max_text_bytes":1048576,"normalize":null,"output_layer":-1,"path":"/cfg/t.pt","pooling":null,"strip_accents":null,"tokenize_chinese_chars":null,"type":"torchscript","vocab":""},"video":{"autorotate":true,"batch_size":16,"decoder":"auto","devices":[],"dtype":"float32","fps":1.0,"layout":"frames","max_batch_frames":0,"max_decoded_frames":1000000,"max_duration_s":14400.0,"max_frames":4096,"max_pixels":67108864,"mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":null,"num_frames":0,"nvdec_sessions":0,"path":"/cfg/v.pt","pooling":null,"resize":"shorter_side_crop","seek":true,"size":[224,224],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
  EXPECT_EQ(semantic_config_json(Config{}), R"json({"output":{"dtype":"float16"}})json");
  EXPECT_EQ(full_config_json(Config{}), R"json({"input":{"folder":"","manifest":""},"output":{"chunk_rows":256,"dtype":"float16","path":"","shard_size":1024},"run":{"decode_threads":0,"devices":["cpu"],"gpu_memory_budget":0.0,"host_memory_budget":0,"max_failure_fraction":0.5,"max_failures":-1,"max_file_bytes":68719476736,"max_in_flight":0,"sample_timeout_s":600.0,"torch_threads":0}})json");
}

TEST(ConfigFingerprintTest, EveryKeySet) {
  const auto c = parsed(file_text(kSources / "tests/unit/data/every_key_set.yaml"));
  EXPECT_EQ(semantic_config_json(c), R"json({"audio":{"dtype":"float16","hop_s":1.25,"normalize":false,"pooling":"none","sample_rate":22050,"type":"torchscript","window_s":2.5},"output":{"dtype":"float32","keep_columns":["label","split"]},"text":{"dtype":"float16","lower_case":false,"max_length":77,"normalize":true,"output_layer":4,"pooling":"max","strip_accents":true,"tokenize_chinese_chars":false,"type":"bert"},"video":{"autorotate":false,"dtype":"bfloat16","fps":0.0,"layout":"clips","mean":[0.10000000149011612,0.20000000298023224,0.30000001192092896],"normalize":true,"num_frames":6,"pooling":"model","resize":"stretch","size":[96,128],"std":[0.4000000059604645,0.5,0.6000000238418579],"type":"torchscript"}})json");
  EXPECT_EQ(full_config_json(c), R"json({"audio":{"batch_size":7,"devices":["cpu"],"dtype":"float16","hop_s":1.25,"max_batch_seconds":600,"max_duration_s":1800.0,"normalize":false,"path":"/cfg/models/a.pt","pooling":"none","sample_rate":22050,"type":"torchscript","window_s":2.5},"input":{"folder":"/cfg/media/","manifest":""},"output":{"chunk_rows":17,"dtype":"float32","keep_columns":["label","split"],"path":"/cfg/out/","shard_size":99},"run":{"decode_threads":3,"devices":["cuda:0","cuda:3"],"gpu_memory_budget":3221225472,"host_memory_budget":536870912,"max_failure_fraction":0.025,"max_failures":-1,"max_file_bytes":123456789,"max_in_flight":77,"sample_timeout_s":33.5,"torch_threads":5},"text":{"batch_size":64,"devices":["cuda:2"],"dtype":"float16","lower_case":false,"max_batch_tokens":9000,"max_length":77,"max_text_bytes":5000,"normalize":true,"output_layer":4,"path":"/cfg/models/bert","pooling":"max","strip_accents":true,"tokenize_chinese_chars":false,"type":"bert","vocab":"/cfg/models/vocab.txt"},"video":{"autorotate":false,"batch_size":5,"decoder":"nvdec","devices":["cuda:1"],"dtype":"bfloat16","fps":0.0,"layout":"clips","max_batch_frames":300,"max_decoded_frames":4000,"max_duration_s":99.5,"max_frames":500,"max_pixels":1000000,"mean":[0.10000000149011612,0.20000000298023224,0.30000001192092896],"normalize":true,"num_frames":6,"nvdec_sessions":2,"path":"/cfg/models/v.pt","pooling":"model","resize":"stretch","seek":false,"size":[96,128],"std":[0.4000000059604645,0.5,0.6000000238418579],"type":"torchscript"}})json");
}

TEST(ConfigFingerprintTest, ReferenceConfigAsOfTheTableRefactor) {
  const auto c = parsed(file_text(kSources / "tests/unit/data/reference_at_fcd3c1a.yaml"));
  EXPECT_EQ(semantic_config_json(c), R"json({"audio":{"dtype":"float32","hop_s":0.0,"normalize":false,"pooling":"mean","sample_rate":16000,"type":"torchscript","window_s":0.0},"output":{"dtype":"float16"},"text":{"dtype":"bfloat16","lower_case":true,"max_length":128,"normalize":false,"output_layer":-1,"pooling":"mean","strip_accents":null,"tokenize_chinese_chars":true,"type":"bert"},"video":{"autorotate":true,"dtype":"float32","fps":1.0,"layout":"frames","mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":false,"num_frames":0,"pooling":"mean","resize":"shorter_side_crop","size":[224,224],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
  EXPECT_EQ(full_config_json(c), R"json({"audio":{"batch_size":16,"devices":[],"dtype":"float32","hop_s":0.0,"max_batch_seconds":0,"max_duration_s":14400.0,"normalize":false,"path":"/cfg/models/audio.pt","pooling":"mean","sample_rate":16000,"type":"torchscript","window_s":0.0},"input":{"folder":"","manifest":"/cfg/data/manifest.jsonl"},"output":{"chunk_rows":256,"dtype":"float16","path":"/cfg/out/","shard_size":1024},"run":{"decode_threads":0,"devices":["cpu"],"gpu_memory_budget":0.0,"host_memory_budget":0,"max_failure_fraction":-1.0,"max_failures":-1,"max_file_bytes":68719476736,"max_in_flight":0,"sample_timeout_s":600.0,"torch_threads":0},"text":{"batch_size":1024,"devices":["cuda:0"],"dtype":"bfloat16","lower_case":true,"max_batch_tokens":65536,"max_length":128,"max_text_bytes":1048576,"normalize":false,"output_layer":-1,"path":"/cfg/models/bge-small-en-v1.5","pooling":"mean","strip_accents":null,"tokenize_chinese_chars":true,"type":"bert","vocab":"/cfg/models/vocab.txt"},"video":{"autorotate":true,"batch_size":16,"decoder":"cpu","devices":["cuda:0"],"dtype":"float32","fps":1.0,"layout":"frames","max_batch_frames":0,"max_decoded_frames":1000000,"max_duration_s":14400.0,"max_frames":4096,"max_pixels":67108864,"mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":false,"num_frames":0,"nvdec_sessions":4,"path":"/cfg/models/video.pt","pooling":"mean","resize":"shorter_side_crop","seek":true,"size":[224,224],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
}

TEST(ConfigFingerprintTest, DemoConfig) {
  const auto c = parsed(file_text(kSources / "configs/demo.yaml"));
  EXPECT_EQ(semantic_config_json(c), R"json({"audio":{"dtype":"float32","hop_s":0.5,"normalize":null,"pooling":"mean","sample_rate":16000,"type":"torchscript","window_s":1.0},"output":{"dtype":"float16"},"text":{"dtype":"float32","lower_case":null,"max_length":null,"normalize":null,"output_layer":-1,"pooling":null,"strip_accents":null,"tokenize_chinese_chars":null,"type":"bert"},"video":{"autorotate":true,"dtype":"float32","fps":1.0,"layout":"frames","mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":null,"num_frames":0,"pooling":"none","resize":"shorter_side_crop","size":[112,112],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
  EXPECT_EQ(full_config_json(c), R"json({"audio":{"batch_size":16,"devices":[],"dtype":"float32","hop_s":0.5,"max_batch_seconds":0,"max_duration_s":14400.0,"normalize":null,"path":"/build/demo/models/audio_demo.pt","pooling":"mean","sample_rate":16000,"type":"torchscript","window_s":1.0},"input":{"folder":"","manifest":"/build/demo/data/manifest.jsonl"},"output":{"chunk_rows":256,"dtype":"float16","path":"/build/demo/out","shard_size":16},"run":{"decode_threads":0,"devices":["cpu"],"gpu_memory_budget":0.0,"host_memory_budget":0,"max_failure_fraction":-1.0,"max_failures":5,"max_file_bytes":68719476736,"max_in_flight":0,"sample_timeout_s":600.0,"torch_threads":0},"text":{"batch_size":32,"devices":[],"dtype":"float32","lower_case":null,"max_batch_tokens":0,"max_length":null,"max_text_bytes":1048576,"normalize":null,"output_layer":-1,"path":"/build/demo/models/all-MiniLM-L6-v2","pooling":null,"strip_accents":null,"tokenize_chinese_chars":null,"type":"bert","vocab":""},"video":{"autorotate":true,"batch_size":16,"decoder":"auto","devices":[],"dtype":"float32","fps":1.0,"layout":"frames","max_batch_frames":0,"max_decoded_frames":1000000,"max_duration_s":14400.0,"max_frames":4096,"max_pixels":67108864,"mean":[0.48500001430511475,0.4560000002384186,0.4059999883174896],"normalize":null,"num_frames":0,"nvdec_sessions":0,"path":"/build/demo/models/video_demo.pt","pooling":"none","resize":"shorter_side_crop","seek":true,"size":[112,112],"std":[0.2290000021457672,0.2240000069141388,0.22499999403953552],"type":"torchscript"}})json");
}

}  // namespace
}  // namespace precompute
