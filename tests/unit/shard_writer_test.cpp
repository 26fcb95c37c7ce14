#include "storage/shard_writer.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/output_id.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/fletcher32.hpp"
#include "storage/float16.hpp"
#include "storage/h5_handle.hpp"
#include "storage/shard_reader.hpp"
#include "storage/shard_scan.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// float16 conversion

uint16_t half_bits_of(float value) { return float_to_half(value); }

TEST(Float16Test, ConvertsExactValuesExactly) {
  EXPECT_EQ(half_bits_of(0.0f), 0x0000);
  EXPECT_EQ(half_bits_of(-0.0f), 0x8000);
  EXPECT_EQ(half_bits_of(1.0f), 0x3c00);
  EXPECT_EQ(half_bits_of(-2.0f), 0xc000);
  EXPECT_EQ(half_bits_of(0.5f), 0x3800);
  EXPECT_EQ(half_bits_of(0.333251953125f), 0x3555);        // the half closest to 1/3
  EXPECT_EQ(half_bits_of(65504.0f), 0x7bff);               // largest half
  EXPECT_EQ(half_bits_of(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

TEST(Float16Test, RoundsToNearestWithTiesToEven) {
  const float ulp = std::ldexp(1.0f, -10);              // half spacing in [1, 2)
  EXPECT_EQ(half_bits_of(1.0f + ulp * 0.5f), 0x3c00);   // tie, 0x3c00 is even: down
  EXPECT_EQ(half_bits_of(1.0f + ulp * 1.5f), 0x3c02);   // tie, 0x3c01 is odd: up
  EXPECT_EQ(half_bits_of(1.0f + ulp * 0.49f), 0x3c00);  // below the tie: down
  EXPECT_EQ(half_bits_of(1.0f + ulp * 0.51f), 0x3c01);  // above the tie: up
  EXPECT_EQ(half_bits_of(-(1.0f + ulp * 1.5f)), 0xbc02);
  // Rounding up out of the mantissa moves to the next power of two.
  EXPECT_EQ(half_bits_of(2.0f - ulp * 0.25f), 0x4000);
}

TEST(Float16Test, HandlesInfinityAndNan) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(half_bits_of(inf), 0x7c00);
  EXPECT_EQ(half_bits_of(-inf), 0xfc00);
  EXPECT_EQ(half_to_float(0x7c00), inf);
  EXPECT_EQ(half_to_float(0xfc00), -inf);

  const uint16_t nan = half_bits_of(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling NaN whose payload lives only in the low bits must not turn into infinity.
  const uint16_t low_payload = half_bits_of(std::bit_cast<float>(0xff800001u));
  EXPECT_EQ(low_payload & 0xfc00, 0xfc00);
  EXPECT_NE(low_payload & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0xfd01)));
}

TEST(Float16Test, OverflowsToInfinity) {
  EXPECT_EQ(half_bits_of(65519.0f), 0x7bff);  // below the midpoint to 65536
  EXPECT_EQ(half_bits_of(65520.0f), 0x7c00);  // the midpoint: ties to even, which is infinity
  EXPECT_EQ(half_bits_of(1e6f), 0x7c00);
  EXPECT_EQ(half_bits_of(-1e6f), 0xfc00);
  EXPECT_EQ(half_bits_of(std::numeric_limits<float>::max()), 0x7c00);
}

TEST(Float16Test, HandlesSubnormals) {
  const float smallest = std::ldexp(1.0f, -24);  // the smallest half subnormal
  EXPECT_EQ(half_bits_of(smallest), 0x0001);
  EXPECT_EQ(half_bits_of(-smallest), 0x8001);
  EXPECT_EQ(half_bits_of(smallest * 0.5f), 0x0000);     // tie with 0, which is even
  EXPECT_EQ(half_bits_of(smallest * 0.75f), 0x0001);    // above the tie
  EXPECT_EQ(half_bits_of(smallest * 1.5f), 0x0002);     // tie between 1 and 2: to 2
  EXPECT_EQ(half_bits_of(smallest * 2.5f), 0x0002);     // tie between 2 and 3: to 2
  EXPECT_EQ(half_bits_of(smallest * 1023), 0x03ff);     // largest subnormal
  EXPECT_EQ(half_bits_of(smallest * 1023.5f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(half_bits_of(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(half_bits_of(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(half_to_float(0x0001), smallest);
  EXPECT_EQ(half_to_float(0x03ff), smallest * 1023);
  EXPECT_EQ(half_to_float(0x8200), -smallest * 512);
}

TEST(Float16Test, EveryHalfSurvivesARoundTripThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = half_to_float(half);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(value)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(float_to_half(value), half) << std::hex << bits;
  }
}

#ifdef __FLT16_MAX__
// The compiler's own _Float16 conversion rounds to nearest even: an independent oracle.
TEST(Float16Test, MatchesTheCompilersConversionOnRandomFloats) {
  std::mt19937 random(20240611);
  for (int i = 0; i < 1000000; ++i) {
    const float value = std::bit_cast<float>(static_cast<uint32_t>(random()));
    if (std::isnan(value)) continue;
    const auto expected = std::bit_cast<uint16_t>(static_cast<_Float16>(value));
    ASSERT_EQ(float_to_half(value), expected) << value;
  }
}
#endif

TEST(Float16Test, BulkConversionEqualsTheScalarOneBitForBit) {
  // Random bit patterns (NaNs, infinities, subnormals included) plus every half's value, in an
  // array whose length is not a multiple of the vector width.
  std::mt19937 random(20261130);
  std::vector<float> values;
  for (int i = 0; i < 200001; ++i)
    values.push_back(std::bit_cast<float>(static_cast<uint32_t>(random())));
  for (uint32_t bits = 0; bits <= 0xffff; ++bits)
    values.push_back(half_to_float(static_cast<uint16_t>(bits)));
  values.push_back(65519.99f);
  values.push_back(65520.0f);
  std::vector<uint16_t> bulk(values.size());
  floats_to_halves(values.data(), bulk.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(bulk[i], float_to_half(values[i])) << std::hexfloat << values[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Shards

ModalitySchema make_schema(Modality modality, int64_t dim, bool per_step) {
  ModalitySchema schema;
  schema.modality = modality;
  schema.per_step = per_step;
  schema.dim = dim;
  schema.encoder = std::string(modality_name(modality)) + "_encoder.pt";
  schema.encoder_sha256 = std::string(64, 'c');
  schema.pooling = per_step ? "none" : "mean";
  schema.preprocessing_json = R"({"fps":2.0,"height":224})";
  return schema;
}

ShardMeta make_meta(StorageDtype dtype) {
  ShardMeta meta;
  meta.tool_version = "0.1.0";
  meta.config_fingerprint = std::string(64, 'f');
  meta.output_id = output_id_for(meta.config_fingerprint);
  meta.config_json = R"({"output":{"shard_size":8}})";
  meta.dtype = dtype;
  meta.chunk_rows = 2;
  return meta;
}

// Deterministic values spread over several orders of magnitude, both signs.
SampleEmbedding make_embedding(int64_t seq, int64_t rows, int64_t dim, bool with_timestamps) {
  SampleEmbedding embedding;
  embedding.seq = seq;
  embedding.rows = rows;
  embedding.dim = dim;
  embedding.steps = static_cast<int32_t>(rows * 3);
  for (int64_t i = 0; i < rows * dim; ++i) {
    embedding.values.push_back(std::sin(static_cast<float>(seq * 131 + i) * 0.37f) *
                               std::pow(10.0f, static_cast<float>(i % 5) - 2.0f));
  }
  if (with_timestamps) {
    for (int64_t r = 0; r < rows; ++r) embedding.timestamps.push_back(0.25 * r + 0.1 * seq);
  }
  return embedding;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// What a value becomes after storage in `dtype`.
float stored(float value, StorageDtype dtype) {
  return dtype == StorageDtype::kFloat32 ? value : half_to_float(float_to_half(value));
}

void expect_same_embedding(const SampleEmbedding& expected, const SampleEmbedding& actual,
                           StorageDtype dtype) {
  EXPECT_EQ(actual.seq, expected.seq);
  EXPECT_EQ(actual.rows, expected.rows);
  EXPECT_EQ(actual.dim, expected.dim);
  EXPECT_EQ(actual.steps, expected.steps);
  EXPECT_EQ(actual.truncated, expected.truncated);
  EXPECT_EQ(actual.timestamps, expected.timestamps);
  ASSERT_EQ(actual.values.size(), expected.values.size());
  for (size_t i = 0; i < expected.values.size(); ++i) {
    const float want = expected.values[i];
    ASSERT_EQ(actual.values[i], stored(want, dtype)) << "value " << i;
    if (dtype == StorageDtype::kFloat16) {
      // Half precision: 11 significant bits, so a relative error of at most 2^-11 for normal
      // halves, and an absolute error of at most half the smallest subnormal below them.
      EXPECT_LE(std::abs(actual.values[i] - want),
                std::max(std::abs(want) * std::ldexp(1.0f, -11), std::ldexp(1.0f, -25)))
          << "value " << i;
    }
  }
}

void expect_same_contents(const ShardContents& expected, const ShardContents& actual,
                          StorageDtype dtype) {
  EXPECT_EQ(actual.shard_index, expected.shard_index);
  EXPECT_EQ(actual.first_seq, expected.first_seq);
  EXPECT_EQ(actual.seq_count, expected.seq_count);
  ASSERT_EQ(actual.samples.size(), expected.samples.size());
  for (size_t s = 0; s < expected.samples.size(); ++s) {
    SCOPED_TRACE("sample " + expected.samples[s].id);
    EXPECT_EQ(actual.samples[s].seq, expected.samples[s].seq);
    EXPECT_EQ(actual.samples[s].id, expected.samples[s].id);
    for (Modality m : kAllModalities) {
      const auto& want = expected.samples[s].embeddings[modality_index(m)];
      const auto& got = actual.samples[s].embeddings[modality_index(m)];
      ASSERT_EQ(got.has_value(), want.has_value()) << modality_name(m);
      if (want) expect_same_embedding(*want, *got, dtype);
    }
  }
  ASSERT_EQ(actual.failures.size(), expected.failures.size());
  for (size_t f = 0; f < expected.failures.size(); ++f) {
    EXPECT_EQ(actual.failures[f].seq, expected.failures[f].seq);
    EXPECT_EQ(actual.failures[f].id, expected.failures[f].id);
    EXPECT_EQ(actual.failures[f].modality, expected.failures[f].modality);
    EXPECT_EQ(actual.failures[f].category, expected.failures[f].category);
    EXPECT_EQ(actual.failures[f].message, expected.failures[f].message);
  }
}

void expect_same_meta(const ShardMeta& expected, const ShardMeta& actual) {
  EXPECT_EQ(actual.tool_version, expected.tool_version);
  EXPECT_EQ(actual.output_id, expected.output_id);
  EXPECT_EQ(actual.config_fingerprint, expected.config_fingerprint);
  EXPECT_EQ(actual.config_json, expected.config_json);
  EXPECT_EQ(actual.dtype, expected.dtype);
  for (Modality m : kAllModalities) {
    const auto& want = expected.modalities[modality_index(m)];
    const auto& got = actual.modalities[modality_index(m)];
    ASSERT_EQ(got.has_value(), want.has_value()) << modality_name(m);
    if (!want) continue;
    EXPECT_EQ(got->modality, want->modality);
    EXPECT_EQ(got->per_step, want->per_step);
    EXPECT_EQ(got->dim, want->dim);
    EXPECT_EQ(got->encoder, want->encoder);
    EXPECT_EQ(got->encoder_sha256, want->encoder_sha256);
    EXPECT_EQ(got->pooling, want->pooling);
    EXPECT_EQ(got->preprocessing_json, want->preprocessing_json);
  }
}

ShardSample make_sample(int64_t seq, std::string id) {
  ShardSample sample;
  sample.seq = seq;
  sample.id = std::move(id);
  return sample;
}

// Pooled video (dim 5) and text (dim 3); shard 2 of size 8; seqs 16..23.
ShardContents pooled_contents() {
  ShardContents contents;
  contents.shard_index = 2;
  contents.first_seq = 16;
  contents.seq_count = 8;
  for (int64_t seq : {16, 17, 19, 23}) {
    ShardSample sample = make_sample(seq, "clip-" + std::to_string(seq));
    sample.embeddings[modality_index(Modality::kVideo)] = make_embedding(seq, 1, 5, false);
    sample.embeddings[modality_index(Modality::kText)] = make_embedding(seq, 1, 3, false);
    contents.samples.push_back(std::move(sample));
  }
  return contents;
}

ShardMeta pooled_meta(StorageDtype dtype) {
  ShardMeta meta = make_meta(dtype);
  meta.modalities[modality_index(Modality::kVideo)] = make_schema(Modality::kVideo, 5, false);
  meta.modalities[modality_index(Modality::kText)] = make_schema(Modality::kText, 3, false);
  return meta;
}

class ShardWriterTest : public ::testing::Test {
 protected:
  // Writes, checks what write() reports against the file, and reads the shard back.
  ShardFile round_trip(const ShardMeta& meta, const ShardContents& contents) {
    const CommittedShard committed = ShardWriter(dir_, meta).write(contents);
    const fs::path file = dir_ / committed.file;
    EXPECT_EQ(committed.file, shard_file_name(contents.shard_index, committed.sha256));
    EXPECT_EQ(committed.bytes, fs::file_size(file));
    EXPECT_EQ(committed.sha256, sha256_file(file));
    ShardFile shard = read_shard(file);
    expect_same_meta(meta, shard.meta);
    expect_same_contents(contents, shard.contents, meta.dtype);
    return shard;
  }

  // Expects write() to throw E with `fragment` in its message and to leave the folder empty.
  template <class E>
  void expect_rejected(const ShardMeta& meta, const ShardContents& contents,
                       const std::string& fragment) {
    try {
      ShardWriter(dir_, meta).write(contents);
      ADD_FAILURE() << "expected the shard to be rejected";
    } catch (const E& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
    EXPECT_TRUE(fs::is_empty(dir_));
  }

  testing::TempDir temp_;
  const fs::path dir_ = temp_.path();
};

// ---------------------------------------------------------------------------------------------
// Chunks checksummed by the writer (Note [Chunks written whole] in storage/shard_writer.cpp)

// The chunk HDF5's own fletcher32 filter stores for `data`: a one-chunk uint8 dataset written
// through H5Dwrite in an in-memory file, read back raw with H5Dread_chunk (data, then checksum).
std::vector<unsigned char> chunk_as_hdf5_filters_it(const std::vector<unsigned char>& data) {
  const fs::path name = "/dev/null/fletcher-test.h5";
  H5Handle access = h5_own(H5Pcreate(H5P_FILE_ACCESS), "fapl", name);
  h5_check(H5Pset_fapl_core(access.get(), 1 << 20, 0), "core", name);
  H5Handle file = h5_own(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()),
                         "create", name);
  const hsize_t size = data.size();
  H5Handle space = h5_own(H5Screate_simple(1, &size, nullptr), "space", name);
  H5Handle creation = h5_own(H5Pcreate(H5P_DATASET_CREATE), "dcpl", name);
  h5_check(H5Pset_chunk(creation.get(), 1, &size), "chunk", name);
  h5_check(H5Pset_fletcher32(creation.get()), "fletcher32", name);
  H5Handle dataset = h5_own(H5Dcreate2(file.get(), "d", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                                       creation.get(), H5P_DEFAULT),
                            "dataset", name);
  h5_check(H5Dwrite(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()),
           "write", name);
  h5_check(H5Dflush(dataset.get()), "flush", name);
  const hsize_t offset = 0;
  hsize_t stored_bytes = 0;
  h5_check(H5Dget_chunk_storage_size(dataset.get(), &offset, &stored_bytes), "storage size",
           name);
  std::vector<unsigned char> stored(static_cast<size_t>(stored_bytes));
  uint32_t filters = 0;
  h5_check(H5Dread_chunk(dataset.get(), H5P_DEFAULT, &offset, &filters, stored.data()),
           "read chunk", name);
  EXPECT_EQ(filters, 0u) << "the filter was skipped";
  return stored;
}

TEST(Fletcher32Test, AppendsTheChecksumHdf5sFilterStores) {
  std::mt19937 random(11);
  // Sizes around the 360-word fold and odd sizes (a last byte without its pair); bytes random,
  // all 0xFF (the largest sums, where folding late or early would show), and all zero.
  for (const size_t size : {size_t{1}, size_t{2}, size_t{3}, size_t{719}, size_t{720},
                            size_t{721}, size_t{1441}, size_t{65536}, size_t{(1 << 20) + 3}}) {
    for (const int fill : {-1, 0xFF, 0}) {
      SCOPED_TRACE("size " + std::to_string(size) + ", fill " + std::to_string(fill));
      std::vector<unsigned char> data(size);
      for (auto& byte : data) {
        byte = static_cast<unsigned char>(fill >= 0 ? fill : static_cast<int>(random() & 0xFF));
      }
      const std::vector<unsigned char> theirs = chunk_as_hdf5_filters_it(data);
      std::vector<unsigned char> ours = data;
      ours.resize(size + 4);
      hdf5_fletcher32_append(ours.data(), size);
      ASSERT_EQ(ours, theirs);
    }
  }
}

TEST_F(ShardWriterTest, EveryRemainderOfTheLastChunkReadsBackAndBuildsReuseTheirBuffers) {
  for (const StorageDtype dtype : {StorageDtype::kFloat16, StorageDtype::kFloat32}) {
    SCOPED_TRACE(storage_dtype_name(dtype));
    ShardMeta meta = make_meta(dtype);
    meta.chunk_rows = 256;
    meta.modalities[modality_index(Modality::kText)] = make_schema(Modality::kText, 7, false);
    meta.modalities[modality_index(Modality::kAudio)] = make_schema(Modality::kAudio, 3, true);
    const ShardWriter writer(dir_, meta);
    std::string image;  // reused, as the committer reuses its images
    int builds = 0;
    // Largest first, so that every later build fits the first one's in-memory file.
    for (const int64_t samples : {600, 513, 257, 256, 255, 1}) {
      SCOPED_TRACE(std::to_string(samples) + " samples");
      ShardContents contents;
      contents.shard_index = builds;
      contents.seq_count = samples;
      for (int64_t seq = 0; seq < samples; ++seq) {
        ShardSample sample = make_sample(seq, std::string("s").append(std::to_string(seq)));
        sample.embeddings[modality_index(Modality::kText)] = make_embedding(seq, 1, 7, false);
        sample.embeddings[modality_index(Modality::kAudio)] =
            make_embedding(seq, 1 + seq % 3, 3, true);  // per step: 2 rows a sample on average
        contents.samples.push_back(std::move(sample));
      }
      writer.build(contents, image);
      ++builds;
      const fs::path file = dir_ / writer.commit(contents.shard_index, image).file;
      expect_same_contents(contents, read_shard(file).contents, dtype);
      EXPECT_NO_THROW(scan_shard(file));  // every chunk read and its checksum verified
    }
    EXPECT_EQ(writer.in_memory_file_reuses(), builds - 1)
        << "HDF5's core driver did not take the kept block through the file image callbacks";
  }
}

TEST(ShardFileNameTest, PadsTheIndexToSixDigitsAndAddsTheHashsFirstEightDigits) {
  const std::string sha(64, 'a');
  EXPECT_EQ(shard_file_name(0, sha), "shard-000000-aaaaaaaa.h5");
  EXPECT_EQ(shard_file_name(12, "0123456789abcdef"), "shard-000012-01234567.h5");
  EXPECT_EQ(shard_file_name(1234567, sha), "shard-1234567-aaaaaaaa.h5");
  for (const char* name : {"shard-000000-aaaaaaaa.h5", "shard-1234567-01234567.h5",
                           "shard-999999999999999999-ffffffff.h5"}) {
    EXPECT_TRUE(is_shard_file_name(name)) << name;
  }
  // The names of earlier versions, a user's files, and anything that is a path.
  for (const char* name : {"shard-000000.h5", "shard-00000-aaaaaaaa.h5", "shard-000000-aaaaaaa.h5",
                           "shard-000000-aaaaaaaaa.h5", "shard-000000-AAAAAAAA.h5",
                           "shard-000000-aaaaaaaa.h5.tmp", "shard-final-results.h5",
                           "../shard-000000-aaaaaaaa.h5", "x/shard-000000-aaaaaaaa.h5",
                           "shard--000000-aaaaaaaa.h5", "shard-0000000000000000000-aaaaaaaa.h5",
                           ""}) {
    EXPECT_FALSE(is_shard_file_name(name)) << name;
  }
}

TEST_F(ShardWriterTest, ANameIsNeverReusedForOtherBytesAndTheSameBytesGetTheSameName) {
  const ShardMeta meta = pooled_meta(StorageDtype::kFloat32);
  ShardContents contents = pooled_contents();
  const CommittedShard first = ShardWriter(dir_, meta).write(contents);
  const CommittedShard again = ShardWriter(dir_, meta).write(contents);
  EXPECT_EQ(again.file, first.file);
  EXPECT_EQ(again.sha256, first.sha256);
  contents.samples.front().embeddings[modality_index(Modality::kVideo)]->values[0] += 1.0f;
  const CommittedShard other = ShardWriter(dir_, meta).write(contents);
  EXPECT_NE(other.file, first.file);
  EXPECT_NE(other.sha256, first.sha256);
  EXPECT_TRUE(fs::exists(dir_ / first.file));  // the old bytes are still there, by their name
}

TEST_F(ShardWriterTest, PooledFloat32RoundTripIsExact) {
  round_trip(pooled_meta(StorageDtype::kFloat32), pooled_contents());
}

TEST_F(ShardWriterTest, PooledFloat16RoundTripIsWithinHalfPrecision) {
  round_trip(pooled_meta(StorageDtype::kFloat16), pooled_contents());
}

TEST_F(ShardWriterTest, PerStepRoundTripKeepsRowsAndTimestamps) {
  ShardMeta meta = make_meta(StorageDtype::kFloat16);
  meta.modalities[modality_index(Modality::kVideo)] = make_schema(Modality::kVideo, 4, true);
  meta.modalities[modality_index(Modality::kAudio)] = make_schema(Modality::kAudio, 6, true);
  ShardContents contents;
  contents.shard_index = 0;
  contents.seq_count = 5;
  const std::vector<int64_t> video_rows = {3, 1, 7, 0, 2};
  for (int64_t seq = 0; seq < 5; ++seq) {
    ShardSample sample = make_sample(seq, "s" + std::to_string(seq));
    if (video_rows[seq] > 0) {
      sample.embeddings[modality_index(Modality::kVideo)] =
          make_embedding(seq, video_rows[seq], 4, true);
    }
    sample.embeddings[modality_index(Modality::kAudio)] = make_embedding(seq, seq + 1, 6, true);
    contents.samples.push_back(std::move(sample));
  }
  round_trip(meta, contents);

  meta.dtype = StorageDtype::kFloat32;
  round_trip(meta, contents);
}

TEST_F(ShardWriterTest, TextKeepsTruncatedAndNumSteps) {
  ShardMeta meta = make_meta(StorageDtype::kFloat32);
  meta.modalities[modality_index(Modality::kText)] = make_schema(Modality::kText, 3, false);
  ShardContents contents;
  contents.seq_count = 3;
  for (int64_t seq = 0; seq < 3; ++seq) {
    ShardSample sample = make_sample(seq, "caption-" + std::to_string(seq));
    SampleEmbedding embedding = make_embedding(seq, 1, 3, false);
    embedding.steps = static_cast<int32_t>(10 + seq);
    embedding.truncated = seq == 1;
    sample.embeddings[modality_index(Modality::kText)] = std::move(embedding);
    contents.samples.push_back(std::move(sample));
  }
  const ShardFile shard = round_trip(meta, contents);
  const auto& text = shard.contents.samples[1].embeddings[modality_index(Modality::kText)];
  ASSERT_TRUE(text.has_value());
  EXPECT_TRUE(text->truncated);
  EXPECT_EQ(text->steps, 11);
}

TEST_F(ShardWriterTest, PerStepTextHasRowsWithoutTimestamps) {
  ShardMeta meta = make_meta(StorageDtype::kFloat16);
  meta.modalities[modality_index(Modality::kText)] = make_schema(Modality::kText, 2, true);
  ShardContents contents;
  contents.seq_count = 2;
  for (int64_t seq = 0; seq < 2; ++seq) {
    ShardSample sample = make_sample(seq, "t" + std::to_string(seq));
    SampleEmbedding embedding = make_embedding(seq, 4 + seq, 2, false);
    embedding.truncated = seq == 0;
    sample.embeddings[modality_index(Modality::kText)] = std::move(embedding);
    contents.samples.push_back(std::move(sample));
  }
  round_trip(meta, contents);
}

TEST_F(ShardWriterTest, SamplesMissingAModalityReadBackWithoutIt) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat16);
  meta.modalities[modality_index(Modality::kAudio)] = make_schema(Modality::kAudio, 4, true);
  ShardContents contents = pooled_contents();
  contents.samples[0].embeddings[modality_index(Modality::kVideo)].reset();
  contents.samples[2].embeddings[modality_index(Modality::kText)].reset();
  contents.samples[3].embeddings[modality_index(Modality::kAudio)] =
      make_embedding(contents.samples[3].seq, 2, 4, true);
  round_trip(meta, contents);
}

TEST_F(ShardWriterTest, AShardWhereEverySampleFailedIsValid) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat16);
  meta.modalities[modality_index(Modality::kAudio)] = make_schema(Modality::kAudio, 4, true);
  ShardContents contents;
  contents.shard_index = 7;
  contents.first_seq = 70;
  contents.seq_count = 2;
  contents.failures = {
      {70, "a", Modality::kVideo, FailureCategory::kMissing, "no such file: a.mp4"},
      {71, "b", Modality::kText, FailureCategory::kBadText, "empty caption"},
  };
  round_trip(meta, contents);

  contents.failures.clear();
  contents.seq_count = 0;
  round_trip(meta, contents);
}

TEST_F(ShardWriterTest, FailuresRoundTripWithUnicode) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat32);
  ShardContents contents = pooled_contents();
  contents.samples[1].id = "видео/клип №1";
  contents.samples[2].id = "日本語 🎬 clip";
  contents.failures = {
      {18, "café ☕", Modality::kVideo, FailureCategory::kDecodeError,
       "décodage échoué: ファイルが壊れています"},
      {18, "café ☕", Modality::kText, FailureCategory::kBadText, "légende vide"},
      {20, "x", Modality::kAudio, FailureCategory::kNoStream, "no audio stream"},
      {21, "😀", Modality::kVideo, FailureCategory::kOom, ""},
  };
  round_trip(meta, contents);
}

TEST_F(ShardWriterTest, EqualContentsGiveIdenticalFiles) {
  const ShardMeta meta = pooled_meta(StorageDtype::kFloat16);
  const CommittedShard first = ShardWriter(dir_, meta).write(pooled_contents());
  const std::string first_bytes = read_bytes(dir_ / first.file);
  // HDF5 records object times in whole seconds: let the clock move so that any stored time
  // would differ.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const CommittedShard second = ShardWriter(dir_, meta).write(pooled_contents());
  EXPECT_EQ(second.sha256, first.sha256);
  EXPECT_EQ(read_bytes(dir_ / second.file), first_bytes);
}

TEST_F(ShardWriterTest, RejectsAnEmbeddingOfTheWrongDim) {
  ShardContents contents = pooled_contents();
  contents.samples[1].embeddings[modality_index(Modality::kVideo)] =
      make_embedding(17, 1, 6, false);
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), contents,
                                "video embedding of sample 'clip-17' (seq 17) has dim 6, but the "
                                "run's video schema has dim 5");
}

TEST_F(ShardWriterTest, RejectsAPooledEmbeddingWithSeveralRows) {
  ShardContents contents = pooled_contents();
  contents.samples[0].embeddings[modality_index(Modality::kText)] = make_embedding(16, 2, 3, false);
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), contents, "has 2 rows");
}

