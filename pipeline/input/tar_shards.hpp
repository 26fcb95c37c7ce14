#pragma once
// Which tar shards input.tars names (a tar, a folder of tars or a brace range); --input decides
// that it names tars by names_tar_shards() in pipeline/core/media_names.hpp.

#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"

namespace precompute {

// The tars `pattern` names, in order: each name of a brace range "shards/{000000..000099}.tar"
// (WebDataset's notation: the numbers keep the width of the first, and a pattern may hold
// several ranges), the .tar files directly in a folder (sorted by name), or one .tar file.
// Throws InputError for a range whose ends are not numbers or run backwards, a range of more
// than 1,000,000 names, a compressed shard (.tar.gz, .tgz, .tar.zst: no random access, so the
// message gives the command that converts it), a name that is not a tar, a tar or folder that
// does not exist, or a folder with no .tar file.
std::vector<std::filesystem::path> expand_tar_shards(const std::filesystem::path& pattern);

// One spelling of a tar's path whatever the input says (relative, `./`, symbolic links): absolute
// and canonical as far as it exists, normalised as written when even that fails. Tars named twice
// are found by it, and a kept index is named after it.
std::filesystem::path resolved_tar_path(const std::filesystem::path& tar);

// Each entry of input.tars expanded, in the order listed. A tar that two entries name (the same
// file, whatever the spelling) is refused with both entries named: its samples would be read
// twice, and every key refused as seen twice.
std::vector<std::filesystem::path> expand_tar_list(const PathList& list);

}  // namespace precompute
