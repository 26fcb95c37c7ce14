#include "pipeline/input/manifest.hpp"

#include <spdlog/spdlog.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>
#include <tbb/task_arena.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "pipeline/core/error.hpp"
#include "pipeline/core/media_names.hpp"
#include "pipeline/input/printable_text.hpp"
#include "pipeline/input/tar_index.hpp"
#include "pipeline/input/tar_index_cache.hpp"
#include "pipeline/core/tar_header.hpp"
#include "pipeline/input/tar_shards.hpp"

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

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// Strict UTF-8 (utf8proc refuses overlong forms, surrogates and code points past U+10FFFF),
// which is what HDF5 readers such as h5py's asstr() and every JSON tool will decode.
bool is_valid_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  auto left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(bytes, left, &code_point);
    if (n <= 0) return false;
    bytes += n;
    left -= n;
  }
  return true;
}

// The NFC form of valid UTF-8 `text`, to find ids that look the same but differ in bytes.
std::string nfc(const std::string& text) {
  if (is_ascii(text)) return text;  // ASCII is its own NFC
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  // Only an allocation failure can fail here: the text was checked to be valid UTF-8.
  PC_ASSERT(n >= 0, "utf8proc cannot normalize an id: ", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

// The ids added so far, as positions into the samples that hold them, in one open-addressing
// array of (hash, position): a lookup reads one slot or a few neighbours, where a node-based map
// costs a cache miss per node (reading 1,000,000 lines on 2 cores, the adding with such a map
// was 14% of the profile, nearly all of it walking nodes).
class IdTable {
 public:
  static size_t hash(std::string_view id) { return std::hash<std::string_view>{}(id); }

  void reserve(size_t ids) {
    if (2 * ids > slots_.size()) rehash(std::bit_ceil(2 * ids));
  }

  // The position of `id` (whose hash is `h`) among `samples`, or -1.
  int64_t find(std::string_view id, size_t h, const std::vector<SampleSpec>& samples) const {
    if (slots_.empty()) return -1;
    for (size_t i = h & mask(); slots_[i].position >= 0; i = (i + 1) & mask()) {
      const auto& slot = slots_[i];
      if (slot.hash == h && samples[static_cast<size_t>(slot.position)].id == id) {
        return slot.position;
      }
    }
    return -1;
  }

  // Adds an id not in the table.
  void insert(size_t h, int64_t position) {
    if (2 * (used_ + 1) > slots_.size()) rehash(std::max<size_t>(64, 2 * slots_.size()));
    size_t i = h & mask();
    while (slots_[i].position >= 0) i = (i + 1) & mask();
    slots_[i] = {h, position};
    ++used_;
  }

 private:
  struct Slot {
    size_t hash = 0;
    int64_t position = -1;  // -1: empty
  };
  size_t mask() const { return slots_.size() - 1; }
  void rehash(size_t size) {
    std::vector<Slot> old(size);
    old.swap(slots_);
    for (const auto& slot : old) {
      if (slot.position < 0) continue;
      size_t i = slot.hash & mask();
      while (slots_[i].position >= 0) i = (i + 1) & mask();
      slots_[i] = slot;
    }
  }

  std::vector<Slot> slots_;
  size_t used_ = 0;
};

// Collects samples in order, checking each one and the uniqueness of ids as it goes. Ids are
// checked here, before any work, because each becomes an HDF5 string read back as UTF-8 text,
// and a NUL or an invalid byte would otherwise only surface when a shard is written or read.
class SampleCollector {
 public:
  // `by_line`: samples come from a manifest's lines (messages name lines), not from files.
  SampleCollector(std::string name, bool by_line) : name_(std::move(name)), by_line_(by_line) {}

  // Room for about `samples` samples, so that adding them moves none and rehashes no id. Memory
  // reserved and never written costs only address space (the table's buckets are written, so
  // their share is capped).
  void reserve(size_t samples) {
    try {
      samples_.reserve(samples);
      ids_.reserve(std::min(samples, size_t{1} << 22));
    } catch (const std::bad_alloc&) {  // only a guess: the samples grow as they come
    }
  }

  // The kept columns' names (output.keep_columns), for messages about their values.
  void keep(const std::vector<std::string>& names) { kept_ = &names; }

  void add(SampleSpec spec) {
    check(spec);
    const size_t h = IdTable::hash(spec.id);
    add_checked(std::move(spec), h);
  }

  // The checks of one sample on its own; const, so that many threads may run them at once.
  void check(const SampleSpec& spec) const {
    PC_CHECK(!spec.id.empty(), InputError, name_, where(spec.line),
             ": the sample has no 'id'; give every sample a unique id");
    PC_CHECK(spec.id.find('\0') == std::string::npos, InputError, name_, where(spec.line),
             ": the id '", printable(spec.id),
             "' contains a NUL character (shown as \\x00), which ids cannot hold; remove it");
    PC_CHECK(is_valid_utf8(spec.id), InputError, name_, where(spec.line), ": the id '",
             printable(spec.id),
             "' is not valid UTF-8 (the bad bytes are shown as \\xHH); ids must be UTF-8 text: "
             "fix the id, or convert the manifest to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
    check_path(spec.video, "video", spec);
    check_path(spec.audio, "audio", spec);
    check_columns(spec);
    PC_CHECK(spec.video || spec.audio || spec.text, InputError, name_, where(spec.line),
             ": sample '", spec.id, "' has none of 'video', 'audio', 'text'; give at least one");
  }

  // Adds a sample that passed check(): what needs the samples before it (unique ids).
  // `id_hash` is IdTable::hash(spec.id), which the threads that parse compute.
  void add_checked(SampleSpec spec, size_t id_hash) {
    const int64_t earlier = ids_.find(spec.id, id_hash, samples_);
    PC_CHECK(earlier < 0, InputError, name_, ": id '", spec.id, "' appears on line ",
             earlier < 0 ? 0 : samples_[static_cast<size_t>(earlier)].line, " and on line ",
             spec.line, "; ids must be unique");
    note_normalization(spec);
    spec.seq = static_cast<int64_t>(samples_.size());
    samples_.push_back(std::move(spec));
    ids_.insert(id_hash, samples_.back().seq);
  }

  std::vector<SampleSpec> take() {
    if (normalization_pairs_ > 0) {
      // Both are kept: they are different byte strings, and refusing would break inputs that
      // mean them as two samples. But a trainer that normalizes text would merge them.
      spdlog::warn("{}: ids '{}'{} and '{}'{} differ only in Unicode normalization (NFC vs NFD): "
                   "they look the same but are kept as two samples{}; write both the same way "
                   "(NFC) if they are meant to be one sample",
                   name_, first_pair_.first, first_pair_where_.first, first_pair_.second,
                   first_pair_where_.second,
                   normalization_pairs_ > 1
                       ? fmt::format(" ({} more such pair(s))", normalization_pairs_ - 1)
                       : std::string());
    }
    return std::move(samples_);
  }

 private:
  std::string where(int64_t line) const {
    return by_line_ ? fmt::format(" line {}", line) : std::string();
  }
  std::string in_parens(int64_t line) const {
    return by_line_ ? fmt::format(" (line {})", line) : std::string();
  }

  void check_path(const std::optional<MediaSource>& file, const char* key,
                  const SampleSpec& spec) const {
    // Opening the file would silently cut the path at the NUL and read another file.
    PC_CHECK(!file || file->file.native().find('\0') == std::string::npos, InputError, name_,
             where(spec.line), ": the '", key, "' path '", printable(file->file.native()),
             "' contains a NUL character (shown as \\x00), which no file name can hold; "
             "fix the path");
  }

  // A kept column's value becomes an HDF5 string read back as UTF-8 text, like an id: a NUL would
  // cut it short, a byte that is not UTF-8 would fail every reader (Note [Kept columns]).
  void check_columns(const SampleSpec& spec) const {
    const size_t kept = kept_ ? kept_->size() : 0;
    PC_ASSERT(spec.columns.size() == kept, "sample with ", spec.columns.size(), " kept values of ",
              kept, " columns");
    for (size_t i = 0; i < kept; ++i) {
      const std::string& value = spec.columns[i];
      const std::string& column = (*kept_)[i];
      PC_CHECK(value.find('\0') == std::string::npos, InputError, name_, where(spec.line),
               ": the value of kept column '", column, "' of sample '", printable(spec.id),
               "' contains a NUL character, which a stored string cannot hold; remove it, or "
               "leave the column out of output.keep_columns");
      PC_CHECK(is_valid_utf8(value), InputError, name_, where(spec.line),
               ": the value of kept column '", column, "' of sample '", printable(spec.id),
               "' is not valid UTF-8 ('", printable(value.substr(0, 80)),
               "', the bad bytes shown as \\xHH); kept columns are stored as UTF-8 text: fix "
               "it, or convert the manifest to UTF-8 (e.g. iconv -f latin1 -t utf-8)");
    }
  }

  void note_normalization(const SampleSpec& spec) {
    // An ASCII id is its own NFC form: its look-alikes find it in ids_ below.
    if (is_ascii(spec.id)) return;
    std::string key = nfc(spec.id);
    std::optional<std::pair<std::string, int64_t>> earlier;  // its look-alike: id, line
    if (key != spec.id) {
      if (const int64_t at = ids_.find(key, IdTable::hash(key), samples_); at >= 0) {
        earlier.emplace(key, samples_[static_cast<size_t>(at)].line);
      }
    }
    if (!earlier) {
      const auto [it, inserted] = by_nfc_.emplace(std::move(key), samples_.size());
      if (inserted) return;
      earlier.emplace(samples_[it->second].id, samples_[it->second].line);
    }
    // Exact duplicates were refused before: here the bytes differ and the NFC forms do not.
    if (normalization_pairs_++ == 0) {
      first_pair_ = {earlier->first, spec.id};
      first_pair_where_ = {in_parens(earlier->second), in_parens(spec.line)};
    }
  }

  std::string name_;
  bool by_line_;
  const std::vector<std::string>* kept_ = nullptr;
  std::vector<SampleSpec> samples_;
  IdTable ids_;
  std::unordered_map<std::string, size_t> by_nfc_;  // NFC of non-ASCII ids -> first in samples_
  int64_t normalization_pairs_ = 0;
  std::pair<std::string, std::string> first_pair_;
  std::pair<std::string, std::string> first_pair_where_;
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

// UTF-8's byte order mark, which some editors write at the start of a file.
constexpr std::string_view kByteOrderMark = "\xEF\xBB\xBF";

void strip_bom(std::string& line) {
  if (std::string_view(line).substr(0, 3) == kByteOrderMark) line.erase(0, 3);
}

// Note [Kept columns]
// output.keep_columns names manifest columns that are stored per sample next to the vectors, as
// UTF-8 strings (/columns/<name> of each shard, docs/format.md), so that a trainer needs no
// second join. In CSV/TSV a kept column must be in the header (matched as the other columns are,
// ignoring case); in JSONL it must be a key of at least one line (a name no line has is a typo),
// and a line without it, or with null, gives "". Tar input reads them from each sample's .json
// member, checked as a JSONL line (member_columns). A JSON string is stored as its text (escapes
// decoded), any other JSON value as the line writes it (Note [Kept values as written]). Values
// are checked like ids: a NUL or bytes that are not UTF-8 stop the run before any work (exit
// 65), naming the line and the column.
// The values are part of the input's identity (input_identity() in pipeline/resume.cpp), so a
// resume after a kept value was edited is refused instead of mixing old and new values; the
// list itself is in the config fingerprint, left out while empty so that fingerprints made before
// the key existed stay as they were.

// Note [Kept values as written]
// A kept JSONL value that is not a JSON string (a number, true, false, an array, an object) is
// stored as the bytes the line writes for it, from its first byte to its last, blanks inside
// included: a trainer reads back what the manifest says. Written out again from nlohmann's tree it
// would be another text, and for numbers at times another value (-0 becomes 0, 1E5 100000.0,
// 1e-400 0.0, a 30-digit integer 1.2345678901234568e+29; [1, 2] loses its blank). nlohmann's
// parser still judges each line (valid JSON, one object) and gives the strings, decoded; then one
// pass over the line's bytes (top_level_members) finds where each of the object's members is
// written, following only the structure the parser has already accepted. That pass is also what
// finds a repeated key, which the parser takes silently (it keeps the last value, as Python's json
// does; other readers keep the first, or refuse): an object with more members than distinct keys
// has one, and the line is refused naming the key, compared as decoded ("label" and "\u006cabel"
// are one key). Any key of the line's object counts, kept or not (a second "id" or "text" is as
// ambiguous as a second label). Keys inside a value are not checked: a kept object or array is
// stored as written, a repeated key in it included, for the trainer's JSON reader to judge as it
// judges any JSON. A number beyond a double's range (1e400) the parser refuses, whatever its key:
// the message says to write it as a string, which keeps its text. The pass costs about 5% of
// reading a manifest's lines (tools/bench/manifest_bench); where values that are not strings are
// kept it pays for itself, since no value is written out again.

// A member of a JSON object as the text writes it: the key between its quotes (escapes not
// decoded), and the value from its first byte to its last.
struct JsonMember {
  std::string_view key;
  std::string_view value;
};

bool is_json_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The end of the JSON string whose opening quote is text[at]: the index past its closing quote.
size_t past_json_string(std::string_view text, size_t at) {
  size_t i = at + 1;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') return i + 1;
    i += c == '\\' ? 2 : 1;  // a backslash and the character it escapes
  }
  PC_ASSERT(false, "a JSON string the parser accepted is not closed");
}

// The end of the valid JSON value that starts at text[at]: the index past its last byte.
size_t past_json_value(std::string_view text, size_t at) {
  PC_ASSERT(at < text.size(), "a JSON member the parser accepted has no value");
  const char first = text[at];
  if (first == '"') return past_json_string(text, at);
  if (first == '{' || first == '[') {
    size_t depth = 0;  // a counter, not a stack: the parser has matched the brackets
    for (size_t i = at; i < text.size();) {
      const char c = text[i];
      if (c == '"') {
        i = past_json_string(text, i);
        continue;
      }
      if (c == '{' || c == '[') {
        ++depth;
      } else if ((c == '}' || c == ']') && --depth == 0) {
        return i + 1;
      }
      ++i;
    }
    PC_ASSERT(false, "a JSON array or object the parser accepted is not closed");
  }
  // A number, true, false or null: up to the blank, comma or bracket after it.
  size_t i = at;
  while (i < text.size() && !is_json_blank(text[i]) && text[i] != ',' && text[i] != '}' &&
         text[i] != ']') {
    ++i;
  }
  return i;
}

// The members of the object that `line` holds, in order, into `members` (Note [Kept values as
// written]). The line must be one the parser accepted as an object.
void top_level_members(std::string_view line, std::vector<JsonMember>& members) {
  members.clear();
  // The parser skips a byte order mark that opens its input, on any line.
  size_t i = line.substr(0, 3) == kByteOrderMark ? 3 : 0;
  const auto skip_blanks = [&] {
    while (i < line.size() && is_json_blank(line[i])) ++i;
  };
  // Past the next byte that is not a blank, which the parser's grammar says is one of `bytes`.
  const auto take = [&](std::string_view bytes) {
    skip_blanks();
    PC_ASSERT(i < line.size() && bytes.find(line[i]) != std::string_view::npos,
              "an object the JSON parser accepted has no ", bytes, " at byte ", i);
    return line[i++];
  };
  take("{");
  skip_blanks();
  if (i < line.size() && line[i] == '}') return;
  while (true) {
    take("\"");
    const size_t key_end = past_json_string(line, i - 1);
    const std::string_view key = line.substr(i, key_end - 1 - i);
    i = key_end;
    take(":");
    skip_blanks();
    const size_t value_end = past_json_value(line, i);
    members.push_back({key, line.substr(i, value_end - i)});
    i = value_end;
    if (take(",}") == '}') return;
  }
}

// A key as written between its quotes, as text: its escapes decoded.
std::string decoded_key(std::string_view written) {
  if (written.find('\\') == std::string_view::npos) return std::string(written);
  std::string quoted;
  quoted.reserve(written.size() + 2);
  quoted.append(1, '"').append(written).append(1, '"');
  return nlohmann::json::parse(quoted).get<std::string>();  // valid: the line's parse read it
}

// Refuses a line whose object repeats a key (Note [Kept values as written]). `distinct` is the
// number of keys the parsed object holds, one per key however often it was written.
void check_keys_unique(const std::vector<JsonMember>& members, size_t distinct,
                       const std::string& name, int64_t line_no) {
  if (members.size() == distinct) return;
  std::unordered_map<std::string, std::string_view> first_written;  // decoded -> as written
  for (const auto& member : members) {
    const auto [it, added] = first_written.emplace(decoded_key(member.key), member.key);
    if (added) continue;
    const std::string spellings =
        it->second == member.key
            ? std::string()
            : fmt::format(" (written \"{}\" and \"{}\", the same key once decoded)",
                          printable(it->second), printable(member.key));
    PC_THROW(InputError, name, " line ", line_no, ": the key '", printable(it->first),
             "' appears twice", spellings,
             "; JSON readers differ on which of its values counts (the first, the last, or "
             "neither), so the line would mean different things to different tools: remove one");
  }
  PC_ASSERT(false, "an object of ", distinct, " keys has ", members.size(),
            " members, none repeated");
}

// The value that `members` writes for the key `key` (compared decoded), which it must have.
std::string_view written_value(const std::vector<JsonMember>& members, const std::string& key) {
  for (const auto& member : members) {
    const bool escaped = member.key.find('\\') != std::string_view::npos;
    if (escaped ? decoded_key(member.key) == key : member.key == key) return member.value;
  }
  PC_ASSERT(false, "the parsed object's key '", printable(key), "' is not among its members");
}

// Note [The keys of a JSONL manifest]
// A config is checked against the keys the manifest's lines have (Note [A modality that no line
// feeds] in input_columns.cpp), so the reader collects them as it parses: the thread that parses
// a block notes its lines' keys, and the thread that adds the samples merges the blocks' in
// order. Nearly every line has the keys of the line before, in the same order, which one
// comparison of a few views into the block settles; a line with other keys has them decoded and
// looked up. At most kMaxColumnNames keys are kept, so that a manifest whose keys are data (an
// id as a key) costs no more than that.

// Distinct names in the order first seen, at most kMaxColumnNames; `more`: there were more.
struct ColumnNames {
  std::vector<std::string> names;
  bool more = false;

  void add(std::string name) {
    if (std::find(names.begin(), names.end(), name) != names.end()) return;
    if (names.size() < kMaxColumnNames) {
      names.push_back(std::move(name));
    } else {
      more = true;
    }
  }
  void clear() {
    names.clear();
    more = false;
  }
};

// Adds the keys of a line's `members` to `keys`. `previous` holds the keys, as written, of the
// last line added, and becomes this line's.
void note_keys(const std::vector<JsonMember>& members, std::vector<std::string_view>& previous,
               ColumnNames& keys) {
  const bool same =
      members.size() == previous.size() &&
      std::equal(members.begin(), members.end(), previous.begin(),
                 [](const JsonMember& member, std::string_view key) { return member.key == key; });
  if (same || keys.more) return;
  previous.clear();
  for (const auto& member : members) {
    previous.push_back(member.key);
    keys.add(decoded_key(member.key));
  }
}

// Note [Parsing a manifest on every core]
// Parsing each line's JSON and checking its sample is nearly all of reading a manifest, and on
// one thread it was a quarter of a 1,000,000-caption text job (docs/benchmarks.md, "What bounds
// it, and the start-up timeline"). So the file is read in blocks of whole lines, and three stages
// run at once (a oneTBB pipeline): one thread reads the next blocks, every core parses and checks
// the lines of a block each, and one thread adds the parsed samples in order, doing only what
// needs the lines before (unique ids, look-alike ids). Lines are views into their block, so that
// neither the reading nor the adding allocates a string per line. A line's error is kept and
// thrown when the adding reaches the line, so the error reported is the first a line-by-line
// read meets, whatever the threads did first.

// One line of a JSONL manifest as a sample (none for a blank line). `seen` marks the kept
// columns the line has; it may be shared by threads. `members` is room for the line's members,
// reused from line to line.
std::optional<SampleSpec> parse_jsonl_line(std::string_view line, int64_t line_no,
                                           const std::filesystem::path& base,
                                           const std::string& name,
                                           const std::vector<std::string>& keep_columns,
                                           std::atomic<bool>* seen,
                                           std::vector<JsonMember>& members) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.find_first_not_of(" \t") == std::string_view::npos) return std::nullopt;
  // JSON text holds no raw NUL (in a string it is written \u0000), and nlohmann's parser takes
  // one for the end of the input: the rest of the line would be dropped without a word.
  const size_t nul = line.find('\0');
  PC_CHECK(nul == std::string_view::npos, InputError, name, " line ", line_no,
           ": a NUL byte at column ", nul + 1,
           ", which JSON text cannot hold (inside a string write it as \\u0000); remove it, or "
           "check that the file is a text JSONL manifest");
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::out_of_range& e) {
    // The parser holds a number as a 64-bit integer or a double, and refuses what a double
    // cannot hold: as a string, the value is kept as its text.
    PC_THROW(InputError, name, " line ", line_no, ": a number beyond what a double holds (",
             e.what(),
             "), which the JSON parser refuses; write it as a string (in quotes) to keep its "
             "text, or as a number a double holds");
  } catch (const nlohmann::json::exception& e) {
    PC_THROW(InputError, name, " line ", line_no, ": not valid JSON (", e.what(),
             "); every line must be one JSON object such as "
             "{\"id\": \"clip1\", \"video\": \"clip1.mp4\", \"text\": \"a caption\"}");
  }
  PC_CHECK(obj.is_object(), InputError, name, " line ", line_no,
           ": expected a JSON object with 'id' and any of 'video', 'audio', 'text'");
  top_level_members(line, members);
  check_keys_unique(members, obj.size(), name, line_no);
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
  if (!spec.video && !spec.audio && !spec.text && !spec.id.empty()) {
    // SampleCollector::check() refuses such a line too; here the message can list the line's
    // keys, where a misspelled one ('vid', 'caption') shows at a glance.
    constexpr size_t kKeysShown = 24;
    std::string keys;
    for (size_t i = 0; i < members.size() && i < kKeysShown; ++i) {
      keys += fmt::format("{}'{}'", i == 0 ? "" : ", ", printable(decoded_key(members[i].key)));
    }
    if (members.size() > kKeysShown) {
      keys += fmt::format(" and {} more", members.size() - kKeysShown);
    }
    PC_THROW(InputError, name, " line ", line_no, ": sample '", printable(spec.id),
             "' has none of 'video', 'audio', 'text' (a null value or an empty path gives none); "
             "the line has the keys ", keys, ": give at least one (keys are case-sensitive)");
  }
  spec.columns.reserve(keep_columns.size());
  for (size_t k = 0; k < keep_columns.size(); ++k) {
    const auto it = obj.find(keep_columns[k]);
    if (it == obj.end()) {
      spec.columns.emplace_back();
      continue;
    }
    seen[k].store(true, std::memory_order_relaxed);
    if (it->is_null()) {
      spec.columns.emplace_back();
    } else if (it->is_string()) {
      spec.columns.push_back(it->get<std::string>());
    } else {
      spec.columns.emplace_back(written_value(members, keep_columns[k]));
    }
  }
  return spec;
}