TEST_F(ShardWriterTest, RejectsTimestampsThatDoNotMatchTheRows) {
  ShardMeta meta = make_meta(StorageDtype::kFloat16);
  meta.modalities[modality_index(Modality::kVideo)] = make_schema(Modality::kVideo, 4, true);
  ShardContents contents;
  contents.seq_count = 1;
  ShardSample sample = make_sample(0, "v");
  SampleEmbedding embedding = make_embedding(0, 3, 4, true);
  embedding.timestamps.pop_back();
  sample.embeddings[modality_index(Modality::kVideo)] = std::move(embedding);
  contents.samples.push_back(std::move(sample));
  expect_rejected<StorageError>(meta, contents, "has 2 timestamps for 3 rows");
}

TEST_F(ShardWriterTest, RejectsAModalityTheRunDoesNotStore) {
  ShardContents contents = pooled_contents();
  contents.samples[0].embeddings[modality_index(Modality::kAudio)] =
      make_embedding(16, 1, 5, false);
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), contents,
                                "the run has no audio schema");
}

TEST_F(ShardWriterTest, RejectsSeqsOutsideTheShardOrOutOfOrder) {
  ShardContents outside = pooled_contents();
  outside.samples.back().seq = 24;
  for (auto& embedding : outside.samples.back().embeddings) {
    if (embedding) embedding->seq = 24;
  }
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), outside,
                                "outside the shard's range [16, 24)");

  ShardContents unordered = pooled_contents();
  std::swap(unordered.samples[1], unordered.samples[2]);
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), unordered,
                                "ascending seq order");

  ShardContents failures = pooled_contents();
  failures.failures = {{20, "b", Modality::kText, FailureCategory::kBadText, ""},
                       {18, "a", Modality::kVideo, FailureCategory::kMissing, ""}};
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), failures,
                                "ascending (seq, modality) order");
}

