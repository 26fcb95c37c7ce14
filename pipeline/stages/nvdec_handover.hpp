#pragma once
// When a file that is being decoded on the CPU is better started again on a free NVDEC session
// (Note [Handing a file over to NVDEC] in nvdec_handover.cpp): NVDEC's pace, learnt from the
// files it decodes, and the rule that compares it with the CPU's progress. Thread-safe: decode
// threads add to the pace and ask it at once.

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>

namespace precompute {

// How long a session must have gone untaken before a CPU decode may take it.
inline constexpr std::chrono::milliseconds kNvdecIdleBeforeHandover{50};

class NvdecPace {
 public:
  // A file of `duration_s` seconds of video took `seconds` to decode on NVDEC.
  void add(double seconds, double duration_s);
  // Seconds a session is expected to take for a file of `duration_s`; nullopt until a file has
  // been added.
  std::optional<double> expected_seconds(double duration_s) const;

 private:
  std::mutex mutex_;  // for add's read-modify-write; readers load the atomic
  std::atomic<double> seconds_per_second_{0.0};  // 0: nothing learnt yet
};

// True when a CPU decode `elapsed_s` seconds into a file and `done` (0 to 1) of the way through
// it would take clearly longer to finish than a session's `nvdec_s` for the whole file.
bool worth_handing_over(double elapsed_s, double done, double nvdec_s);

}  // namespace precompute
