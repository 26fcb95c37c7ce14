// SafetensorsFile and SafetensorsWeights on files written here byte by byte, so that every rule
// of Note [What a valid safetensors file is] (encoders/bert/safetensors_file.cpp) has a file that
// breaks it. A real checkpoint is read in model_folder_test.cpp.

#include "encoders/bert/safetensors_file.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using std::filesystem::path;

template <class T>
std::string bytes_of(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;  // little-endian: the hosts we build on are
}

std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A file made of `length` (by default the header's size), `header`, then `buffer`.
void write_raw(const path& file, const std::string& header, const std::string& buffer,
               std::optional<uint64_t> length = std::nullopt) {
  std::ofstream out(file, std::ios::binary);
  out << u64_le(length.value_or(header.size())) << header << buffer;
  ASSERT_TRUE(out.good()) << file;
}

void write_file(const path& file, const std::string& contents) {
  std::ofstream out(file, std::ios::binary);
  out << contents;
  ASSERT_TRUE(out.good()) << file;
}

struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// A valid file holding `tensors` packed in the order given, its header padded with spaces to a
// multiple of 8 bytes as Hugging Face's writer does.
void write_safetensors(const path& file, const std::vector<TensorSpec>& tensors,
                       const std::string& metadata_json = "") {
  std::string header = "{";
  std::string buffer;
  if (!metadata_json.empty()) header += "\"__metadata__\":" + metadata_json;
  for (const TensorSpec& t : tensors) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t dim : t.shape) {
      if (!shape.empty()) shape += ",";
      shape += std::to_string(dim);
    }
    const std::string begin = std::to_string(buffer.size());
    const std::string end = std::to_string(buffer.size() + t.bytes.size());
    header.append("\"").append(t.name).append("\":{\"dtype\":\"").append(t.dtype);
    header.append("\",\"shape\":[").append(shape).append("],\"data_offsets\":[");
    header.append(begin).append(",").append(end).append("]}");
    buffer += t.bytes;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  write_raw(file, header, buffer);
}