TEST_F(ShardWriterTest, RejectsASampleWithoutEmbeddings) {
  ShardContents contents = pooled_contents();
  contents.samples[2].embeddings = {};
  expect_rejected<StorageError>(pooled_meta(StorageDtype::kFloat16), contents, "has no embedding");
}

TEST_F(ShardWriterTest, AnEmbeddingWithTooFewValuesIsABug) {
  ShardContents contents = pooled_contents();
  contents.samples[0].embeddings[modality_index(Modality::kVideo)]->values.pop_back();
  expect_rejected<InternalError>(pooled_meta(StorageDtype::kFloat16), contents, "internal error");
}

// ---------------------------------------------------------------------------------------------
// Reading files that are not good shards

class ShardReaderTest : public ShardWriterTest {
 protected:
  template <class... Fragments>
  void expect_unreadable(const fs::path& file, const Fragments&... fragments) {
    try {
      read_shard(file);
      ADD_FAILURE() << "expected " << file << " to be rejected";
    } catch (const StorageError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(file.string()), std::string::npos) << message;
      for (const std::string& fragment : std::vector<std::string>{fragments...}) {
        EXPECT_NE(message.find(fragment), std::string::npos) << message;
      }
    }
  }
};

TEST_F(ShardReaderTest, NamesAMissingFile) {
  expect_unreadable(dir_ / "shard-000000.h5", "no such file");
}

