#include "pipeline/input/tar_shards.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string_view>
#include <system_error>

#include "pipeline/core/error.hpp"
#include "pipeline/core/media_names.hpp"
#include "pipeline/input/printable_text.hpp"

namespace precompute {
namespace {

constexpr int64_t kMaxShardNames = 1'000'000;

void refuse_compressed(const std::string& name) {
  if (const std::string command = decompress_command(name); !command.empty()) {
    PC_THROW(InputError, "tar shard '", printable(name),
             "' is compressed: a compressed tar has no random access, so its members cannot be "
             "read in place; decompress the shards once (e.g. `",
             command, " SHARD` for each) and give the .tar files");
  }
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](unsigned char c) { return std::isdigit(c) != 0; });
}

// Expands the first brace group of `pattern` into `out`, then the groups after it.
void expand(const std::string& pattern, const std::string& whole, std::vector<std::string>& out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    PC_CHECK(pattern.find('}') == std::string::npos, InputError, "tar pattern '", printable(whole),
             "' has a '}' without its '{'");
    PC_CHECK(static_cast<int64_t>(out.size()) < kMaxShardNames, InputError, "tar pattern '",
             printable(whole), "' names more than ", kMaxShardNames,
             " shards; split the input over several runs (or ranks)");
    out.push_back(pattern);
    return;
  }
  const size_t close = pattern.find('}', open);
  PC_CHECK(close != std::string::npos, InputError, "tar pattern '", printable(whole),
           "' has a '{' without its '}'");
  const std::string head = pattern.substr(0, open);
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string tail = pattern.substr(close + 1);
  const size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string first = body.substr(0, dots);
    const std::string last = body.substr(dots + 2);
    PC_CHECK(all_digits(first) && all_digits(last) && first.size() <= 18 && last.size() <= 18,
             InputError, "tar pattern '", printable(whole), "': the range {", printable(body),
             "} must be two numbers, as in {000000..000099}");
    const int64_t from = std::stoll(first);
    const int64_t to = std::stoll(last);
    PC_CHECK(from <= to, InputError, "tar pattern '", printable(whole), "': the range {", body,
             "} runs backwards; write the smaller number first");
    PC_CHECK(to - from < kMaxShardNames, InputError, "tar pattern '", printable(whole),
             "' names more than ", kMaxShardNames,
             " shards; split the input over several runs (or ranks)");
    const size_t width = first.size();
    for (int64_t n = from; n <= to; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      expand(head + number + tail, whole, out);
    }
    return;
  }
  PC_CHECK(body.find(',') != std::string::npos, InputError, "tar pattern '", printable(whole),
           "': {", printable(body), "} is neither a range {A..B} nor a list {a,b}");
  size_t start = 0;
  while (true) {
    const size_t comma = body.find(',', start);
    expand(head + body.substr(start, comma - start) + tail, whole, out);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::filesystem::path> expand_tar_shards(const std::filesystem::path& pattern) {
  const std::string text = pattern.string();
  PC_CHECK(!text.empty(), InputError,
           "input.tars is empty; give a .tar, a folder of .tar "
           "files or a range such as 'shards/{000000..000099}.tar'");
  std::vector<std::filesystem::path> tars;
  std::error_code error;
  if (text.find('{') == std::string::npos && std::filesystem::is_directory(pattern, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(pattern, error)) {
      if (is_tar_name(entry.path())) tars.push_back(entry.path());
    }
    PC_CHECK(!error, InputError, "cannot list tar folder ", pattern, ": ", error.message());
    std::sort(tars.begin(), tars.end());
    PC_CHECK(!tars.empty(), InputError, "tar folder ", pattern,
             " holds no .tar file; give the folder that holds the shards");
    return tars;
  }
  std::vector<std::string> names;
  expand(text, text, names);
  for (const auto& name : names) {
    refuse_compressed(name);
    PC_CHECK(is_tar_name(name) || names.size() > 1 || std::filesystem::exists(name, error),
             InputError, "tar input '", printable(name),
             "' does not exist; give a .tar, a folder of .tar files or a range such as "
             "'shards/{000000..000099}.tar'");
    PC_CHECK(is_tar_name(name), InputError, "tar shard '", printable(name),
             "' does not end in .tar; tar input reads uncompressed .tar shards");
    tars.emplace_back(name);
  }
  return tars;
}

std::filesystem::path resolved_tar_path(const std::filesystem::path& tar) {
  std::error_code error;
  auto path = std::filesystem::weakly_canonical(std::filesystem::absolute(tar, error), error);
  return error ? tar.lexically_normal() : path;
}

std::vector<std::filesystem::path> expand_tar_list(const PathList& list) {
  std::vector<std::filesystem::path> tars;
  std::map<std::filesystem::path, size_t> seen;  // a tar, resolved -> the entry naming it
  for (size_t entry = 0; entry < list.size(); ++entry) {
    for (auto& tar : expand_tar_shards(list.paths[entry])) {
      const auto [it, first] = seen.try_emplace(resolved_tar_path(tar), entry);
      const size_t earlier = it->second;
      PC_CHECK(first, InputError, "input.tars names the tar ", printable(tar.string()),
               " twice: in entry ", earlier, " (", printable(list.paths[earlier].string()),
               ") and in entry ", entry, " (", printable(list.paths[entry].string()),
               "); name each tar once");
      tars.push_back(std::move(tar));
    }
  }
  return tars;
}

}  // namespace precompute