// Whole lines of a manifest, read together: `text` ends at a line's end (or the file's), and
// `lines` views it, as std::getline would cut it (no newline kept; a last line without one).
struct ManifestBlock {
  std::string text;
  std::vector<std::string_view> lines;
  int64_t first_line = 1;
  struct Parsed {
    std::optional<SampleSpec> spec;  // none: a blank line
    size_t id_hash = 0;              // IdTable::hash of its id
    std::exception_ptr error;
  };
  std::vector<Parsed> parsed;
  ColumnNames keys;  // the keys its lines have (Note [The keys of a JSONL manifest])
};

// Reads `in` in blocks of whole lines of about kBlockBytes; a longer line makes a block alone.
class ManifestBlockReader {
 public:
  explicit ManifestBlockReader(std::istream& in) : in_(in) {}

  // Fills `block` (a new one, or one used before, whose buffers are kept) with the next lines;
  // false at the end of the input.
  bool next(ManifestBlock& block) {
    block.first_line = next_line_;
    block.lines.clear();
    block.parsed.clear();
    std::string& text = block.text;
    text.clear();
    text.swap(carry_);  // the part of a line the previous block left
    size_t end = std::string::npos;  // one past the last whole line's newline
    while (!eof_) {
      const size_t searched = text.size();
      text.resize(searched + kBlockBytes);
      in_.read(text.data() + searched, static_cast<std::streamsize>(kBlockBytes));
      text.resize(searched + static_cast<size_t>(in_.gcount()));
      if (in_.gcount() < static_cast<std::streamsize>(kBlockBytes)) eof_ = true;
      // Only the bytes just read: a long line is searched once, not once per read.
      const size_t last_newline = std::string_view(text).substr(searched).rfind('\n');
      if (last_newline != std::string_view::npos) {
        end = searched + last_newline + 1;
        break;
      }
    }
    if (end == std::string::npos) end = text.size();  // the file's last line, without a newline
    carry_.assign(text, end, std::string::npos);
    text.resize(end);
    if (text.empty()) return false;
    std::string_view rest(text);
    if (next_line_ == 1 && rest.substr(0, 3) == kByteOrderMark) rest.remove_prefix(3);
    while (!rest.empty()) {
      const size_t newline = rest.find('\n');
      block.lines.push_back(rest.substr(0, newline));
      if (newline == std::string_view::npos) break;
      rest.remove_prefix(newline + 1);
    }
    next_line_ += static_cast<int64_t>(block.lines.size());
    return true;
  }