TEST_F(ShardReaderTest, RejectsAFileThatIsNotHdf5) {
  write_bytes(dir_ / "notes.h5", "just some text\n");
  expect_unreadable(dir_ / "notes.h5", "is not a precompute shard", "not an HDF5 file");
}

TEST_F(ShardReaderTest, RejectsAnHdf5FileOfAnotherFormat) {
  const CommittedShard committed =
      ShardWriter(dir_, pooled_meta(StorageDtype::kFloat16)).write(pooled_contents());
  std::string bytes = read_bytes(dir_ / committed.file);
  const size_t at = bytes.find("precompute-shard");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 16, "precompute-OTHER");
  write_bytes(dir_ / committed.file, bytes);
  expect_unreadable(dir_ / committed.file, "is not a precompute shard",
                    "its format is 'precompute-OTHER'");
}

TEST_F(ShardReaderTest, RejectsATruncatedShard) {
  const CommittedShard committed =
      ShardWriter(dir_, pooled_meta(StorageDtype::kFloat16)).write(pooled_contents());
  const std::string bytes = read_bytes(dir_ / committed.file);
  write_bytes(dir_ / committed.file, bytes.substr(0, bytes.size() / 2));
  expect_unreadable(dir_ / committed.file);
}

// ---------------------------------------------------------------------------------------------
// scan_shard (precompute verify): every dataset read end to end, in blocks