std::string open_error(const path& file) {
  try {
    SafetensorsFile opened(file);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "no error";
}

template <class Make>
std::string model_error(Make&& make) {
  try {
    make();
  } catch (const ModelError& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string data_of(const SafetensorsTensor& tensor) {
  return std::string(static_cast<const char*>(tensor.data), tensor.bytes);
}

TEST(SafetensorsFile, ReadsEveryDtypeAndShapeBackAsWritten) {
  testing::TempDir dir;
  const path file = dir / "t.safetensors";
  const std::vector<TensorSpec> specs = {
      {"f32", "F32", {2, 3}, bytes_of<float>({1, 2, 3, 4, 5, 6.5f})},
      {"f64", "F64", {1}, bytes_of<double>({-2.25})},
      {"f16", "F16", {2}, bytes_of<uint16_t>({0x3c00, 0xc000})},
      {"bf16", "BF16", {2, 1}, bytes_of<uint16_t>({0x3f80, 0x4000})},
      {"i64", "I64", {1, 3}, bytes_of<int64_t>({-1, 0, int64_t{1} << 40})},
      {"scalar", "I32", {}, bytes_of<int32_t>({42})},
      {"i16", "I16", {2}, bytes_of<int16_t>({-7, 7})},
      {"i8", "I8", {3}, bytes_of<int8_t>({-1, 0, 1})},
      {"u8", "U8", {2, 2}, bytes_of<uint8_t>({1, 2, 3, 255})},
      {"mask", "BOOL", {3}, bytes_of<uint8_t>({1, 0, 1})},
      {"empty", "F32", {0, 5}, ""},
      {"fp8", "F8_E4M3", {2}, bytes_of<uint8_t>({0x38, 0x40})},
  };
  write_safetensors(file, specs, R"({"format":"pt","note":"test"})");

  const SafetensorsFile opened(file);
  EXPECT_EQ(opened.path(), file);
  ASSERT_EQ(opened.tensors().size(), specs.size());
  const std::vector<std::string> expected_names = {"bf16", "empty", "f16", "f32",  "f64",    "fp8",
                                                   "i16",  "i64",   "i8",  "mask", "scalar", "u8"};
  EXPECT_EQ(opened.names(), expected_names);
  for (const TensorSpec& spec : specs) {
    SCOPED_TRACE(spec.name);
    const SafetensorsTensor* tensor = opened.find(spec.name);
    ASSERT_NE(tensor, nullptr);
    EXPECT_EQ(tensor->name, spec.name);
    EXPECT_EQ(safetensors_dtype_name(tensor->dtype), spec.dtype);
    EXPECT_EQ(tensor->shape, spec.shape);
    EXPECT_EQ(tensor->bytes, spec.bytes.size());
    EXPECT_EQ(static_cast<size_t>(tensor->numel()) * safetensors_dtype_size(tensor->dtype),
              spec.bytes.size());
    EXPECT_EQ(data_of(*tensor), spec.bytes);
  }
  EXPECT_EQ(opened.find("scalar")->numel(), 1);
  EXPECT_EQ(opened.find("empty")->numel(), 0);
  EXPECT_EQ(opened.find("f32")->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ(opened.find("fp8")->dtype, SafetensorsDtype::kF8E4M3);
  EXPECT_EQ(opened.find("missing"), nullptr);
  EXPECT_EQ(opened.find("f3"), nullptr);
  EXPECT_EQ(opened.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "test"}}));
}

TEST(SafetensorsFile, ViewsSurviveMovingTheFile) {
  testing::TempDir dir;
  write_safetensors(dir / "t.safetensors", {{"w", "I32", {2}, bytes_of<int32_t>({5, 6})}});
  SafetensorsFile first(dir / "t.safetensors");
  const SafetensorsTensor* before = first.find("w");
  const void* data = before->data;
  const SafetensorsFile moved(std::move(first));
  ASSERT_NE(moved.find("w"), nullptr);
  EXPECT_EQ(moved.find("w")->data, data);
  EXPECT_EQ(data_of(*moved.find("w")), bytes_of<int32_t>({5, 6}));
}

TEST(SafetensorsFile, AcceptsAFileWithNoTensors) {
  testing::TempDir dir;
  write_raw(dir / "t.safetensors", "{}      ", "");
  const SafetensorsFile opened(dir / "t.safetensors");
  EXPECT_TRUE(opened.tensors().empty());
  EXPECT_TRUE(opened.metadata().empty());
}

// Every rule of Note [What a valid safetensors file is], broken once.
TEST(SafetensorsFile, RefusesInvalidFilesNamingTheProblem) {
  const std::string f32_2 = R"("dtype":"F32","shape":[2])";
  struct Case {
    std::string what;
    std::string header;
    std::string buffer;
    std::optional<uint64_t> length;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"header length absurd", "{}", "", uint64_t{200} << 20, "is absurd (more than 100 MiB)"},
      {"header past the end", "{}", "", 100, "header length 100 reaches past the end"},
      {"not JSON", "{\"a\": nope}", "", std::nullopt, "the header is not valid JSON"},
      {"not UTF-8", "{\"\xff\":{}}", "", std::nullopt, "the header is not valid JSON"},
      {"not an object", "[1, 2]", "", std::nullopt, "the header is not a JSON object but array"},
      {"duplicate tensor",
       "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"a\":{" + f32_2 +
           ",\"data_offsets\":[8,16]}}",
       std::string(16, '\0'), std::nullopt, "the header has the key 'a' twice"},
      {"entry not an object", R"({"a":[1]})", "", std::nullopt,
       "tensor 'a' must be an object with dtype, shape and data_offsets"},
      {"no data_offsets", "{\"a\":{" + f32_2 + "}}", "", std::nullopt,
       "tensor 'a' has no data_offsets"},
      {"unknown dtype", R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})",
       std::string(1, '\0'), std::nullopt, "tensor 'a' has unknown dtype \"Q7\" (known: BOOL"},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})", "",
       std::nullopt, "tensor 'a': shape [2,-1] has a negative dimension"},
      {"fractional dimension", R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,0]}})", "",
       std::nullopt, "tensor 'a': shape must be a list of integers"},
      {"huge shape",
       R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "",
       std::nullopt, "is too large"},
      {"offsets not a pair", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0]}}", "", std::nullopt,
       "data_offsets must be [begin, end]"},
      {"negative offset", "{\"a\":{" + f32_2 + ",\"data_offsets\":[-8,0]}}", "", std::nullopt,
       "data_offsets must be [begin, end] with non-negative integers"},
      {"end before begin", "{\"a\":{" + f32_2 + ",\"data_offsets\":[8,0]}}", std::string(8, '\0'),
       std::nullopt, "data_offsets [8,0] end before they begin"},
      {"past the buffer", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,16]}}", std::string(8, '\0'),
       std::nullopt, "data_offsets [0,16] reach past the end of the data buffer (8 bytes)"},
      {"wrong byte count", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
       std::string(8, '\0'), std::nullopt, "hold 8 bytes but shape [3] of F32 needs 12"},
      {"overlap",
       "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32_2 +
           ",\"data_offsets\":[4,12]}}",
       std::string(12, '\0'), std::nullopt, "tensors 'a' and 'b' overlap"},
      {"empty tensor inside another",
       "{\"a\":{" + f32_2 +
           R"(,"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
       std::string(8, '\0'), std::nullopt, "tensors 'a' and 'e' overlap"},
      {"hole",
       "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]},\"b\":{" + f32_2 +
           ",\"data_offsets\":[12,20]}}",
       std::string(20, '\0'), std::nullopt, "bytes [8, 12) of the data buffer belong to no tensor"},
      {"trailing bytes", "{\"a\":{" + f32_2 + ",\"data_offsets\":[0,8]}}", std::string(12, '\0'),
       std::nullopt, "4 trailing bytes after the last tensor"},
      {"metadata not strings", R"({"__metadata__":{"format":1}})", "", std::nullopt,
       "__metadata__ 'format' must be a string, not 1"},
      {"metadata not an object", R"({"__metadata__":"pt"})", "", std::nullopt,
       "__metadata__ must be an object of strings"},
  };
  testing::TempDir dir;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const path file = dir / "bad.safetensors";
    write_raw(file, c.header, c.buffer, c.length);
    const std::string message = open_error(file);
    EXPECT_TRUE(contains(message, c.expected)) << message;
    EXPECT_TRUE(contains(message, file.string())) << message;
  }
}