 private:
  static constexpr size_t kBlockBytes = size_t{1} << 20;
  std::istream& in_;
  std::string carry_;
  int64_t next_line_ = 1;
  bool eof_ = false;
};

// The bytes left in `in` when it can tell (a file, a string), else 0; `in` stays where it was.
int64_t bytes_left(std::istream& in) {
  const auto here = in.tellg();
  if (here < 0) {
    in.clear();
    return 0;
  }
  in.seekg(0, std::ios::end);
  const auto end = in.tellg();
  in.clear();
  in.seekg(here);
  return end > here ? static_cast<int64_t>(end - here) : 0;
}

// The samples of a manifest of `bytes`, judged by its first block's lines; never more than a
// sample for every 16 bytes (the shortest sample line, {"id":1,"text":""}, has 18), whatever
// blank lines the first block holds.
size_t estimated_lines(const ManifestBlock& first, int64_t bytes) {
  if (first.text.empty()) return 0;
  const double per_line = static_cast<double>(first.text.size()) /
                          static_cast<double>(std::max<size_t>(first.lines.size(), 1));
  const double guess = 1.02 * static_cast<double>(bytes) / per_line + 16;
  return static_cast<size_t>(std::min(guess, static_cast<double>(bytes / 16 + 16)));
}

std::vector<SampleSpec> parse_jsonl(std::istream& in, const std::filesystem::path& base,
                                    const std::string& name,
                                    const std::vector<std::string>& keep_columns,
                                    InputColumns* columns) {
  SampleCollector samples(name, /*by_line=*/true);
  samples.keep(keep_columns);
  const auto seen = std::make_unique<std::atomic<bool>[]>(keep_columns.size());
  const int64_t bytes = bytes_left(in);
  ManifestBlockReader reader(in);
  // The blocks are owned here and go from stage to stage as plain pointers, which oneTBB passes
  // on as they are: a class type (a shared_ptr) it keeps in storage of its own, which a pipeline
  // that an error (a bad line) cancels leaves unfreed (LeakSanitizer found it). A block the
  // adding is done with is used again.
  std::vector<std::unique_ptr<ManifestBlock>> blocks;
  std::vector<ManifestBlock*> free_blocks;
  std::mutex blocks_mutex;
  ColumnNames keys;  // of every line, merged block by block
  // Blocks in flight: enough to keep every core parsing while the adding catches up.
  const auto tokens = static_cast<size_t>(4 * std::max(1, tbb::this_task_arena::max_concurrency()));
  tbb::parallel_pipeline(
      tokens,
      tbb::make_filter<void, ManifestBlock*>(
          tbb::filter_mode::serial_in_order,
          [&](tbb::flow_control& control) -> ManifestBlock* {
            ManifestBlock* block = nullptr;
            {
              const std::lock_guard lock(blocks_mutex);
              if (free_blocks.empty()) {
                blocks.push_back(std::make_unique<ManifestBlock>());
                free_blocks.push_back(blocks.back().get());
              }
              block = free_blocks.back();
              free_blocks.pop_back();
            }
            if (!reader.next(*block)) {
              control.stop();
              return nullptr;
            }
            if (block->first_line == 1 && bytes > 0) {
              samples.reserve(estimated_lines(*block, bytes));
            }
            return block;
          }) &
          tbb::make_filter<ManifestBlock*, ManifestBlock*>(
              tbb::filter_mode::parallel,
              [&](ManifestBlock* block) {
                std::vector<JsonMember> members;
                std::vector<std::string_view> previous_keys;
                block->keys.clear();
                block->parsed.resize(block->lines.size());
                for (size_t i = 0; i < block->lines.size(); ++i) {
                  auto& parsed = block->parsed[i];
                  try {
                    parsed.spec = parse_jsonl_line(block->lines[i],
                                                   block->first_line + static_cast<int64_t>(i),
                                                   base, name, keep_columns, seen.get(),
                                                   members);
                    if (parsed.spec) {
                      samples.check(*parsed.spec);
                      parsed.id_hash = IdTable::hash(parsed.spec->id);
                      note_keys(members, previous_keys, block->keys);
                    }
                  } catch (...) {
                    parsed.spec.reset();
                    parsed.error = std::current_exception();
                  }
                }
                return block;
              }) &
          tbb::make_filter<ManifestBlock*, void>(
              tbb::filter_mode::serial_in_order, [&](ManifestBlock* block) {
                for (auto& parsed : block->parsed) {
                  if (parsed.error) std::rethrow_exception(parsed.error);
                  if (parsed.spec) samples.add_checked(std::move(*parsed.spec), parsed.id_hash);
                }
                if (!keys.more) {
                  for (auto& key : block->keys.names) keys.add(std::move(key));
                  keys.more = keys.more || block->keys.more;
                }
                const std::lock_guard lock(blocks_mutex);
                free_blocks.push_back(block);
              }));
  for (size_t k = 0; k < keep_columns.size(); ++k) {
    PC_CHECK(seen[k].load(), InputError, name, ": no line has the key '",
             printable(keep_columns[k]),
             "' that output.keep_columns names; check its spelling (keys are case-sensitive), "
             "or leave it out of output.keep_columns");
  }
  if (columns != nullptr) {
    columns->layout = InputLayout::kJsonl;
    columns->name = name;
    columns->names = std::move(keys.names);
    columns->more_names = keys.more;
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
                                        const std::string& name,
                                        const std::vector<std::string>& keep_columns,
                                        InputColumns* columns) {
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
  if (!video_col && !audio_col && !text_col) {
    std::string names;  // a misspelled column ('vid', 'caption') shows among them
    for (const auto& field : fields) {
      names += fmt::format("{}'{}'", names.empty() ? "" : ", ", printable(field));
    }
    PC_THROW(InputError, name, " line 1: no 'video', 'audio' or 'text' column (the header names ",
             names, "; matched ignoring case); name at least one in the header");
  }
  std::vector<size_t> kept_cols;
  for (const auto& kept : keep_columns) {
    const auto col = find(lower(kept).c_str());
    PC_CHECK(col, InputError, name, " line 1: no column '", printable(kept),
             "', which output.keep_columns names; the header has ", fields.size(),
             " column(s): check the spelling, or leave it out of output.keep_columns");
    kept_cols.push_back(*col);
  }
  if (columns != nullptr) {
    columns->layout = InputLayout::kDelimited;
    columns->name = name;
    columns->names = fields;
  }

  SampleCollector samples(name, /*by_line=*/true);
  samples.keep(keep_columns);
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
    for (const size_t col : kept_cols) spec.columns.push_back(fields[col]);
    samples.add(std::move(spec));
  }
  return samples.take();
}