TEST_F(ShardWriterTest, ScanReadsEveryDatasetAndKeepsIdsSeqsAndFailures) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat32);
  ShardContents contents = pooled_contents();
  contents.input_sha256 = std::string(64, 'a');
  contents.samples[2].embeddings[modality_index(Modality::kText)].reset();
  contents.failures = {{18, "café ☕", Modality::kVideo, FailureCategory::kMissing, "gone"},
                       {19, "clip-19", Modality::kText, FailureCategory::kBadText, "empty"}};
  const CommittedShard committed = ShardWriter(dir_, meta).write(contents);
  const ShardScan scan = scan_shard(dir_ / committed.file);
  EXPECT_EQ(scan.shard_index, 2);
  EXPECT_EQ(scan.first_seq, 16);
  EXPECT_EQ(scan.seq_count, 8);
  EXPECT_EQ(scan.input_sha256, contents.input_sha256);
  EXPECT_EQ(scan.ids, (std::vector<std::string>{"clip-16", "clip-17", "clip-19", "clip-23"}));
  EXPECT_EQ(scan.seqs, (std::vector<int64_t>{16, 17, 19, 23}));
  EXPECT_EQ(scan.failure_ids, (std::vector<std::string>{"café ☕", "clip-19"}));
  EXPECT_EQ(scan.failure_seqs, (std::vector<int64_t>{18, 19}));
  EXPECT_EQ(scan.present[modality_index(Modality::kVideo)], 4);
  EXPECT_EQ(scan.present[modality_index(Modality::kText)], 3);
  // ids, seq; per modality present, num_steps, embeddings, and text's truncated; five failure
  // columns.
  EXPECT_EQ(scan.datasets_read, 2 + 2 * 3 + 1 + 5);
  EXPECT_GT(scan.attributes_read, 0);
  EXPECT_TRUE(scan.column_rows.empty());  // no kept columns: no /columns group
}

