#include "pipeline/input/input_columns.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include "pipeline/core/error.hpp"
#include "pipeline/input/printable_text.hpp"

namespace precompute {

// Note [A modality that no line feeds]
// A configured modality that no sample gives an input (video paths under 'vid', captions under
// 'caption') would run, store nothing for it and exit 0: the lines that feed the other
// modalities hide it. So before any work each configured modality must be fed by some sample of
// the whole input (a rank's part may hold none: it is the job's input that must fit the config),
// or the run stops (exit 65) naming the column the modality reads and listing those the input
// has, where a misspelling shows at a glance. A modality fed by only some lines is ordinary (a
// caption-only line in a video and text job). Audio reads the 'audio' column or, where a line has
// none, the audio track of its 'video' file (gives_input()), so an audio section reads 'video'
// too. Columns that nothing reads (no configured modality, not output.keep_columns, not 'id') are
// named in one warning, not refused: manifests often carry columns for other tools, but a
// misspelled column beside a correct one, or a section left out, shows there. In CSV/TSV columns
// match ignoring case, as the reader matches them; JSONL keys are case-sensitive.

namespace {

// Names listed in a message, and the bytes shown of each.
constexpr size_t kNamesShown = 24;
constexpr size_t kNameBytesShown = 64;

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// A name in quotes, its first kNameBytesShown bytes at most.
std::string shown(const std::string& name) {
  const bool cut = name.size() > kNameBytesShown;
  return fmt::format("'{}{}'", printable(std::string_view(name).substr(0, kNameBytesShown)),
                     cut ? "..." : "");
}

std::string listed(const std::vector<std::string>& names, bool more) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) {
    out += (i == 0 ? "" : ", ") + shown(names[i]);
  }
  if (names.size() > kNamesShown) {
    out += fmt::format(" and {} more", names.size() - kNamesShown);
  } else if (more) {
    out += " and more";
  }
  return out;
}

const char* word(const InputColumns& c) {
  return c.layout == InputLayout::kJsonl ? "key" : "column";
}

// `name` (as the input writes it) is the column `wanted`, matched as the reader matches it.
bool is_column(const InputColumns& c, const std::string& name, std::string_view wanted) {
  return c.layout == InputLayout::kDelimited ? lower(name) == lower(wanted) : name == wanted;
}

bool has_column(const InputColumns& c, std::string_view wanted) {
  return std::any_of(c.names.begin(), c.names.end(),
                     [&](const std::string& name) { return is_column(c, name, wanted); });
}

// What the modality's section reads of each line, and what a line holds there.
std::string what_it_reads(const InputColumns& c, Modality m) {
  const char* w = word(c);
  if (c.layout == InputLayout::kFolder) {
    switch (m) {
      case Modality::kVideo:
        return "its video files";
      case Modality::kAudio:
        return "its audio files, or the audio tracks of its video files";
      case Modality::kText:
        return "a caption file NAME.txt beside each video or audio file NAME";
    }
  }
  switch (m) {
    case Modality::kVideo:
      return fmt::format("each line's 'video' {} (the path of a video file)", w);
    case Modality::kAudio:
      return fmt::format("each line's 'audio' {} (the path of an audio file) or, where a line "
                         "has none, the audio track of its 'video' file",
                         w);
    case Modality::kText:
      return fmt::format("each line's 'text' {} (the caption)", w);
  }
  return {};
}

// The column is there, but gives nothing on any line.
std::string present_but_empty(const InputColumns& c, Modality m) {
  if (c.layout == InputLayout::kFolder || !has_column(c, modality_name(m))) return {};
  if (m == Modality::kAudio) {
    return c.layout == InputLayout::kJsonl
               ? " (the 'audio' key is there, but null or empty on every line)"
               : " (the 'audio' column is there, but empty on every line)";
  }
  return c.layout == InputLayout::kJsonl
             ? " (the key is there, but null or empty on every line)"
             : " (the column is there, but empty on every line)";
}

std::string the_fix(const InputColumns& c, Modality m) {
  const std::string name(modality_name(m));
  if (c.layout == InputLayout::kFolder) {
    return m == Modality::kText ? "Add the captions (NAME.txt beside NAME.mp4), or remove the "
                                  "text section from the config"
                                : fmt::format("Add {} files, or remove the {} section from the "
                                              "config", name, name);
  }
  const char* holds = m == Modality::kVideo   ? "the video paths"
                      : m == Modality::kAudio ? "the audio paths"
                                              : "the captions";
  return fmt::format("Rename the {} that holds {} to '{}' ({}), or remove the {} section from "
                     "the config",
                     word(c), holds, name,
                     c.layout == InputLayout::kJsonl ? "keys are case-sensitive"
                                                     : "matched ignoring case",
                     name);
}