// Every regular file under `folder`, following links to folders. A folder reached a second
// time (same device and inode: a symlink loop, or a second link to it) is not entered again,
// and an entry that cannot be stat'ed (a dangling or self-referencing link) is skipped: each
// with a warning, so that one bad link does not refuse the whole input. Children are visited in
// sorted order, so which of two links to a folder is kept does not depend on the file system.
std::vector<std::filesystem::path> regular_files_under(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::set<std::pair<dev_t, ino_t>> visited;
  struct stat info {};
  if (::stat(folder.c_str(), &info) != 0) {
    const int stat_error = errno;  // before anything else can change it
    PC_THROW(InputError, "cannot read input folder ", folder, ": ", std::strerror(stat_error));
  }
  visited.emplace(info.st_dev, info.st_ino);
  std::vector<fs::path> pending{folder};  // folders still to list, the next one last
  while (!pending.empty()) {
    const fs::path dir = std::move(pending.back());
    pending.pop_back();
    std::vector<fs::path> children;
    std::error_code error;
    for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
      children.push_back(it->path());
    }
    PC_CHECK(!error, InputError, "cannot list folder ", dir, " of input folder ", folder, ": ",
             error.message(), "; check its permissions or leave it out of the input folder");
    std::sort(children.begin(), children.end());
    std::vector<fs::path> subfolders;
    for (auto& child : children) {
      if (::stat(child.c_str(), &info) != 0) {
        const int stat_error = errno;  // before anything else can change it
        spdlog::warn("input folder {}: skipped '{}': {} (a dangling or looping link?); fix or "
                     "remove it to include it", folder.string(), printable(child.string()),
                     std::strerror(stat_error));
      } else if (S_ISDIR(info.st_mode)) {
        if (visited.emplace(info.st_dev, info.st_ino).second) {
          subfolders.push_back(std::move(child));
        } else {
          spdlog::warn("input folder {}: skipped '{}': it leads to a folder already scanned (a "
                       "symlink loop, or a second link to the same folder)",
                       folder.string(), printable(child.string()));
        }
      } else if (S_ISREG(info.st_mode)) {
        files.push_back(std::move(child));
      }
    }
    pending.insert(pending.end(), std::make_move_iterator(subfolders.rbegin()),
                   std::make_move_iterator(subfolders.rend()));
  }
  return files;
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
                                       const std::string& name,
                                       const std::vector<std::string>& keep_columns,
                                       InputColumns* columns) {
  switch (format) {
    case ManifestFormat::kJsonl:
      return parse_jsonl(in, base_dir, name, keep_columns, columns);
    case ManifestFormat::kCsv:
      return parse_delimited(in, ',', base_dir, name, keep_columns, columns);
    case ManifestFormat::kTsv:
      return parse_delimited(in, '\t', base_dir, name, keep_columns, columns);
  }
  PC_ASSERT(false, "unknown manifest format");
}

