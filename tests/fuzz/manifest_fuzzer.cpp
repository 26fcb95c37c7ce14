// libFuzzer target for the manifest parser: each input is parsed as JSONL, as CSV and as TSV, and
// as JSONL once more keeping the column "label" (output.keep_columns), whose values are checked
// against nlohmann's own reading of each line. InputError is how a bad manifest must end. A
// sanitizer report, any other exception (InternalError from PC_ASSERT, std::bad_alloc, a JSON
// library error) or an accepted manifest that breaks what manifest.hpp promises is a bug, and
// aborts so that libFuzzer saves the input.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/input/manifest.hpp"

namespace {

using precompute::ManifestFormat;
using precompute::SampleSpec;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "manifest_fuzzer: broken contract: %s\n", what);
  std::abort();
}

// What manifest.hpp promises of every manifest it accepts.
void check_samples(const std::vector<SampleSpec>& samples) {
  std::unordered_set<std::string> ids;
  int64_t previous_line = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleSpec& s = samples[i];
    require(s.seq == static_cast<int64_t>(i), "seq is the position in the input");
    require(!s.id.empty(), "every sample has an id");
    require(ids.insert(s.id).second, "ids are unique");
    require(s.video || s.audio || s.text, "every sample has an input");
    // The parser is given an absolute base folder, so every media path must come out absolute.
    require(!s.video || s.video->file.is_absolute(), "video paths are resolved");
    require(!s.audio || s.audio->file.is_absolute(), "audio paths are resolved");
    require(s.line > previous_line, "lines increase in input order");
    previous_line = s.line;
  }
}

// Line `line_no` of `text` as the reader hands it to the JSON parser: without its newline, the
// carriage return before that, or (on line 1) a byte order mark.
std::string_view line_of(std::string_view text, int64_t line_no) {
  size_t start = 0;
  for (int64_t n = 1; n < line_no; ++n) start = text.find('\n', start) + 1;
  std::string_view line = text.substr(start, text.find('\n', start) - start);
  if (line_no == 1 && line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

// What Note [Kept values as written] (pipeline/input/manifest.cpp) promises of an accepted JSONL
// manifest whose column `key` is kept: no line's object repeats a key (counted here by the
// parser's own callback), and each sample keeps the line's value: "" for none or null, a string
// decoded, anything else as bytes of the line that read as that same value.
void check_kept(std::string_view text, const std::vector<SampleSpec>& samples,
                const std::string& key) {
  using nlohmann::json;
  for (const SampleSpec& s : samples) {
    require(s.columns.size() == 1, "one kept value per kept column");
    const std::string_view line = line_of(text, s.line);
    size_t keys = 0;
    const json object =
        json::parse(line.begin(), line.end(), [&](int depth, json::parse_event_t event, json&) {
          if (event == json::parse_event_t::key && depth == 1) ++keys;
          return true;
        });
    require(keys == object.size(), "an accepted line repeats no key");
    const std::string& kept = s.columns[0];
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) {
      require(kept.empty(), "a line without the key, or with null, keeps \"\"");
    } else if (it->is_string()) {
      require(kept == it->get<std::string>(), "a string is kept as its text");
    } else {
      require(line.find(kept) != std::string_view::npos, "a kept value is the line's bytes");
      require(json::parse(kept) == *it, "a kept value reads as the line's value");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const ManifestFormat format :
       {ManifestFormat::kJsonl, ManifestFormat::kCsv, ManifestFormat::kTsv}) {
    std::istringstream in(text);
    try {
      check_samples(precompute::parse_manifest(in, format, "/fuzz/base", "fuzz manifest"));
    } catch (const precompute::InputError&) {
    }
  }
  std::istringstream in(text);
  try {
    const auto samples = precompute::parse_manifest(in, ManifestFormat::kJsonl, "/fuzz/base",
                                                    "fuzz manifest", {"label"});
    check_samples(samples);
    check_kept(text, samples, "label");
  } catch (const precompute::InputError&) {
  }
  return 0;
}
