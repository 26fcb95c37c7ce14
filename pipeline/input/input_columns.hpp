#pragma once
// What an input offers a config, column by column: the keys of a JSONL manifest's lines, the
// header of a CSV/TSV one, or the kinds of files of an input folder (read_input fills it). Before
// any work, the run checks its config against it (Note [A modality that no line feeds] in
// input_columns.cpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

enum class InputLayout { kJsonl, kDelimited, kFolder };

// The JSONL keys kept for messages; a manifest with more distinct keys lists these and says so.
inline constexpr size_t kMaxColumnNames = 256;

struct InputColumns {
  InputLayout layout = InputLayout::kJsonl;
  std::string name;  // how messages name the input: "manifest m.jsonl", "input folder media"
  // JSONL: the keys that some line has (decoded), in the order first seen, at most
  // kMaxColumnNames of them (more_names: there were more). CSV/TSV: the header, as written.
  std::vector<std::string> names;
  bool more_names = false;
  // Folder mode: the files found, by kind; lone captions have no media file of their name.
  int64_t video_files = 0;
  int64_t audio_files = 0;
  int64_t caption_files = 0;
  int64_t lone_captions = 0;
};

// Refuses (InputError) a configured modality that none of `samples` gives an input, naming the
// column it reads and listing those `columns` has; then warns, in one line, of the columns that
// neither a configured modality nor output.keep_columns reads.
void check_input_columns(const std::vector<SampleSpec>& samples, const InputColumns& columns,
                         const Config& config);

// The columns that neither 'id', a configured modality nor output.keep_columns reads, as the
// input writes them; in folder mode the kinds of files no section reads ("video", "audio",
// "caption").
std::vector<std::string> unused_columns(const InputColumns& columns, const Config& config);

// What the input has, as a message lists it: "its lines have the keys 'id', 'vid', 'text'".
std::string describe_columns(const InputColumns& columns);

}  // namespace precompute
