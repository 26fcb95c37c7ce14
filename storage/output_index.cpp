#include "storage/output_index.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <system_error>

#include "pipeline/core/crash_point.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/atomic_file.hpp"
#include "storage/output_id.hpp"
#include "storage/shard_file_name.hpp"
#include "storage/shard_schema.hpp"

namespace precompute {
namespace {

// Ordered, so that index.json lists its fields in the order a person reads them (format first,
// shards last), and embedded JSON keeps its key order through a round trip.
using Json = nlohmann::ordered_json;
using std::filesystem::path;

// Config and preprocessing settings are JSON text in memory and in shards, but objects in
// index.json, where people read them. Empty text is stored as null.
Json embed_json_text(const std::string& text, std::string_view what) {
  if (text.empty()) return nullptr;
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  PC_ASSERT(!parsed.is_discarded(), what, " is not valid JSON: ", text);
  return parsed;
}

std::string json_text(const Json& value) { return value.is_null() ? "" : value.dump(); }

Json modality_to_json(const ModalitySchema& schema) {
  return {
      {"dim", schema.dim},
      {"layout", schema.per_step ? shard_schema::kPerStepLayout : shard_schema::kPooledLayout},
      {"encoder", schema.encoder},
      {"encoder_sha256", schema.encoder_sha256},
      {"pooling", schema.pooling},
      {"preprocessing", embed_json_text(schema.preprocessing_json, "preprocessing settings")},
  };
}

Json entry_to_json(const IndexEntry& entry, const ShardMeta& meta) {
  Json counts = Json::object();
  for (Modality m : kAllModalities) {
    if (meta.modalities[modality_index(m)]) {
      counts[std::string(modality_name(m))] = entry.modality_counts[modality_index(m)];
    }
  }
  return {
      {"file", entry.file},
      {"shard_index", entry.shard_index},
      {"first_seq", entry.first_seq},
      {"seq_count", entry.seq_count},
      {"num_samples", entry.num_samples},
      {"num_failures", entry.num_failures},
      {"failed_samples", entry.failed_samples},
      {"modality_counts", std::move(counts)},
      {"bytes", entry.bytes},
      {"sha256", entry.sha256},
  };
}

// The checksum of index.json: a SHA-256 over every other field, as compact JSON in the file's
// order (so an edit of any field, a modality's dim as much as a shard's hash, is found), with
// the same replacement of bytes that are not UTF-8 as the file itself (write_index()).
std::string fields_checksum(const Json& fields) {
  return sha256_hex(fields.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace

std::vector<std::string> kept_columns_of_config(const std::string& config_json) {
  const Json config = Json::parse(config_json.empty() ? "{}" : config_json, nullptr,
                                  /*allow_exceptions=*/false);
  std::vector<std::string> names;
  if (!config.is_object() || !config.contains("output")) return names;
  const Json& output = config.at("output");
  if (!output.is_object() || !output.contains("keep_columns")) return names;
  const Json& list = output.at("keep_columns");
  if (!list.is_array()) return names;
  for (const auto& name : list) {
    if (name.is_string()) names.push_back(name.get<std::string>());
  }
  return names;
}

int64_t max_text_bytes_of_config(const std::string& config_json, int64_t fallback) {
  const Json config = Json::parse(config_json.empty() ? "{}" : config_json, nullptr,
                                  /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("text") || !config.at("text").is_object()) {
    return fallback;
  }
  const Json& text = config.at("text");
  if (!text.contains("max_text_bytes") || !text.at("max_text_bytes").is_number_integer()) {
    return fallback;
  }
  return text.at("max_text_bytes").get<int64_t>();
}

namespace {

Json index_to_json(const OutputIndex& index) {
  const ShardMeta& meta = index.meta;
  Json modalities = Json::object();
  for (const auto& schema : meta.modalities) {
    if (schema)
      modalities[std::string(modality_name(schema->modality))] = modality_to_json(*schema);
  }
  Json shards = Json::array();
  int64_t total_samples_embedded = 0;
  int64_t total_failures = 0;
  for (size_t i = 0; i < index.shards.size(); ++i) {
    const IndexEntry& entry = index.shards[i];
    PC_ASSERT(i == 0 || entry.first_seq >= index.shards[i - 1].first_seq +
                                               index.shards[i - 1].seq_count,
              "index shards out of order or overlapping at ", i);
    shards.push_back(entry_to_json(entry, meta));
    total_samples_embedded += entry.num_samples;
    total_failures += entry.num_failures;
  }
  Json settings = Json::object();
  for (const auto& s : index.model_settings) {
    settings[s.key] = {{"value", embed_json_text(s.value, "a model setting")},
                       {"source", s.source}};
  }
  Json rank = nullptr;
  if (index.rank) {
    rank = {{"rank", index.rank->rank},
            {"world_size", index.rank->world_size},
            {"first_seq", index.rank->first_seq},
            {"end_seq", index.rank->end_seq}};
  }
  Json fields = {
      {"format", kIndexFormat},
      // Second, so that it sits in the file's first bytes (Note [Proving a file is ours]).
      {"output_id", meta.output_id},
      {"format_version", kIndexFormatVersion},
      {"tool_version", meta.tool_version},
      {"config_fingerprint", meta.config_fingerprint},
      {"config", embed_json_text(meta.config_json, "the config")},
      {"model_settings", std::move(settings)},
      {"storage_dtype", storage_dtype_name(meta.dtype)},
      {"chunk_rows", meta.chunk_rows},
      {"total_samples", index.total_samples},
      {"shard_size", index.shard_size},
      {"input", index.input},
      {"input_samples", index.input_samples},
      {"input_sha256", index.input_sha256},
      {"modalities", std::move(modalities)},
      {"shards", std::move(shards)},
      // Derived from "shards"; checked when the index is read.
      {"totals", {{"samples", total_samples_embedded}, {"failures", total_failures}}},
      {"rank", std::move(rank)},
  };
  fields["checksum"] = fields_checksum(fields);
  return fields;
}

std::string index_text(const OutputIndex& index) {
  // Paths (the input, the encoders) are bytes, and JSON cannot hold bytes that are not UTF-8:
  // they become U+FFFD here. Nothing is read back from those fields to find a file, and a
  // resume compares hashes, not paths.
  return index_to_json(index).dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// Reads index.json's fields with their types checked; every problem throws StorageError naming
// the file and the field, e.g. "shards[3].sha256".
class IndexParser {
 public:
  explicit IndexParser(const path& file) : file_(file) {}

  OutputIndex parse(const std::string& text);

 private:
  [[noreturn]] void damaged(const std::string& what) const {
    PC_THROW(StorageError, "index file ", file_, " is damaged: ", what);
  }

  const Json& field(const Json& object, const std::string& where, const char* key,
                    bool (Json::*has_type)() const noexcept, std::string_view type_name) const;
  std::string string_field(const Json& object, const std::string& where, const char* key) const;
  int64_t count_field(const Json& object, const std::string& where, const char* key) const;
  ModalitySchema parse_modality_schema(Modality modality, const Json& object,
                                       const std::string& where) const;
  IndexEntry parse_entry(const Json& object, const std::string& where) const;

  const path& file_;
};

std::string field_path(const std::string& where, const char* key) {
  return where.empty() ? key : where + "." + key;
}

const Json& IndexParser::field(const Json& object, const std::string& where, const char* key,
                               bool (Json::*has_type)() const noexcept,
                               std::string_view type_name) const {
  const auto found = object.find(key);
  if (found == object.end()) damaged(detail::concat("'", field_path(where, key), "' is missing"));
  if (!(*found.*has_type)()) {
    damaged(detail::concat("'", field_path(where, key), "' is not ", type_name));
  }
  return *found;
}

std::string IndexParser::string_field(const Json& object, const std::string& where,
                                      const char* key) const {
  return field(object, where, key, &Json::is_string, "a string").get<std::string>();
}

int64_t IndexParser::count_field(const Json& object, const std::string& where,
                                 const char* key) const {
  const Json& value = field(object, where, key, &Json::is_number_integer, "an integer");
  // Counts, sizes and positions: never negative, and within int64 when read back.
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      damaged(detail::concat("'", field_path(where, key), "' is too large"));
    }
    return static_cast<int64_t>(value.get<uint64_t>());
  }
  const int64_t number = value.get<int64_t>();
  if (number < 0) damaged(detail::concat("'", field_path(where, key), "' is negative"));
  return number;
}

ModalitySchema IndexParser::parse_modality_schema(Modality modality, const Json& object,
                                                  const std::string& where) const {
  ModalitySchema schema;
  schema.modality = modality;
  schema.dim = count_field(object, where, "dim");
  if (schema.dim == 0) damaged(detail::concat("'", where, ".dim' is 0"));
  const std::string layout = string_field(object, where, "layout");
  if (layout != shard_schema::kPooledLayout && layout != shard_schema::kPerStepLayout) {
    damaged(detail::concat("'", where, ".layout' is '", layout, "', not '",
                           shard_schema::kPooledLayout, "' or '", shard_schema::kPerStepLayout,
                           "'"));
  }
  schema.per_step = layout == shard_schema::kPerStepLayout;
  schema.encoder = string_field(object, where, "encoder");
  schema.encoder_sha256 = string_field(object, where, "encoder_sha256");
  schema.pooling = string_field(object, where, "pooling");
  if (!object.contains("preprocessing")) {
    damaged(detail::concat("'", where, ".preprocessing' is missing"));
  }
  schema.preprocessing_json = json_text(object.at("preprocessing"));
  return schema;
}

IndexEntry IndexParser::parse_entry(const Json& object, const std::string& where) const {
  if (!object.is_object()) damaged(detail::concat("'", where, "' is not an object"));
  IndexEntry entry;
  entry.file = string_field(object, where, "file");
  // A name that is not exactly a shard's (a path, "..") would make a reader open, and a resume
  // delete, a file elsewhere.
  if (!is_shard_file_name(entry.file)) {
    damaged(detail::concat("'", field_path(where, "file"), "' is '", entry.file,
                           "', which is not a shard file name (shard-NNNNNN-HHHHHHHH.h5)"));
  }
  entry.shard_index = count_field(object, where, "shard_index");
  entry.first_seq = count_field(object, where, "first_seq");
  entry.seq_count = count_field(object, where, "seq_count");
  entry.num_samples = count_field(object, where, "num_samples");
  entry.num_failures = count_field(object, where, "num_failures");
  entry.failed_samples = count_field(object, where, "failed_samples");
  const std::string counts_path = field_path(where, "modality_counts");
  const Json& counts = field(object, where, "modality_counts", &Json::is_object, "an object");
  for (const auto& [name, count] : counts.items()) {
    const auto modality = parse_modality(name);
    if (!modality)
      damaged(detail::concat("'", counts_path, "' names unknown modality '", name, "'"));
    entry.modality_counts[modality_index(*modality)] =
        count_field(counts, counts_path, name.c_str());
  }
  entry.bytes = static_cast<uint64_t>(count_field(object, where, "bytes"));
  entry.sha256 = string_field(object, where, "sha256");
  return entry;
}

OutputIndex IndexParser::parse(const std::string& text) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& error) {
    damaged(detail::concat("not valid JSON (", error.what(), ")"));
  }
  if (!root.is_object()) damaged("not a JSON object");

  const std::string format = string_field(root, "", "format");
  PC_CHECK(format == kIndexFormat, StorageError, file_,
           " is not a precompute index: its format is '", format, "', not '", kIndexFormat, "'");
  const int64_t version = count_field(root, "", "format_version");
  PC_CHECK(version == kIndexFormatVersion, StorageError, "index file ", file_,
           " has format version ", version, "; this precompute reads version ", kIndexFormatVersion,
           " only");

  OutputIndex index;
  ShardMeta& meta = index.meta;
  meta.output_id = string_field(root, "", "output_id");
  if (!is_output_id(meta.output_id)) {
    damaged(detail::concat("'output_id' is '", meta.output_id, "', not an output id"));
  }
  meta.tool_version = string_field(root, "", "tool_version");
  meta.config_fingerprint = string_field(root, "", "config_fingerprint");
  if (!root.contains("config")) damaged("'config' is missing");
  meta.config_json = json_text(root.at("config"));
  meta.kept_columns = kept_columns_of_config(meta.config_json);
  const std::string dtype = string_field(root, "", "storage_dtype");
  const auto parsed_dtype = shard_schema::parse_storage_dtype(dtype);
  if (!parsed_dtype) damaged(detail::concat("'storage_dtype' is '", dtype, "'"));
  meta.dtype = *parsed_dtype;
  const int64_t chunk_rows = count_field(root, "", "chunk_rows");
  if (chunk_rows == 0 || chunk_rows > std::numeric_limits<int>::max()) {
    damaged(detail::concat("'chunk_rows' is ", chunk_rows));
  }
  meta.chunk_rows = static_cast<int>(chunk_rows);
  index.total_samples = count_field(root, "", "total_samples");
  index.shard_size = count_field(root, "", "shard_size");
  index.input = string_field(root, "", "input");
  const Json& input_samples =
      field(root, "", "input_samples", &Json::is_number_integer, "an integer");
  index.input_samples = input_samples.get<int64_t>();
  if (index.input_samples < -1) damaged("'input_samples' is below -1");
  index.input_sha256 = string_field(root, "", "input_sha256");
  // Absent in an index written before the field existed.
  if (root.contains("model_settings")) {
    const Json& settings =
        field(root, "", "model_settings", &Json::is_object, "an object");
    for (const auto& [key, setting] : settings.items()) {
      const std::string where = "model_settings." + key;
      if (!setting.is_object() || !setting.contains("value")) {
        damaged(detail::concat("'", where, "' is not an object with a value"));
      }
      index.model_settings.push_back(
          {key, setting.at("value").dump(), string_field(setting, where, "source")});
    }
  }

  const Json& modalities = field(root, "", "modalities", &Json::is_object, "an object");
  for (const auto& [name, object] : modalities.items()) {
    const auto modality = parse_modality(name);
    if (!modality) damaged(detail::concat("'modalities' names unknown modality '", name, "'"));
    if (!object.is_object()) damaged(detail::concat("'modalities.", name, "' is not an object"));
    meta.modalities[modality_index(*modality)] =
        parse_modality_schema(*modality, object, "modalities." + name);
  }

  const Json& shards = field(root, "", "shards", &Json::is_array, "an array");
  int64_t total_samples_embedded = 0;
  int64_t total_failures = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    IndexEntry entry = parse_entry(shards[i], detail::concat("shards[", i, "]"));
    if (i > 0 && entry.first_seq < index.shards.back().first_seq + index.shards.back().seq_count) {
      damaged(detail::concat("'shards[", i, "]' overlaps the shard before it or is out of order"));
    }
    total_samples_embedded += entry.num_samples;
    total_failures += entry.num_failures;
    index.shards.push_back(std::move(entry));
  }