// output.keep_columns: one string dataset per kept column, /columns/<name>, one row per id;
// read end to end by the scan, which counts its rows.
TEST_F(ShardWriterTest, KeptColumnsAreStringDatasetsRowAlignedWithIds) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat32);
  meta.kept_columns = {"label", "50% off", "caf\u00e9"};
  ShardContents contents = pooled_contents();
  for (auto& sample : contents.samples) {
    sample.columns = {"cat-" + std::to_string(sample.seq), "", "\u2615"};
  }
  const CommittedShard committed = ShardWriter(dir_, meta).write(contents);
  const ShardScan scan = scan_shard(dir_ / committed.file);
  EXPECT_EQ(scan.column_rows, (std::map<std::string, int64_t>{
                                  {"label", 4}, {"50% off", 4}, {"caf\u00e9", 4}}));
  EXPECT_EQ(scan.datasets_read, 2 + 2 * 3 + 1 + 5 + 3);
  // Equal contents, equal bytes, with columns too.
  const std::string first = read_bytes(dir_ / committed.file);
  ShardWriter(dir_, meta).write(contents);
  EXPECT_EQ(read_bytes(dir_ / committed.file), first);
  // A shard of no samples has empty columns.
  ShardContents empty = contents;
  empty.samples.clear();
  empty.shard_index = 3;
  const ShardScan none = scan_shard(dir_ / ShardWriter(dir_, meta).write(empty).file);
  EXPECT_EQ(none.column_rows.at("label"), 0);
}