std::vector<SampleSpec> read_manifest(const std::filesystem::path& file,
                                      const std::vector<std::string>& keep_columns,
                                      InputColumns* columns) {
  const auto format = manifest_format_for(file);
  PC_CHECK(std::filesystem::is_regular_file(file), InputError, "manifest ", file,
           " does not exist or is not a file; check input.manifest or --input");
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.good(), InputError, "cannot read manifest ", file, ": check its permissions");
  auto base = std::filesystem::absolute(file).parent_path();
  return parse_manifest(in, format, base, "manifest " + file.string(), keep_columns, columns);
}

std::vector<SampleSpec> scan_folder(const std::filesystem::path& folder, InputColumns* columns) {
  PC_CHECK(std::filesystem::is_directory(folder), InputError, "input folder ", folder,
           " does not exist or is not a folder; check input.folder or --input");
  struct Entry {
    std::optional<std::filesystem::path> video, audio, caption;
  };
  std::map<std::string, Entry> by_id;  // sorted by id = relative path without extension
  InputColumns found;
  found.layout = InputLayout::kFolder;
  found.name = "input folder " + folder.string();
  const auto take = [&](std::optional<std::filesystem::path>& slot, const std::string& id,
                        const std::filesystem::path& file) {
    PC_CHECK(!slot, InputError, "input folder ", folder, ": ", *slot, " and ", file,
             " both give sample '", id, "' the same kind of input; rename one");
    slot = file;
  };
  for (const auto& file : regular_files_under(folder)) {
    const auto kind = media_kind(file);
    if (kind == MediaKind::kOther) continue;
    auto relative = file.lexically_relative(folder);
    // The id is made of the name: the file, not a manifest line, is what to fix.
    PC_CHECK(is_valid_utf8(relative.native()), InputError, "input folder ", folder,
             ": the file name '", printable(relative.native()),
             "' is not valid UTF-8 (the bad bytes are shown as \\xHH), but sample ids are made "
             "from file names and must be UTF-8 text; rename the file (e.g. convmv -f latin1 "
             "-t utf-8)");
    const std::string id = relative.replace_extension().generic_string();
    auto& entry = by_id[id];
    if (kind == MediaKind::kVideo) take(entry.video, id, file);
    if (kind == MediaKind::kAudio) take(entry.audio, id, file);
    if (kind == MediaKind::kCaption) take(entry.caption, id, file);
    ++(kind == MediaKind::kVideo   ? found.video_files
       : kind == MediaKind::kAudio ? found.audio_files
                                   : found.caption_files);
  }
  SampleCollector samples("input folder " + folder.string(), /*by_line=*/false);
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
  found.lone_captions = orphan_captions;
  if (columns != nullptr) *columns = std::move(found);
  return samples.take();
}