  const Json& totals = field(root, "", "totals", &Json::is_object, "an object");
  if (count_field(totals, "totals", "samples") != total_samples_embedded ||
      count_field(totals, "totals", "failures") != total_failures) {
    damaged("'totals' do not match the sums over 'shards'");
  }
  if (!root.contains("rank")) damaged("'rank' is missing");
  if (!root.at("rank").is_null()) {
    const Json& rank = field(root, "", "rank", &Json::is_object, "an object or null");
    IndexRank r;
    r.rank = count_field(rank, "rank", "rank");
    r.world_size = count_field(rank, "rank", "world_size");
    r.first_seq = count_field(rank, "rank", "first_seq");
    r.end_seq = count_field(rank, "rank", "end_seq");
    if (r.world_size == 0 || r.rank >= r.world_size || r.first_seq > r.end_seq ||
        r.end_seq > index.total_samples) {
      damaged("'rank' is not a rank's part of the input");
    }
    index.rank = r;
  }
  const std::string checksum = string_field(root, "", "checksum");
  Json fields = root;
  fields.erase("checksum");
  if (checksum != fields_checksum(fields)) {
    damaged("its checksum does not match its fields (the file was damaged or edited)");
  }
  return index;
}

}  // namespace

IndexEntry index_entry_for(const ShardContents& contents) {
  IndexEntry entry;
  entry.shard_index = contents.shard_index;
  entry.first_seq = contents.first_seq;
  entry.seq_count = contents.seq_count;
  entry.num_samples = static_cast<int64_t>(contents.samples.size());
  entry.num_failures = static_cast<int64_t>(contents.failures.size());
  std::set<int64_t> failed;
  for (const auto& f : contents.failures) failed.insert(f.seq);
  entry.failed_samples = static_cast<int64_t>(failed.size());
  for (const auto& sample : contents.samples) {
    for (int m = 0; m < kNumModalities; ++m) {
      if (sample.embeddings[m]) ++entry.modality_counts[m];
    }
  }
  return entry;
}

