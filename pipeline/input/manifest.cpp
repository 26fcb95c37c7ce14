#include "pipeline/input/manifest.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::filesystem::path resolve(const std::string& path, const std::filesystem::path& base) {
  std::filesystem::path p(path);
  return p.is_absolute() ? p : (base / p).lexically_normal();
}

// Collects samples in order, checking each one and the uniqueness of ids as it goes.
class SampleCollector {
 public:
  explicit SampleCollector(std::string name) : name_(std::move(name)) {}

  void add(SampleSpec spec) {
    PC_CHECK(!spec.id.empty(), InputError, name_, " line ", spec.line,
             ": the sample has no 'id'; give every sample a unique id");
    PC_CHECK(spec.video || spec.audio || spec.text, InputError, name_, " line ", spec.line,
             ": sample '", spec.id, "' has none of 'video', 'audio', 'text'; give at least one");
    const auto [it, inserted] = first_line_.emplace(spec.id, spec.line);
    PC_CHECK(inserted, InputError, name_, ": id '", spec.id, "' appears on line ", it->second,
             " and on line ", spec.line, "; ids must be unique");
    spec.seq = static_cast<int64_t>(samples_.size());
    samples_.push_back(std::move(spec));
  }

  std::vector<SampleSpec> take() { return std::move(samples_); }

 private:
  std::string name_;
  std::vector<SampleSpec> samples_;
  std::unordered_map<std::string, int64_t> first_line_;
};

std::optional<std::string> json_string(const nlohmann::json& obj, const char* key,
                                       const std::string& name, int64_t line) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  // Numeric ids are common in exported datasets; keep their decimal text.
  if (std::string_view(key) == "id" && it->is_number_integer()) return it->dump();
  PC_THROW(InputError, name, " line ", line, ": '", key, "' must be a string, got ", it->dump());
}

void strip_bom(std::string& line) {
  if (line.size() >= 3 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);
}

std::vector<SampleSpec> parse_jsonl(std::istream& in, const std::filesystem::path& base,
                                    const std::string& name) {
  SampleCollector samples(name);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1) strip_bom(line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range (1e999)
      PC_THROW(InputError, name, " line ", line_no, ": not valid JSON (", e.what(),
               "); every line must be one JSON object such as "
               "{\"id\": \"clip1\", \"video\": \"clip1.mp4\", \"text\": \"a caption\"}");
    }
    PC_CHECK(obj.is_object(), InputError, name, " line ", line_no,
             ": expected a JSON object with 'id' and any of 'video', 'audio', 'text'");
    SampleSpec spec;
    spec.line = line_no;
    spec.id = json_string(obj, "id", name, line_no).value_or("");
    if (auto v = json_string(obj, "video", name, line_no); v && !v->empty()) {
      spec.video = resolve(*v, base);
    }
    if (auto a = json_string(obj, "audio", name, line_no); a && !a->empty()) {
      spec.audio = resolve(*a, base);
    }
    spec.text = json_string(obj, "text", name, line_no);
    samples.add(std::move(spec));
  }
  return samples.take();
}

