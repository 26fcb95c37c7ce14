#include "pipeline/report_files.hpp"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/atomic_file.hpp"
#include "storage/output_folder.hpp"
#include "storage/output_index.hpp"

namespace precompute {

// Note [Where a run reports]
// The summary and metrics files are written as the run goes and ends, long after start-up, so a
// path that cannot work is refused at start-up, with exit 2, before the output is touched: a
// folder, a folder that does not exist or cannot be written, a name too long for the temporary
// file that an atomic write makes beside it. A path inside the output folder is refused too: the
// folder is the tool's (it keeps its own summary.json there), and a file of the user's there
// would make a later run take the folder for someone else's; so is a path in any other output
// folder (one that holds index.json or a run's lock), where this run's summary.json, carrying
// this run's output id, would make that output's next run refuse its folder. So is a file the
// run reads (the
// config, the manifest, a model), which the report would overwrite, and the same file for both
// reports. The ranks of a split job usually share one config file, and may share a host: each
// writes its own files, named after its rank as its folder is (rank_report_path()), so that no
// two processes ever replace each other's report.

namespace {

namespace fs = std::filesystem;

// A temporary file's name is the target's plus the prefix, a pid and a counter
// (storage/atomic_file.cpp): room for both in a file name.
constexpr size_t kTemporaryNameExtra = kTempFilePrefix.size() + 2 * 20 + 2;

fs::path absolute_normal(const fs::path& p) {
  std::error_code ignored;
  return fs::absolute(p, ignored).lexically_normal();
}

// `p` with its existing part's links resolved, for comparisons that links could hide.
fs::path resolved(const fs::path& p) {
  std::error_code error;
  const fs::path canonical = fs::weakly_canonical(p, error);
  return error ? absolute_normal(p) : canonical;
}

bool is_inside(const fs::path& file, const fs::path& folder) {
  if (folder.empty()) return false;  // no output folder yet: validate() says so
  const auto within = [](const fs::path& f, const fs::path& d) {
    auto fi = f.begin();
    for (auto di = d.begin(); di != d.end(); ++di, ++fi) {
      if (di->empty()) continue;  // a trailing separator
      if (fi == f.end() || *fi != *di) return false;
    }
    return true;
  };
  return within(absolute_normal(file), absolute_normal(folder)) ||
         within(resolved(file), resolved(folder));
}

bool same_file(const fs::path& a, const fs::path& b) {
  if (a.empty() || b.empty()) return false;
  if (absolute_normal(a) == absolute_normal(b)) return true;
  std::error_code error;
  return fs::equivalent(a, b, error) && !error;
}

struct Report {
  std::string_view key;   // "run.summary_json"
  std::string_view flag;  // "--summary-json"
  const fs::path* path;
};

std::string named(const Report& r) {
  return detail::concat("config key '", r.key, "' (", r.flag, ")");
}

// The files a run reads, which a report must never replace.
std::vector<std::pair<fs::path, std::string_view>> files_the_run_reads(const Config& c) {
  std::vector<std::pair<fs::path, std::string_view>> files = {
      {c.file, "the config file"}, {c.input.manifest, "the input manifest"}};
  for (Modality m : kAllModalities) {
    if (c.enabled(m)) files.emplace_back(c.section(m).encoder.path, "a model");
  }
  if (c.text.enabled) files.emplace_back(c.text.vocab, "the tokenizer's vocabulary");
  return files;
}

void check_report(const Report& r, const Config& config, const fs::path& other,
                  std::string_view other_key) {
  const fs::path& p = *r.path;
  PC_CHECK(p.native().find('\0') == std::string::npos, ConfigError, named(r),
           " holds a NUL byte; give a file's path");
  PC_CHECK(p.has_filename() && !fs::is_directory(p), ConfigError, named(r), " is ", p,
           ", a folder; give the path of a file (one in that folder, say)");
  PC_CHECK(!is_inside(p, config.output.path), ConfigError, named(r), " is ", p,
           ", inside the output folder ", config.output.path,
           ", which holds only precompute's own files (it keeps the run's summary there as ",
           "summary.json already); choose a path outside it");
  const fs::path parent = p.parent_path();
  PC_CHECK(!fs::exists(parent / kIndexFileName) && !fs::exists(parent / kLockFileName), ConfigError,
           named(r), " is ", p, ", in the folder ", parent, ", which holds a precompute output (",
           kIndexFileName, " or ", kLockFileName,
           "); a file of this run there would be taken for one of that output's. Choose a path "
           "outside every output folder");
  std::error_code error;
  const auto status = fs::status(p, error);
  PC_CHECK(status.type() == fs::file_type::not_found || status.type() == fs::file_type::regular,
           ConfigError, named(r), " is ", p,
           ", which exists and is not a regular file (a FIFO, a device, a socket); give the "
           "path of a file that precompute may replace");
  const fs::path folder = p.parent_path();
  PC_CHECK(fs::is_directory(folder), ConfigError, named(r), " is ", p, ", in the folder ", folder,
           ", which does not exist; create it first (mkdir -p ", folder,
           ") or choose another path");
  const int access_error = ::access(folder.c_str(), W_OK | X_OK) == 0 ? 0 : errno;
  PC_CHECK(access_error == 0, ConfigError, named(r), " is ", p, ", in the folder ", folder,
           ", where this user cannot create files (", std::generic_category().message(access_error),
           "); choose a writable folder");
  const size_t name_bytes = p.filename().native().size();
  PC_CHECK(name_bytes + kTemporaryNameExtra <= NAME_MAX, ConfigError, named(r), " names a file ",
           name_bytes, " bytes long; at most ", NAME_MAX - kTemporaryNameExtra,
           " bytes are allowed (the file is written through a temporary file with a longer "
           "name beside it); choose a shorter name");
  for (const auto& [file, what] : files_the_run_reads(config)) {
    PC_CHECK(!same_file(p, file), ConfigError, named(r), " is ", p, ", ", what,
             " this run reads; choose another path");
  }
  PC_CHECK(!same_file(p, other), ConfigError, named(r), " is ", p, ", which is also ", other_key,
           "; give each report its own file");
}

}  // namespace

fs::path rank_report_path(const fs::path& path, const Partition& partition) {
  if (!partition.split() || path.empty()) return path;
  char rank[64];
  std::snprintf(rank, sizeof(rank), ".rank-%05lld-of-%05lld",
                static_cast<long long>(partition.rank),
                static_cast<long long>(partition.world_size));
  const fs::path name = path.filename();
  fs::path renamed = name.stem();
  renamed += rank;
  renamed += name.extension();
  return path.parent_path() / renamed;
}

void place_report_files(Config& config, const Partition& partition) {
  // Checked before either is set: a refused path leaves the config as it was.
  fs::path summary_path = rank_report_path(config.run.summary_json, partition);
  fs::path metrics_path = rank_report_path(config.run.metrics_file, partition);
  const Report summary{"run.summary_json", "--summary-json", &summary_path};
  const Report metrics{"run.metrics_file", "--metrics-file", &metrics_path};
  if (!summary_path.empty()) check_report(summary, config, metrics_path, metrics.key);
  if (!metrics_path.empty()) check_report(metrics, config, summary_path, summary.key);
  config.run.summary_json = std::move(summary_path);
  config.run.metrics_file = std::move(metrics_path);
}

void remove_earlier_summary(const Config& config) {
  const fs::path& p = config.run.summary_json;
  if (p.empty()) return;
  std::error_code error;
  fs::remove(p, error);
  PC_CHECK(!error, StorageError, "cannot remove the earlier summary ", p,
           " (run.summary_json, --summary-json): ", error.message());
}

}  // namespace precompute
