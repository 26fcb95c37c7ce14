#pragma once
// Reading the input: a manifest (JSONL, CSV or TSV) or a folder of media files, into SampleSpecs
// in input order with seq = position. Everything is checked before any work starts: a broken
// line, a missing id or a duplicate id stops the run with the line numbers and the fix.

#include <filesystem>
#include <istream>
#include <string>
#include <vector>

#include "pipeline/core/sample.hpp"

namespace precompute {

enum class ManifestFormat { kJsonl, kCsv, kTsv };

// JSONL for .jsonl/.ndjson/.json, CSV for .csv, TSV for .tsv/.tab; throws InputError otherwise.
ManifestFormat manifest_format_for(const std::filesystem::path& file);

// Reads a manifest file. Relative media paths resolve against the manifest's folder. Throws
// InputError naming the file and line for bad syntax, a missing id, a sample with no input, or a
// duplicate id (naming both lines).
std::vector<SampleSpec> read_manifest(const std::filesystem::path& file);

// The same from a stream; `name` is used in messages, `base_dir` resolves relative paths.
std::vector<SampleSpec> parse_manifest(std::istream& in, ManifestFormat format,
                                       const std::filesystem::path& base_dir,
                                       const std::string& name);

// Folder mode: every video or audio file under `folder` (recursively, sorted by relative path)
// is a sample whose id is its relative path without extension; a video and an audio file with
// the same id form one sample; a sidecar ID.txt holds the caption. Throws InputError when two
// files of the same kind share an id, or when the folder cannot be read.
std::vector<SampleSpec> scan_folder(const std::filesystem::path& folder);

// Either of the above, as the config's input section says.
std::vector<SampleSpec> read_input(const std::filesystem::path& manifest,
                                   const std::filesystem::path& folder);

}  // namespace precompute
