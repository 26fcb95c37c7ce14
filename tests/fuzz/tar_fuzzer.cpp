// libFuzzer target for the tar index (pipeline/input/tar_index.hpp): each input is written to a
// file and indexed as a tar shard, and read as a kept index's file
// (pipeline/input/tar_index_cache.hpp), which must refuse it or read it without a fault; an
// index that was read must read back from its kept form unchanged. InputError is how a damaged tar must end. A sanitizer report,
// any other exception, or an index that breaks what tar_index.hpp promises (a member outside
// the file, an offset off the 512-byte grid, a name with a NUL read as regular) is a bug, and
// aborts so that libFuzzer saves the input.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "pipeline/core/error.hpp"
#include "pipeline/input/tar_index.hpp"
#include "pipeline/input/tar_index_cache.hpp"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "tar_fuzzer: broken contract: %s\n", what);
  std::abort();
}

const std::filesystem::path& scratch() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("precompute-tar-fuzzer-" + std::to_string(::getpid()) + ".tar");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::ofstream out(scratch(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  if (const auto kept = precompute::decode_tar_index(
          std::string_view(reinterpret_cast<const char*>(data), size))) {
    for (const auto& member : kept->members) {
      require(member.offset >= 0 && member.size >= 0 &&
                  member.offset <= kept->tar_bytes - member.size,
              "a kept member lies within its tar");
    }
  }
  try {
    const precompute::TarIndex index = precompute::index_tar(scratch());
    const auto back = precompute::decode_tar_index(precompute::encode_tar_index(index));
    require(back.has_value() && back->members.size() == index.members.size(),
            "a kept index reads back");
    for (size_t m = 0; m < index.members.size(); ++m) {
      require(back->members[m].name == index.members[m].name &&
                  back->members[m].offset == index.members[m].offset &&
                  back->members[m].size == index.members[m].size &&
                  back->members[m].refusal == index.members[m].refusal,
              "a kept member reads back unchanged");
    }
    require(index.tar_bytes == static_cast<int64_t>(size), "the tar's size is the file's");
    for (const auto& member : index.members) {
      require(member.offset >= 512 && member.offset % 512 == 0, "data starts after a header");
      require(member.size >= 0 && member.offset <= index.tar_bytes - member.size,
              "a member lies within the file");
      if (member.refusal.empty()) {
        require(member.name.find('\0') == std::string::npos, "a read member's name has no NUL");
        require(member.name.empty() || member.name.front() != '/', "read names are relative");
      }
      const precompute::MemberKey key = precompute::member_key(member.name);
      // "KEY." (a dot and nothing after it) is KEY with an empty suffix, like "KEY".
      const bool dotted = member.name.size() > key.key.size();
      require(member.name == key.key + (dotted ? "." + key.suffix : std::string()),
              "key and suffix make the name");
    }
  } catch (const precompute::InputError&) {
  }
  return 0;
}
