#pragma once
// Reading the input: a manifest (JSONL, CSV or TSV) or a folder of media files, into SampleSpecs
// in input order with seq = position. Everything is checked before any work starts: a broken
// line, a JSONL line that repeats a key, a missing id, an id that is not UTF-8 text or holds a
// NUL, a media path with a NUL, or a duplicate id stops the run with the line numbers and the
// fix. Ids that differ only in Unicode
// normalization (NFC vs NFD) are kept, with a warning naming the first such pair.

#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"
#include "pipeline/input/input_columns.hpp"

namespace precompute {

class TarIndexCache;  // pipeline/input/tar_index_cache.hpp

enum class ManifestFormat { kJsonl, kCsv, kTsv };

// JSONL for .jsonl/.ndjson/.json, CSV for .csv, TSV for .tsv/.tab; throws InputError otherwise.
ManifestFormat manifest_format_for(const std::filesystem::path& file);

// Reads a manifest file. Relative media paths resolve against the manifest's folder. Throws
// InputError naming the file and line for bad syntax, a key written twice in a JSONL line
// (naming the key), a missing or invalid id (NUL, not UTF-8), a media path with a NUL, a sample
// with no input, or a duplicate id (naming both lines). `keep_columns` (output.keep_columns)
// fills each sample's `columns` (Note [Kept columns] in manifest.cpp), a JSONL value that is not
// a string as the line writes it: a column the manifest lacks, or a value with a NUL or bytes
// that are not UTF-8, is an InputError too. `columns`, when given, gets the manifest's columns.
std::vector<SampleSpec> read_manifest(const std::filesystem::path& file,
                                      const std::vector<std::string>& keep_columns = {},
                                      InputColumns* columns = nullptr);

// The same from a stream; `name` is used in messages, `base_dir` resolves relative paths.
std::vector<SampleSpec> parse_manifest(std::istream& in, ManifestFormat format,
                                       const std::filesystem::path& base_dir,
                                       const std::string& name,
                                       const std::vector<std::string>& keep_columns = {},
                                       InputColumns* columns = nullptr);

// Folder mode: every video or audio file under `folder` (recursively, sorted by relative path)
// is a sample whose id is its relative path without extension; a video and an audio file with
// the same id form one sample; a sidecar ID.txt holds the caption. Links to folders are followed,
// each folder entered once (by device and inode); a link loop, or an entry that cannot be
// stat'ed, is skipped with a warning. Throws InputError when two files of the same kind share an
// id, when a media file's name is not valid UTF-8, or when a folder cannot be listed. `columns`,
// when given, gets the files found by kind.
std::vector<SampleSpec> scan_folder(const std::filesystem::path& folder,
                                    InputColumns* columns = nullptr);

// Tar mode: the samples of WebDataset tar shards, read in place (Note [Tar members read in
// place] in tar_index.cpp). Members are grouped by key (the member path up to the first dot of
// its name); a video member feeds video (and audio from its track unless the key has an audio
// member), a .txt member the caption (read here, at most max_caption_bytes + 1 bytes of it),
// and with `keep_columns` the .json member's top-level fields are the kept columns (checked as a
// JSONL line's: one object, no key twice; a field no member has is an InputError).
// Samples come in tar order, then in the order their keys first appear; the id is the key. A
// member that is not a regular file or has an unsafe name stays in its sample, whose decoding
// then records why (MediaSource::refusal). Throws InputError for a damaged tar (index_tar), a
// key with two members of one kind, a key that is not UTF-8, or a key in two places (naming both
// tars). `tar_indexes`, when given, finds each tar's index (kept from an earlier run, or
// scanned and kept for this run's folder); without it every tar is scanned.
std::vector<SampleSpec> read_tars(const std::vector<std::filesystem::path>& tars,
                                  const std::vector<std::string>& keep_columns = {},
                                  InputColumns* columns = nullptr,
                                  int64_t max_caption_bytes = INT64_MAX,
                                  TarIndexCache* tar_indexes = nullptr);

// One of the above, as the config's input section says; an input with no sample at all is
// refused (InputError), so that every caller stops before any work. `columns`, when given, gets
// what the input has (check_input_columns() judges a config by it). `max_caption_bytes`
// (text.max_text_bytes) bounds what is read of a tar's caption member; `tar_indexes` is
// read_tars'.
std::vector<SampleSpec> read_input(const InputSection& input,
                                   const std::vector<std::string>& keep_columns = {},
                                   InputColumns* columns = nullptr,
                                   int64_t max_caption_bytes = INT64_MAX,
                                   TarIndexCache* tar_indexes = nullptr);

}  // namespace precompute