std::string committed_shard_problem(const std::filesystem::path& output_dir,
                                    const IndexEntry& entry) {
  const path file = output_dir / entry.file;
  std::error_code error;
  const auto size = std::filesystem::file_size(file, error);
  if (error) return "it is missing (" + error.message() + ")";
  if (size != entry.bytes) {
    return detail::concat("its size is ", size, " bytes, not the ", entry.bytes, " recorded");
  }
  if (sha256_file(file) != entry.sha256) return "its SHA-256 differs from the one recorded";
  return {};
}

std::string write_index(const std::filesystem::path& output_dir, const OutputIndex& index) {
  crash_point("before-index");
  const std::string text = index_text(index);
  write_file_atomically(output_dir / kIndexFileName, text);
  crash_point("after-index");
  return sha256_hex(text);
}

std::string index_sha256(const OutputIndex& index) { return sha256_hex(index_text(index)); }

std::optional<OutputIndex> read_index(const std::filesystem::path& output_dir) {
  const path file = output_dir / kIndexFileName;
  std::error_code error;
  const auto status = std::filesystem::status(file, error);
  if (status.type() == std::filesystem::file_type::not_found) return std::nullopt;
  PC_CHECK(!error, StorageError, "cannot read index file ", file, ": ", error.message());

  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.is_open(), StorageError, "cannot open index file ", file, ": ",
           std::generic_category().message(errno));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  PC_CHECK(!in.bad(), StorageError, "cannot read index file ", file, ": ",
           std::generic_category().message(errno));
  return IndexParser(file).parse(text);
}

}  // namespace precompute