TEST(SafetensorsFile, RefusesFilesTooShortForTheHeaderLength) {
  testing::TempDir dir;
  write_file(dir / "empty.safetensors", "");
  write_file(dir / "short.safetensors", "abc");
  EXPECT_TRUE(contains(open_error(dir / "empty.safetensors"), "it has 0 bytes, fewer than the 8"));
  EXPECT_TRUE(contains(open_error(dir / "short.safetensors"), "it has 3 bytes, fewer than the 8"));
}

TEST(SafetensorsFile, RefusesWhatIsNotARegularFile) {
  testing::TempDir dir;
  EXPECT_TRUE(contains(open_error(dir / "absent.safetensors"), "No such file or directory"));
  EXPECT_TRUE(contains(open_error(dir.path()), "is not a regular file"));
}

// A folder with model.safetensors holding `names`, one I32 element each (its index).
void write_single_file_model(const path& dir, const std::vector<std::string>& names) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < names.size(); ++i) {
    specs.push_back({names[i], "I32", {1}, bytes_of<int32_t>({static_cast<int32_t>(i)})});
  }
  write_safetensors(dir / "model.safetensors", specs);
}

int32_t value_of(const SafetensorsTensor& tensor) {
  int32_t value = 0;
  EXPECT_EQ(tensor.bytes, sizeof(value));
  std::memcpy(&value, tensor.data, sizeof(value));
  return value;
}

TEST(SafetensorsWeights, ReadsASingleFile) {
  testing::TempDir dir;
  write_single_file_model(dir.path(), {"b", "a"});
  const SafetensorsWeights weights(dir.path());
  EXPECT_EQ(weights.dir(), dir.path());
  EXPECT_EQ(weights.names(), (std::vector<std::string>{"a", "b"}));
  ASSERT_NE(weights.find("a"), nullptr);
  EXPECT_EQ(value_of(*weights.find("a")), 1);
  EXPECT_EQ(value_of(weights.at("b")), 0);
  EXPECT_EQ(weights.find("c"), nullptr);
  const std::string message = model_error([&] { weights.at("c"); });
  EXPECT_TRUE(contains(message, "have no tensor 'c'")) << message;
  EXPECT_TRUE(contains(message, dir.path().string())) << message;
}