// One record of RFC 4180 delimited text; quoted fields may hold delimiters, quotes ("") and
// newlines. Returns false at the end of input. `line_no` advances by the physical lines read.
bool read_record(std::istream& in, char delim, std::vector<std::string>& fields, int64_t& line_no,
                 const std::string& name) {
  fields.clear();
  std::string line;
  if (!std::getline(in, line)) return false;
  ++line_no;
  const int64_t first_line = line_no;
  std::string field;
  bool quoted = false;
  bool field_was_quoted = false;
  size_t i = 0;
  while (true) {
    if (i == line.size()) {
      if (quoted) {
        // The newline belongs to the quoted field: continue on the next physical line.
        PC_CHECK(std::getline(in, line), InputError, name, " line ", first_line,
                 ": a quoted field is never closed; check the quotes (\") on this line");
        ++line_no;
        field += '\n';
        i = 0;
        continue;
      }
      break;
    }
    const char c = line[i++];
    if (quoted) {
      if (c == '"') {
        if (i < line.size() && line[i] == '"') {
          field += '"';
          ++i;
        } else {
          quoted = false;
        }
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty() && !field_was_quoted) {
      quoted = true;
      field_was_quoted = true;
    } else if (c == delim) {
      fields.push_back(std::move(field));
      field.clear();
      field_was_quoted = false;
    } else if (c == '\r' && i == line.size()) {
      // CRLF line ending.
    } else {
      field += c;
    }
  }
  fields.push_back(std::move(field));
  return true;
}

std::vector<SampleSpec> parse_delimited(std::istream& in, char delim,
                                        const std::filesystem::path& base,
                                        const std::string& name) {
  std::vector<std::string> fields;
  int64_t line_no = 0;
  PC_CHECK(read_record(in, delim, fields, line_no, name), InputError, name,
           " is empty; the first line must name the columns, e.g. id", delim, "video", delim,
           "text");
  if (!fields.empty()) strip_bom(fields[0]);
  std::map<std::string, size_t> column;
  for (size_t c = 0; c < fields.size(); ++c) {
    // Every record is checked against the header's field count below: a repeated name would
    // make that count disagree with the columns read.
    PC_CHECK(column.emplace(lower(fields[c]), c).second, InputError, name,
             " line 1: column '", fields[c], "' appears twice; name each column once");
  }
  PC_CHECK(column.count("id") == 1, InputError, name,
           " line 1: no 'id' column; the header must name an id column and any of video, audio, "
           "text");
  const auto find = [&](const char* key) -> std::optional<size_t> {
    const auto it = column.find(key);
    return it == column.end() ? std::nullopt : std::optional<size_t>(it->second);
  };
  const auto id_col = *find("id");
  const auto video_col = find("video");
  const auto audio_col = find("audio");
  const auto text_col = find("text");
  PC_CHECK(video_col || audio_col || text_col, InputError, name,
           " line 1: no 'video', 'audio' or 'text' column; name at least one in the header");

  SampleCollector samples(name);
  while (true) {
    const int64_t record_line = line_no + 1;
    if (!read_record(in, delim, fields, line_no, name)) break;
    if (fields.size() == 1 && fields[0].find_first_not_of(" \t") == std::string::npos) continue;
    PC_CHECK(fields.size() == column.size(), InputError, name, " line ", record_line, ": ",
             fields.size(), " fields, but the header has ", column.size(),
             "; quote fields that contain the delimiter");
    SampleSpec spec;
    spec.line = record_line;
    spec.id = fields[id_col];
    if (video_col && !fields[*video_col].empty()) spec.video = resolve(fields[*video_col], base);
    if (audio_col && !fields[*audio_col].empty()) spec.audio = resolve(fields[*audio_col], base);
    // An empty caption cell is kept as empty text: it becomes a failure record, not a silent gap.
    if (text_col) spec.text = fields[*text_col];
    samples.add(std::move(spec));
  }
  return samples.take();
}

enum class MediaKind { kVideo, kAudio, kCaption, kOther };

MediaKind media_kind(const std::filesystem::path& file) {
  static const std::map<std::string, MediaKind> kKinds = {
      {".mp4", MediaKind::kVideo},  {".m4v", MediaKind::kVideo},  {".mkv", MediaKind::kVideo},
      {".webm", MediaKind::kVideo}, {".avi", MediaKind::kVideo},  {".mov", MediaKind::kVideo},
      {".mpg", MediaKind::kVideo},  {".mpeg", MediaKind::kVideo}, {".ts", MediaKind::kVideo},
      {".flv", MediaKind::kVideo},  {".3gp", MediaKind::kVideo},  {".ogv", MediaKind::kVideo},
      {".wav", MediaKind::kAudio},  {".mp3", MediaKind::kAudio},  {".flac", MediaKind::kAudio},
      {".m4a", MediaKind::kAudio},  {".aac", MediaKind::kAudio},  {".ogg", MediaKind::kAudio},
      {".opus", MediaKind::kAudio}, {".txt", MediaKind::kCaption},
  };
  const auto it = kKinds.find(lower(file.extension().string()));
  return it == kKinds.end() ? MediaKind::kOther : it->second;
}

std::string read_caption(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.good(), InputError, "cannot read caption file ", file);
  std::stringstream text;
  text << in.rdbuf();
  std::string caption = text.str();
  while (!caption.empty() && (caption.back() == '\n' || caption.back() == '\r')) {
    caption.pop_back();
  }
  return caption;
}

}  // namespace

