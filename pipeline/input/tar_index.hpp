#pragma once
// A tar shard's table of contents, read without extracting anything: one sequential pass over
// its headers (member data is skipped), giving each member's name and byte range in the tar
// (Note [Tar members read in place] in tar_index.cpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace precompute {

struct TarMember {
  std::string name;    // the path inside the tar, PAX and GNU long names resolved
  int64_t offset = 0;  // its first data byte in the tar
  int64_t size = 0;
  // Empty for a regular file. Otherwise why it is not read: a link, a device, a FIFO, a sparse
  // file, or a name that a tar tool would extract outside its folder.
  std::string refusal;
};

struct TarIndex {
  std::filesystem::path tar;
  int64_t tar_bytes = 0;
  // The file as it was read (fstat), so that a kept index can tell a changed tar
  // (pipeline/input/tar_index_cache.hpp).
  int64_t modified_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  std::vector<TarMember> members;  // in tar order; folders are left out
};

// Reads the headers of `tar`. Throws InputError naming the tar, the byte offset and the last
// member read when it is not a readable regular file, a header's checksum or a size field is
// wrong, a PAX or GNU long-name record is malformed, or the tar ends inside a header or a
// member's data (truncated).
TarIndex index_tar(const std::filesystem::path& tar);

// The WebDataset split of a member name: the key is the path up to the first dot of the last
// path component, the suffix what follows that dot ("a/b.c.mp4" -> "a/b", "c.mp4"); a name
// without a dot in its last component has an empty suffix.
struct MemberKey {
  std::string key;
  std::string suffix;
};
MemberKey member_key(const std::string& name);

}  // namespace precompute
