#pragma once
// Where a sample's video or audio bytes are: a whole file, or one member of a tar shard read in
// place (a byte range of the tar; Note [Tar members read in place] in
// pipeline/input/tar_index.cpp). The decoders open either through the same guarded reader
// (ffmpeg::open_input), which never reads outside the range.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace precompute {

struct MediaSource {
  std::filesystem::path file;  // the media file, or the tar that holds the member
  std::string member;          // the member's name in the tar; empty for a whole file
  int64_t offset = 0;          // a member's first byte in the tar
  int64_t size = 0;            // a member's length in bytes
  // Non-empty: why the member is not read (a link, a device, an unsafe name), which opening
  // it reports as the sample's failure.
  std::string refusal;

  MediaSource() = default;
  // A whole file: every place that held a path still reads as one.
  MediaSource(std::filesystem::path path) : file(std::move(path)) {}  // NOLINT: implicit
  MediaSource(std::filesystem::path tar, std::string member_name, int64_t first, int64_t bytes,
              std::string why_not_read = {})
      : file(std::move(tar)),
        member(std::move(member_name)),
        offset(first),
        size(bytes),
        refusal(std::move(why_not_read)) {}

  bool is_member() const { return !member.empty(); }

  // For messages and failure records: the path, or "TAR:MEMBER" (the form tar tools print).
  std::string name() const { return is_member() ? file.string() + ":" + member : file.string(); }

  friend bool operator==(const MediaSource& a, const MediaSource& b) {
    return a.file == b.file && a.member == b.member && a.offset == b.offset && a.size == b.size &&
           a.refusal == b.refusal;
  }
};

}  // namespace precompute