// Why a column is read by nothing, for the warning: "" for a column no section has a name for.
std::string unused_reason(const InputColumns& c, const std::string& name) {
  for (Modality m : kAllModalities) {
    if (is_column(c, name, modality_name(m))) {
      return fmt::format(" (the config has no {} section)", modality_name(m));
    }
  }
  return {};
}

void warn_of_unused_columns(const InputColumns& c, const Config& config) {
  const std::vector<std::string> unused = unused_columns(c, config);
  if (unused.empty()) return;
  std::string list;
  if (c.layout == InputLayout::kFolder) {
    for (const auto& kind : unused) {
      const int64_t files = kind == "video"   ? c.video_files
                            : kind == "audio" ? c.audio_files
                                              : c.caption_files;
      list += fmt::format("{}{} {} file(s) (the config has no {} section)",
                          list.empty() ? "" : ", ", files, kind,
                          kind == "video" ? "video or audio" : kind == "audio" ? "audio" : "text");
    }
    spdlog::warn("{}: not used by the config: {}", c.name, list);
    return;
  }
  for (size_t i = 0; i < unused.size() && i < kNamesShown; ++i) {
    list += (i == 0 ? "" : ", ") + shown(unused[i]) + unused_reason(c, unused[i]);
  }
  if (unused.size() > kNamesShown) list += fmt::format(" and {} more", unused.size() - kNamesShown);
  if (c.more_names) {
    list += fmt::format(" (and the keys past the first {}, not looked at)", kMaxColumnNames);
  }
  spdlog::warn("{}: {} {}(s) not used by the config: {}; check them for a misspelling (video, "
               "audio and text are read by their sections), and list one to store beside the "
               "vectors in output.keep_columns",
               c.name, unused.size(), word(c), list);
}

}  // namespace

std::vector<std::string> unused_columns(const InputColumns& c, const Config& config) {
  std::vector<std::string> unused;
  const bool video_read = config.video.enabled || config.audio.enabled;  // audio: its track
  if (c.layout == InputLayout::kFolder) {
    if (c.video_files > 0 && !video_read) unused.emplace_back("video");
    if (c.audio_files > 0 && !config.audio.enabled) unused.emplace_back("audio");
    if (c.caption_files > 0 && !config.text.enabled) unused.emplace_back("caption");
    return unused;
  }
  const auto& kept = config.output.keep_columns.names;
  for (const auto& name : c.names) {
    const bool read =
        is_column(c, name, "id") || (is_column(c, name, "video") && video_read) ||
        (is_column(c, name, "audio") && config.audio.enabled) ||
        (is_column(c, name, "text") && config.text.enabled) ||
        std::any_of(kept.begin(), kept.end(),
                    [&](const std::string& k) { return is_column(c, name, k); });
    if (!read) unused.push_back(name);
  }
  return unused;
}

std::string describe_columns(const InputColumns& c) {
  switch (c.layout) {
    case InputLayout::kJsonl:
      return "its lines have the keys " + listed(c.names, c.more_names);
    case InputLayout::kDelimited:
      return "its header names the columns " + listed(c.names, false);
    case InputLayout::kFolder:
      return fmt::format("it holds {} video file(s), {} audio file(s) and {} caption file(s) "
                         "(.txt){}",
                         c.video_files, c.audio_files, c.caption_files,
                         c.lone_captions > 0
                             ? fmt::format(", {} of them beside no video or audio file of its "
                                           "name", c.lone_captions)
                             : std::string());
  }
  return {};
}

void check_input_columns(const std::vector<SampleSpec>& samples, const InputColumns& columns,
                         const Config& config) {
  std::array<bool, kNumModalities> fed{};
  for (const auto& s : samples) {
    bool all = true;
    for (Modality m : kAllModalities) {
      auto& f = fed[modality_index(m)];
      f = f || gives_input(s, m);
      all = all && (f || !config.enabled(m));
    }
    if (all) break;
  }
  for (Modality m : kAllModalities) {
    if (!config.enabled(m) || fed[modality_index(m)]) continue;
    PC_THROW(InputError, columns.name, ": no ",
             columns.layout == InputLayout::kFolder ? "sample" : "line", " gives the ",
             modality_name(m), " section an input: it reads ", what_it_reads(columns, m),
             ", and ", columns.layout == InputLayout::kFolder ? "there is none" : "no line has one",
             present_but_empty(columns, m), "; ",
             describe_columns(columns), ". ", the_fix(columns, m));
  }
  warn_of_unused_columns(columns, config);
}

}  // namespace precompute