void write_shards(const path& dir) {
  write_safetensors(dir / "model-00001-of-00002.safetensors",
                    {{"a", "I32", {1}, bytes_of<int32_t>({10})}});
  write_safetensors(dir / "model-00002-of-00002.safetensors",
                    {{"b", "I32", {1}, bytes_of<int32_t>({20})},
                     {"c", "I32", {1}, bytes_of<int32_t>({30})},
                     {"unlisted", "I32", {1}, bytes_of<int32_t>({40})}});
}

TEST(SafetensorsWeights, ReadsTheShardsTheIndexLists) {
  testing::TempDir dir;
  write_shards(dir.path());
  write_file(dir / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 16},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "b": "model-00002-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  const SafetensorsWeights weights(dir.path());
  // The index decides which tensors exist: "unlisted" is in a shard but not in the weight map.
  EXPECT_EQ(weights.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(value_of(weights.at("a")), 10);
  EXPECT_EQ(value_of(weights.at("b")), 20);
  EXPECT_EQ(value_of(weights.at("c")), 30);
  EXPECT_EQ(weights.find("unlisted"), nullptr);
}

TEST(SafetensorsWeights, PrefersModelSafetensorsToAnIndex) {
  testing::TempDir dir;
  write_single_file_model(dir.path(), {"single"});
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "gone.safetensors"}})");
  EXPECT_EQ(SafetensorsWeights(dir.path()).names(), (std::vector<std::string>{"single"}));
}

TEST(SafetensorsWeights, NamesAMissingShard) {
  testing::TempDir dir;
  write_shards(dir.path());
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {
    "a": "model-00001-of-00002.safetensors", "d": "model-00003-of-00003.safetensors"}})");
  const std::string message = model_error([&] { SafetensorsWeights weights(dir.path()); });
  EXPECT_TRUE(contains(message,
                       "puts tensor 'd' in model-00003-of-00003.safetensors, which is "
                       "not in"))
      << message;
  EXPECT_TRUE(contains(message, "the download is incomplete")) << message;
}

TEST(SafetensorsWeights, NamesATensorItsShardLacks) {
  testing::TempDir dir;
  write_shards(dir.path());
  write_file(dir / "model.safetensors.index.json",
             R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                "b": "model-00001-of-00002.safetensors"}})");
  const std::string message = model_error([&] { SafetensorsWeights weights(dir.path()); });
  EXPECT_TRUE(contains(message, "model-00001-of-00002.safetensors\" has no tensor 'b'")) << message;
}

TEST(SafetensorsWeights, RefusesADamagedIndex) {
  testing::TempDir dir;
  write_file(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_TRUE(contains(model_error([&] { SafetensorsWeights weights(dir.path()); }),
                       "has no \"weight_map\" object"));
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {)");
  EXPECT_TRUE(
      contains(model_error([&] { SafetensorsWeights weights(dir.path()); }), "is not valid JSON"));
  write_file(dir / "model.safetensors.index.json", R"({"weight_map": {}})");
  EXPECT_TRUE(
      contains(model_error([&] { SafetensorsWeights weights(dir.path()); }), "lists no tensors"));
}

TEST(SafetensorsWeights, RefusesPickledWeightsSayingHowToConvert) {
  testing::TempDir dir;
  write_file(dir / "pytorch_model.bin", "not read: a pickle");
  const std::string message = model_error([&] { SafetensorsWeights weights(dir.path()); });
  EXPECT_TRUE(contains(message, dir.path().string())) << message;
  EXPECT_TRUE(contains(message, "only as pytorch_model.bin")) << message;
  EXPECT_TRUE(contains(message, "precompute reads safetensors only")) << message;
  EXPECT_TRUE(contains(message, "save_pretrained(DIR, safe_serialization=True)")) << message;
}

TEST(SafetensorsWeights, NamesAFolderWithoutWeights) {
  testing::TempDir dir;
  const std::string message = model_error([&] { SafetensorsWeights weights(dir.path()); });
  EXPECT_TRUE(contains(message, "has no model.safetensors")) << message;
}

}  // namespace
}  // namespace precompute
