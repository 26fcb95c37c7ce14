#include "pipeline/core/media_names.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <string_view>
#include <system_error>

namespace precompute {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool ends_with(const std::string& text, std::string_view end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

const std::map<std::string, MediaKind>& media_kinds() {
  static const std::map<std::string, MediaKind> kKinds = {
      {".mp4", MediaKind::kVideo},  {".m4v", MediaKind::kVideo},   {".mkv", MediaKind::kVideo},
      {".webm", MediaKind::kVideo}, {".avi", MediaKind::kVideo},   {".mov", MediaKind::kVideo},
      {".mpg", MediaKind::kVideo},  {".mpeg", MediaKind::kVideo},  {".ts", MediaKind::kVideo},
      {".flv", MediaKind::kVideo},  {".3gp", MediaKind::kVideo},   {".ogv", MediaKind::kVideo},
      {".wav", MediaKind::kAudio},  {".mp3", MediaKind::kAudio},   {".flac", MediaKind::kAudio},
      {".m4a", MediaKind::kAudio},  {".aac", MediaKind::kAudio},   {".ogg", MediaKind::kAudio},
      {".opus", MediaKind::kAudio}, {".txt", MediaKind::kCaption},
  };
  return kKinds;
}

}  // namespace

MediaKind media_kind(const std::filesystem::path& file) {
  const auto it = media_kinds().find(lower(file.extension().string()));
  return it == media_kinds().end() ? MediaKind::kOther : it->second;
}

std::string extensions_of(MediaKind kind) {
  std::string list;
  for (const auto& [extension, k] : media_kinds()) {
    if (k == kind) list += (list.empty() ? "" : " ") + extension;
  }
  return list;
}

bool is_tar_name(const std::filesystem::path& name) {
  return lower(name.extension().string()) == ".tar";
}

std::string decompress_command(const std::filesystem::path& name) {
  const std::string l = lower(name.string());
  if (ends_with(l, ".tar.gz") || ends_with(l, ".tgz")) return "gunzip -k";
  if (ends_with(l, ".tar.zst")) return "zstd -d";
  if (ends_with(l, ".tar.xz")) return "xz -dk";
  if (ends_with(l, ".tar.bz2")) return "bunzip2 -k";
  return "";
}

bool names_tar_shards(const std::filesystem::path& argument) {
  if (is_tar_name(argument) || !decompress_command(argument).empty()) return true;
  std::error_code error;
  const auto status = std::filesystem::status(argument, error);
  // A file that exists is what it is (a manifest may have a brace in its name); a brace in a
  // name that does not exist is a range.
  if (std::filesystem::is_regular_file(status)) return false;
  if (!std::filesystem::is_directory(status)) {
    return argument.string().find('{') != std::string::npos;
  }
  bool tars = false;
  for (const auto& entry : std::filesystem::directory_iterator(argument, error)) {
    const MediaKind kind = media_kind(entry.path());
    if (kind == MediaKind::kVideo || kind == MediaKind::kAudio) return false;
    tars = tars || is_tar_name(entry.path());
  }
  return tars;
}

}  // namespace precompute
