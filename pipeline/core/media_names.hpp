#pragma once
// What a file name says an input file is: video, audio, a caption, a tar shard. Folder and tar
// input sort their files by it, and --input decides by it what it was given.

#include <filesystem>
#include <string>

namespace precompute {

enum class MediaKind { kVideo, kAudio, kCaption, kOther };

// By extension, ignoring case: .mp4 .mkv .webm ... video, .wav .flac .mp3 ... audio, .txt a
// caption.
MediaKind media_kind(const std::filesystem::path& file);

// The extensions of `kind`, as a message lists them (".avi .flv .m4v ...").
std::string extensions_of(MediaKind kind);

// Whether `name` ends in .tar (any case).
bool is_tar_name(const std::filesystem::path& name);

// The command that decompresses a compressed tar shard (.tar.gz, .tgz, .tar.zst, .tar.xz,
// .tar.bz2) into one that can be read in place, or "" for any other name.
std::string decompress_command(const std::filesystem::path& name);

// Whether `argument` (as --input gives it) names tar shards: a name ending in .tar or in a
// compressed tar's extension, a brace range (a name with '{' that is no existing file), or a
// folder whose own entries include .tar files and no video or audio file.
bool names_tar_shards(const std::filesystem::path& argument);

}  // namespace precompute