namespace {

// What a sample's .json member may hold (output.keep_columns reads it whole).
constexpr int64_t kMaxJsonMemberBytes = 16 << 20;

// A member whose header is not in front of its bytes any more: the tar changed since its index
// was read (Note [A member's header is read again before its bytes]).
struct MovedMember : InputError {
  using InputError::InputError;
};

// The first `size` bytes of a member, read with the header in front of them, which must still be
// the member's (MovedMember otherwise).
std::string read_member(const std::filesystem::path& tar, const TarMember& member, int64_t size) {
  const auto length = static_cast<size_t>(std::min(size, member.size));
  std::string bytes(static_cast<size_t>(kTarBlock) + length, '\0');
  std::ifstream in(tar, std::ios::binary);
  in.seekg(member.offset - kTarBlock);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  PC_CHECK(member.offset >= kTarBlock && in.good(), InputError, "cannot read member '",
           printable(member.name), "' of tar ", tar, ": the tar changed while it was read");
  const std::string mismatch = member_header_mismatch(
      reinterpret_cast<const unsigned char*>(bytes.data()), member.name, member.size);
  if (!mismatch.empty()) {
    throw MovedMember(detail::concat("tar ", tar, " member '", printable(member.name), "': ",
                                     mismatch, ": the tar changed since its headers were read"),
                      __FILE__, __LINE__);
  }
  bytes.erase(0, static_cast<size_t>(kTarBlock));
  return bytes;
}

// A caption member's text, at most `max_bytes` + 1 bytes of it: enough for the text stage to
// record a longer one as too_large without holding all of a hostile member in memory.
std::string read_member_caption(const std::filesystem::path& tar, const TarMember& member,
                                int64_t max_bytes) {
  std::string caption =
      read_member(tar, member, max_bytes < INT64_MAX ? max_bytes + 1 : max_bytes);
  while (!caption.empty() && (caption.back() == '\n' || caption.back() == '\r')) {
    caption.pop_back();
  }
  return caption;
}

// The members of a tar that the input pass reads (captions, and .json members for kept
// columns), each read once, by its position in the index. MovedMember when one is not where the
// index says.
std::unordered_map<size_t, std::string> read_small_members(const TarIndex& index,
                                                           bool read_json,
                                                           int64_t max_caption_bytes) {
  std::unordered_map<size_t, std::string> texts;
  for (size_t m = 0; m < index.members.size(); ++m) {
    const TarMember& member = index.members[m];
    if (!member.refusal.empty()) continue;
    const std::filesystem::path name(member.name);
    const auto kind = media_kind(name);
    if (kind == MediaKind::kCaption) {
      texts.emplace(m, read_member_caption(index.tar, member, max_caption_bytes));
    } else if (read_json && kind == MediaKind::kOther &&
               lower(name.extension().string()) == ".json" && member.size <= kMaxJsonMemberBytes) {
      texts.emplace(m, read_member(index.tar, member, member.size));
    }
  }
  return texts;
}

// The kept columns' values from a sample's .json member (Note [Kept columns]): its top-level
// fields, a string as its text, null or absent as "", any other value as the member writes it.
// The member is checked as a JSONL line is: one object, no key written twice, no raw NUL.
std::vector<std::string> member_columns(const std::filesystem::path& tar, const TarMember& member,
                                        const std::string& text,
                                        const std::vector<std::string>& keep_columns,
                                        std::vector<char>& seen) {
  const std::string where = "tar " + printable(tar.string()) + " member '" +
                            printable(member.name) + "'";
  PC_CHECK(member.refusal.empty(), InputError, where, ": ", member.refusal,
           "; its columns cannot be read (output.keep_columns)");
  PC_CHECK(member.size <= kMaxJsonMemberBytes, InputError, where, ": ", member.size,
           " bytes of JSON, over the ", kMaxJsonMemberBytes,
           " bytes a sample's fields may take; keep large data out of the .json member");
  PC_CHECK(text.find('\0') == std::string::npos, InputError, where,
           ": a NUL byte, which JSON text cannot hold; make the member valid JSON");
  nlohmann::json obj;
  try {
    obj = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    PC_THROW(InputError, where, ": not a JSON object (", e.what(),
             "); output.keep_columns reads the sample's fields from it");
  }
  PC_CHECK(obj.is_object(), InputError, where,
           ": not a JSON object; output.keep_columns reads the sample's fields from it");
  std::vector<JsonMember> members;
  top_level_members(text, members);
  check_keys_unique(members, obj.size(), where, 1);
  std::vector<std::string> values;
  values.reserve(keep_columns.size());
  for (size_t k = 0; k < keep_columns.size(); ++k) {
    const auto it = obj.find(keep_columns[k]);
    if (it == obj.end() || it->is_null()) {
      values.emplace_back();
      seen[k] = seen[k] || it != obj.end();
      continue;
    }
    seen[k] = 1;
    values.push_back(it->is_string() ? it->get<std::string>()
                                     : std::string(written_value(members, keep_columns[k])));
  }
  return values;
}

}  // namespace