ManifestFormat manifest_format_for(const std::filesystem::path& file) {
  const auto ext = lower(file.extension().string());
  if (ext == ".jsonl" || ext == ".ndjson" || ext == ".json") return ManifestFormat::kJsonl;
  if (ext == ".csv") return ManifestFormat::kCsv;
  if (ext == ".tsv" || ext == ".tab") return ManifestFormat::kTsv;
  PC_THROW(InputError, "manifest ", file, " has extension '", ext,
           "'; use .jsonl (one JSON object per line), .csv or .tsv");
}

std::vector<SampleSpec> parse_manifest(std::istream& in, ManifestFormat format,
                                       const std::filesystem::path& base_dir,
                                       const std::string& name) {
  switch (format) {
    case ManifestFormat::kJsonl:
      return parse_jsonl(in, base_dir, name);
    case ManifestFormat::kCsv:
      return parse_delimited(in, ',', base_dir, name);
    case ManifestFormat::kTsv:
      return parse_delimited(in, '\t', base_dir, name);
  }
  PC_ASSERT(false, "unknown manifest format");
}

std::vector<SampleSpec> read_manifest(const std::filesystem::path& file) {
  const auto format = manifest_format_for(file);
  PC_CHECK(std::filesystem::is_regular_file(file), InputError, "manifest ", file,
           " does not exist or is not a file; check input.manifest or --input");
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.good(), InputError, "cannot read manifest ", file, ": check its permissions");
  auto base = std::filesystem::absolute(file).parent_path();
  return parse_manifest(in, format, base, "manifest " + file.string());
}

std::vector<SampleSpec> scan_folder(const std::filesystem::path& folder) {
  PC_CHECK(std::filesystem::is_directory(folder), InputError, "input folder ", folder,
           " does not exist or is not a folder; check input.folder or --input");
  struct Entry {
    std::optional<std::filesystem::path> video, audio, caption;
  };
  std::map<std::string, Entry> by_id;  // sorted by id = relative path without extension
  const auto take = [&](std::optional<std::filesystem::path>& slot, const std::string& id,
                        const std::filesystem::path& file) {
    PC_CHECK(!slot, InputError, "input folder ", folder, ": ", *slot, " and ", file,
             " both give sample '", id, "' the same kind of input; rename one");
    slot = file;
  };
  try {
    for (const auto& item : std::filesystem::recursive_directory_iterator(
             folder, std::filesystem::directory_options::follow_directory_symlink)) {
      if (!item.is_regular_file()) continue;
      const auto kind = media_kind(item.path());
      if (kind == MediaKind::kOther) continue;
      auto relative = item.path().lexically_relative(folder);
      const std::string id = relative.replace_extension().generic_string();
      auto& entry = by_id[id];
      if (kind == MediaKind::kVideo) take(entry.video, id, item.path());
      if (kind == MediaKind::kAudio) take(entry.audio, id, item.path());
      if (kind == MediaKind::kCaption) take(entry.caption, id, item.path());
    }
  } catch (const std::filesystem::filesystem_error& e) {
    PC_THROW(InputError, "cannot list input folder ", folder, ": ", e.what());
  }
  SampleCollector samples("input folder " + folder.string());
  int64_t file_no = 0;
  int64_t orphan_captions = 0;
  for (auto& [id, entry] : by_id) {
    if (!entry.video && !entry.audio) {
      ++orphan_captions;
      continue;
    }
    SampleSpec spec;
    spec.line = ++file_no;
    spec.id = id;
    spec.video = entry.video;
    spec.audio = entry.audio;
    if (entry.caption) spec.text = read_caption(*entry.caption);
    samples.add(std::move(spec));
  }
  if (orphan_captions > 0) {
    spdlog::warn("input folder {}: {} .txt file(s) have no video or audio file of the same name "
                 "and were ignored", folder.string(), orphan_captions);
  }
  return samples.take();
}

std::vector<SampleSpec> read_input(const std::filesystem::path& manifest,
                                   const std::filesystem::path& folder) {
  return manifest.empty() ? scan_folder(folder) : read_manifest(manifest);
}

}  // namespace precompute