TEST_F(ShardWriterTest, RejectsKeptColumnsThatDoNotMatchTheRun) {
  ShardMeta meta = pooled_meta(StorageDtype::kFloat32);
  meta.kept_columns = {"label"};
  ShardContents contents = pooled_contents();
  for (auto& sample : contents.samples) sample.columns = {"cat"};
  contents.samples[1].columns.clear();
  expect_rejected<StorageError>(meta, contents, "has 0 kept column values");
  contents.samples[1].columns = {std::string("c\0t", 3)};
  expect_rejected<StorageError>(meta, contents, "contains a NUL");
}

TEST_F(ShardWriterTest, ScanReadsADatasetLargerThanOneBlockAndFindsAFlippedChunk) {
  ShardMeta meta = make_meta(StorageDtype::kFloat32);
  meta.chunk_rows = 256;
  meta.modalities[modality_index(Modality::kAudio)] = make_schema(Modality::kAudio, 1024, true);
  ShardContents contents;
  contents.seq_count = 4;
  for (int64_t seq = 0; seq < 4; ++seq) {  // 4 x 400 rows x 4 KiB: 6.4 MB, two blocks
    ShardSample sample = make_sample(seq, "s" + std::to_string(seq));
    sample.embeddings[modality_index(Modality::kAudio)] = make_embedding(seq, 400, 1024, true);
    contents.samples.push_back(std::move(sample));
  }
  const fs::path file = dir_ / ShardWriter(dir_, meta).write(contents).file;
  const ShardScan scan = scan_shard(file);
  EXPECT_GE(scan.bytes_read, uint64_t{4} * 400 * 1024 * 4);
  EXPECT_GT(scan.bytes_read, kScanBlockBytes);
  EXPECT_EQ(scan.present[modality_index(Modality::kAudio)], 4);

  std::string bytes = read_bytes(file);  // the middle of the file is inside /audio/values
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  write_bytes(file, bytes);
  try {
    scan_shard(file);
    ADD_FAILURE() << "a flipped byte in a chunk was not found";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find("/audio/values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Fletcher32"), std::string::npos) << e.what();
  }
}

TEST_F(ShardWriterTest, ScanOfATruncatedFileThrowsNamingIt) {
  const fs::path file =
      dir_ / ShardWriter(dir_, pooled_meta(StorageDtype::kFloat16)).write(pooled_contents()).file;
  const std::string bytes = read_bytes(file);
  write_bytes(file, bytes.substr(0, bytes.size() / 2));
  try {
    scan_shard(file);
    ADD_FAILURE() << "a truncated shard was scanned";
  } catch (const StorageError& e) {
    EXPECT_NE(std::string(e.what()).find(file.filename().string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace precompute
