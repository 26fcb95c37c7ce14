#pragma once
// rank.json through one rank's run: the one writer of the record that job_ranks.hpp reads for
// `precompute status`, `merge` and the rerun commands (Note [A rank's record] in
// rank_lifecycle.cpp).
//
// Thread-safety: none; the run that holds the rank folder's lock calls it from one thread.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "pipeline/core/error.hpp"
#include "storage/job_ranks.hpp"

namespace precompute {

class RankLifecycle {
 public:
  // `attempt`: this attempt as it starts (rank, span, process, command; `started` now, one
  // attempt); `folder`: the rank's folder, already locked by this process.
  RankLifecycle(std::filesystem::path folder, RankRecord attempt);

  // A rank whose span is empty is done as soon as its folder is checked.
  void done_without_work(bool overwrite_done);
  // Start-up passed (nothing refused the run): state "running" under the output's id. An attempt
  // over the same span that does not start over continues the earlier record's first start and
  // count of attempts.
  void running(const std::string& output_id, bool overwriting, bool overwrite_done);
  // The --overwrite removal is carried out: a rerun resumes from now on.
  void overwrite_carried_out();
  // The run ended with every planned sample committed.
  void done(int64_t processed, double seconds);
  // The run ended with an error: "stopped" for a stop request, else "failed". Never throws: the
  // error goes on, and a record that cannot be written is only a warning beside it.
  void ended_by(const Error& error) noexcept;

 private:
  void write() const;

  std::filesystem::path folder_;
  RankRecord record_;
  std::optional<RankRecord> earlier_;  // read by running(), under the folder's lock
};

}  // namespace precompute
