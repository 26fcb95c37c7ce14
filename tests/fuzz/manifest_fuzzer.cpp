// libFuzzer target for the manifest parser: each input is parsed as JSONL, as CSV and as TSV.
// InputError is how a bad manifest must end. A sanitizer report, any other exception (InternalError
// from PC_ASSERT, std::bad_alloc, a JSON library error) or an accepted manifest that breaks
// what manifest.hpp promises is a bug, and aborts so that libFuzzer saves the input.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
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
    require(!s.video || s.video->is_absolute(), "video paths are resolved");
    require(!s.audio || s.audio->is_absolute(), "audio paths are resolved");
    require(s.line > previous_line, "lines increase in input order");
    previous_line = s.line;
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
  return 0;
}