std::vector<SampleSpec> read_tars(const std::vector<std::filesystem::path>& tars,
                                  const std::vector<std::string>& keep_columns,
                                  InputColumns* columns, int64_t max_caption_bytes,
                                  TarIndexCache* tar_indexes) {
  PC_ASSERT(!tars.empty(), "no tar to read");
  const std::string name = tars.size() == 1
                               ? "tar " + tars.front().string()
                               : fmt::format("{} tar shards ({} ... {})", tars.size(),
                                             tars.front().string(), tars.back().string());
  InputColumns found;
  found.layout = InputLayout::kFolder;
  found.name = name;
  SampleCollector samples(name, /*by_line=*/false);
  samples.keep(keep_columns);
  std::vector<char> seen(keep_columns.size(), 0);  // kept columns some .json member has
  // Which tar each id came from, so that a key in two shards names both.
  std::unordered_map<std::string, size_t> tar_of_id;
  int64_t sample_no = 0;
  int64_t refused_captions = 0;
  std::string first_refused_caption;
  // Tars are indexed a window at a time, in parallel: on a network file system each header is a
  // round trip, and shards are independent. A damaged tar is reported as if they were read in
  // order (the first in shard order), so the message does not depend on timing.
  constexpr size_t kWindow = 64;
  std::vector<TarIndex> window;
  std::vector<std::exception_ptr> errors;
  for (size_t t = 0; t < tars.size(); ++t) {
    const std::filesystem::path& tar = tars[t];
    if (t % kWindow == 0) {
      const size_t count = std::min(kWindow, tars.size() - t);
      window.assign(count, TarIndex{});
      errors.assign(count, nullptr);
      tbb::parallel_for(size_t{0}, count, [&](size_t k) {
        try {
          window[k] = tar_indexes != nullptr ? tar_indexes->index(tars[t + k])
                                             : index_tar(tars[t + k]);
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    }
    if (errors[t % kWindow]) std::rethrow_exception(errors[t % kWindow]);
    TarIndex& index = window[t % kWindow];
    // The captions and fields, read now; a member not where its index says (a kept index of a
    // tar rewritten in place) sends the tar to be scanned again, once.
    std::unordered_map<size_t, std::string> texts;
    try {
      texts = read_small_members(index, !keep_columns.empty(), max_caption_bytes);
    } catch (const MovedMember& e) {
      if (tar_indexes == nullptr) throw;
      spdlog::info("{}; reading its headers again", e.what());
      index = tar_indexes->rescan(tar);
      texts = read_small_members(index, !keep_columns.empty(), max_caption_bytes);
    }
    const auto text_of = [&](const TarMember* member) -> const std::string& {
      return texts.at(static_cast<size_t>(member - index.members.data()));
    };
    struct Entry {
      std::string key;
      const TarMember* video = nullptr;
      const TarMember* audio = nullptr;
      const TarMember* caption = nullptr;
      const TarMember* json = nullptr;
    };
    std::vector<Entry> entries;  // in the order keys first appear in the tar
    std::unordered_map<std::string, size_t> entry_of_key;
    for (const TarMember& member : index.members) {
      const auto kind = media_kind(std::filesystem::path(member.name));
      if (kind == MediaKind::kOther) {
        // A sample's fields, read only for output.keep_columns.
        const std::string extension = std::filesystem::path(member.name).extension().string();
        if (keep_columns.empty() || lower(extension) != ".json") continue;
        MemberKey split = member_key(member.name);
        const auto [it, added] = entry_of_key.try_emplace(split.key, entries.size());
        if (added) entries.push_back(Entry{split.key});
        Entry& entry = entries[it->second];
        PC_CHECK(entry.json == nullptr, InputError, "tar ", tar, ": members '",
                 printable(entry.json->name), "' and '", printable(member.name),
                 "' both give sample '", printable(split.key), "' its fields (.json)");
        entry.json = &member;
        continue;
      }
      if (kind == MediaKind::kCaption && !member.refusal.empty()) {
        if (refused_captions++ == 0) first_refused_caption = member.name + ": " + member.refusal;
        continue;
      }
      MemberKey split = member_key(member.name);
      const auto [it, added] = entry_of_key.try_emplace(split.key, entries.size());
      if (added) entries.push_back(Entry{split.key});
      Entry& entry = entries[it->second];
      const TarMember*& slot = kind == MediaKind::kVideo   ? entry.video
                               : kind == MediaKind::kAudio ? entry.audio
                                                           : entry.caption;
      PC_CHECK(slot == nullptr, InputError, "tar ", tar, ": members '", printable(slot->name),
               "' and '", printable(member.name), "' both give sample '", printable(split.key),
               "' the same kind of input; a WebDataset sample has one member of each kind");
      slot = &member;
      ++(kind == MediaKind::kVideo   ? found.video_files
         : kind == MediaKind::kAudio ? found.audio_files
                                     : found.caption_files);
    }
    for (const Entry& entry : entries) {
      if (entry.video == nullptr && entry.audio == nullptr) {
        ++found.lone_captions;
        continue;
      }
      const TarMember& first = entry.video != nullptr ? *entry.video : *entry.audio;
      PC_CHECK(is_valid_utf8(entry.key) && entry.key.find('\0') == std::string::npos,
               InputError, "tar ", tar, ": the member name '", printable(first.name),
               "' is not valid UTF-8 (the bad bytes are shown as \\xHH), but sample ids are "
               "made from member names and must be UTF-8 text; make the tar with UTF-8 names");
      const auto [earlier, unique] = tar_of_id.try_emplace(entry.key, t);
      // Within one tar a key's members form one sample, so a repeat is in another tar (or the
      // same tar named twice by the input).
      PC_CHECK(unique, InputError, "sample key '", printable(entry.key), "' is in tar ",
               tars[earlier->second], " and in tar ", tar,
               "; sample ids must be unique across the shards: remove or rename one (or name "
               "each shard once)");
      SampleSpec spec;
      spec.line = ++sample_no;
      spec.id = entry.key;
      const auto source = [&](const TarMember& m) {
        return MediaSource(tar, m.name, m.offset, m.size, m.refusal);
      };
      if (entry.video != nullptr) spec.video = source(*entry.video);
      if (entry.audio != nullptr) spec.audio = source(*entry.audio);
      if (entry.caption != nullptr) {
        spec.text = text_of(entry.caption);
      }
      if (!keep_columns.empty()) {
        spec.columns = entry.json != nullptr
                           ? member_columns(tar, *entry.json,
                                            texts.count(static_cast<size_t>(
                                                entry.json - index.members.data()))
                                                ? text_of(entry.json)
                                                : std::string(),
                                            keep_columns, seen)
                           : std::vector<std::string>(keep_columns.size());
      }
      samples.add(std::move(spec));
    }
  }
  if (found.lone_captions > 0) {
    spdlog::warn("{}: {} .txt member(s) have no video or audio member of the same key and were "
                 "ignored", name, found.lone_captions);
  }
  if (refused_captions > 0) {
    spdlog::warn("{}: {} caption member(s) are not regular files and were not read (first: "
                 "{}); their samples have no text", name, refused_captions,
                 printable(first_refused_caption));
  }
  for (size_t k = 0; k < keep_columns.size(); ++k) {
    PC_CHECK(seen[k], InputError, name, ": no sample's .json member has the field '",
             printable(keep_columns[k]),
             "' that output.keep_columns names; check its spelling (keys are case-sensitive), "
             "or leave it out of output.keep_columns");
  }
  if (columns != nullptr) *columns = std::move(found);
  return samples.take();
}

std::vector<SampleSpec> read_input(const InputSection& input,
                                   const std::vector<std::string>& keep_columns,
                                   InputColumns* columns, int64_t max_caption_bytes,
                                   TarIndexCache* tar_indexes) {
  if (!input.tars.empty()) {
    auto samples = read_tars(expand_tar_list(input.tars), keep_columns, columns,
                             max_caption_bytes, tar_indexes);
    PC_CHECK(!samples.empty(), InputError, "tar input ", input.tars.text(),
             " holds no video or audio member, so there is nothing to embed; check "
             "input.tars / --input (members: KEY.mp4, KEY.txt, ..., as WebDataset writes them)");
    return samples;
  }
  const std::filesystem::path& manifest = input.manifest;
  const std::filesystem::path& folder = input.folder;
  if (manifest.empty()) {
    PC_ASSERT(keep_columns.empty(), "kept columns of a folder input (validate() refuses them)");
    auto samples = scan_folder(folder, columns);
    PC_CHECK(!samples.empty(), InputError, "input folder ", folder,
             " holds no video or audio file, so there is nothing to embed; add media files "
             "(video: ", extensions_of(MediaKind::kVideo), "; audio: ",
             extensions_of(MediaKind::kAudio), ") or check input.folder / --input");
    return samples;
  }
  auto samples = read_manifest(manifest, keep_columns, columns);
  PC_CHECK(!samples.empty(), InputError, "manifest ", manifest,
           " holds no samples (it is empty, or has only blank lines or a header), so there is "
           "nothing to embed; add one line per sample, or check input.manifest / --input");
  return samples;
}

}  // namespace precompute
