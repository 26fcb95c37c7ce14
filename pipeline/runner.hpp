#pragma once
// One precompute job from a validated config to committed shards: read the input, prepare the
// output folder, load and warm up the encoders, run the graph, summarise.

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "encoders/encoder.hpp"
#include "pipeline/empty_modalities.hpp"
#include "pipeline/memory_budget.hpp"
#include "pipeline/start_up_trace.hpp"
#include "pipeline/stages/encode_stage.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/partition.hpp"

namespace precompute {

// What an output folder holds as a run ends, from its index.json: the counts `precompute inspect
// --json` gives for it.
struct OutputTotals {
  int64_t total_samples = 0;    // the input's (a rank folder: the whole job's input)
  int64_t covered_samples = 0;  // input positions in committed shards
  bool complete = false;        // every position it covers (a rank: its span) is committed
  int64_t samples_with_embeddings = 0;
  int64_t failed_samples = 0;  // samples with at least one failure record
  int64_t failure_records = 0;
  int64_t shards = 0;
  int64_t bytes = 0;
  std::array<int64_t, kNumModalities> embedded{};
  // Failure records per modality, by category; unset when they could not be read back (a run
  // that ended on an I/O error).
  std::optional<std::array<std::map<std::string, int64_t>, kNumModalities>> failures;
};

struct RunSummary {
  int64_t total_samples = 0;      // in the input
  int64_t processed_samples = 0;  // by this run (a resume skips committed shards)
  int64_t resumed_samples = 0;    // input positions in shards committed by earlier runs
  int64_t samples_with_embeddings = 0;
  int64_t failed_samples = 0;  // processed samples with at least one failure record
  int64_t output_failed_samples = 0;  // samples with failure records in the whole output
  int64_t failure_records = 0;
  int64_t repaired_texts = 0;  // captions whose invalid UTF-8 was replaced (still embedded)
  int64_t video_clips = 0;           // decoded by this run
  int64_t video_decoded_frames = 0;  // frames out of the decoders for them
  int64_t video_kept_frames = 0;     // frames sampled from them
  int64_t video_seeks = 0;
  int64_t video_seeks_undone = 0;
  int64_t video_nvdec_clips = 0;
  int64_t video_nvdec_fallbacks = 0;
  int64_t video_nvdec_handovers = 0;  // started on the CPU, restarted on a free session
  std::string video_decoders;  // "8 NVDEC session(s) on cuda:0 and CPU"; empty: the CPU alone
  int nvdec_sessions = 0;      // of video_decoders
  // Time video files spent on NVDEC sessions and in CPU decodes, summed over threads (Note [How
  // busy the decoders were] in runner.cpp).
  double video_nvdec_seconds = 0.0;
  double video_cpu_decode_seconds = 0.0;
  int64_t oom_splits = 0;      // batches split after running out of device memory
  std::array<int64_t, kNumModalities> embedded{};
  std::map<std::string, int64_t> failures_by_category;
  int64_t shards = 0;
  int64_t bytes_written = 0;
  int64_t peak_rss_bytes = 0;  // the process's peak resident memory
  int64_t peak_decoded_bytes = 0;  // decoded samples held in the pipeline at once, at most
  std::vector<DeviceMemoryPeak> device_memory;  // per CUDA device used
  std::vector<DeviceBudget> gpu_budget;  // run.gpu_memory_budget's split; empty without one
  std::vector<StartUpMark> start_up;      // the steps before the graph, as they ended
  // From reading the input to the last commit, less load_waited_seconds.
  double seconds = 0.0;
  double load_seconds = 0.0;   // loading and warming up the encoders
  // Of load_seconds, the time no sample was decoded beside the load (Note [Decoding while the
  // encoders load] in pipeline/early_decoding.cpp): all of it when none was.
  double load_waited_seconds = 0.0;
  double graph_seconds = 0.0;  // of `seconds`, the graph's: decoding to the last commit
  // The decoders' time before the graph: samples decoded while the encoders loaded, from their
  // start until they were done or the graph began (Note [How busy the decoders were]).
  double early_decoding_seconds = 0.0;
  // The wall time the decoders had work in: the graph's and the early decoding's.
  double decoding_seconds() const { return graph_seconds + early_decoding_seconds; }
  std::map<std::string, double> busy_seconds;  // working time of the serial and encode stages
  std::filesystem::path output;

  // What the summary file records beyond the line above (pipeline/summary_file.hpp).
  std::string output_id;           // empty when the run ended before its settings were known
  std::string config_fingerprint;  // likewise
  int64_t rank = 0;                // of a split job (docs/distributed.md)
  int64_t world_size = 1;
  std::array<bool, kNumModalities> modalities{};  // configured
  double calibrate_seconds = 0.0;  // of `seconds`: decoders, settings check, GPU memory budget
  int64_t video_nvdec_decoded_frames = 0;              // of video_decoded_frames
  std::array<int64_t, kNumModalities> run_embedded{};  // samples this run embedded
  // This run's failure records per modality, by category.
  std::array<std::map<std::string, int64_t>, kNumModalities> run_failures;
  std::optional<OutputTotals> output_totals;  // unset: the run ended before it changed the folder
  // How the run ended: the process's exit code (README, "Exit codes"), the end it stands for
  // (summary_end_name()) and, for an error, its message.
  int exit_code = 0;
  std::string message;

  // True when the output's failed samples (earlier runs' included) exceed run.max_failures /
  // max_failure_fraction of the input.
  bool over_failure_limit(const RunSection& run) const;
  // Configured modalities that had inputs and embedded none: each fails the run, whatever the
  // failure limit (Note [A modality that embeds nothing] in pipeline/empty_modalities.cpp).
  std::vector<EmptyModality> empty_modalities;
};

// What the command around a run tells it (tools/cli/run_command.cpp).
struct RunContext {
  // The exit code the command ends with, for a run that ended without an error (`error` null:
  // the summary says how it went) or for the error that ended it; the summary and metrics files
  // written as the run ends record it (Note [Reporting a run's end] in runner.cpp). Unset: 0,
  // and 70 for an error.
  std::function<int(const RunSummary& summary, const std::exception* error)> exit_code;
  // Called once --overwrite has removed the earlier run's files: a run restarted after a crash
  // must resume what this command started, not remove it again (Note [Overwrite once]).
  std::function<void()> after_overwrite;
  // This run was restarted by its supervisor after --overwrite was carried out: the folder may
  // hold files of the user's next to this command's own.
  bool overwrite_done = false;
  // The folder's quarantine was written by this command's supervisor, after a crash in a run
  // that had not yet carried out --overwrite: it is this command's, and --overwrite keeps it (Note
  // [Decoding while the encoders load] in pipeline/early_decoding.cpp).
  bool quarantine_is_this_commands = false;
  int owner_pid = 0;  // OutputFolderOptions::owner_pid
  // This process's part of a job split into ranks (docs/distributed.md). A split run writes its
  // span of the input into rank_folder(output.path, rank, world_size), as an ordinary run.
  Partition partition;
  // The command line as typed (argv) and the folder it ran in: a rank records them, so that the
  // command printed to rerun it is exactly the one it ran (storage/job_ranks.hpp).
  std::vector<std::string> command;
  std::string working_folder;
};

// Runs the job, resuming an earlier run in the output folder (Note [What a resume redoes] in
// resume.cpp). Everything that may refuse the run (config, input, models, memory calibration)
// is checked before the output folder is changed. From then on, however it ends, the run writes
// its summary (run.summary_json and the folder's summary.json) and its metrics file's last state
// before it returns or throws (Note [Reporting a run's end]). Throws ConfigError, InputError,
// ModelError, StorageError or, after a SIGINT, SIGTERM or SIGHUP, StoppedError (see tools/cli for
// the exit code each maps to); per-sample problems are failure records, never exceptions.
RunSummary run_precompute(const Config& config, const RunContext& context = {});

class EarlyStart;  // encoders/early_start.hpp

// Loads and warms up every configured encoder, one instance per device of its modality.
// `early`: the CUDA start and model hashes a run began beside its input's read, if any.
EncoderPools load_encoders(const Config& config, EarlyStart* early = nullptr);

// The summary as printed at the end of a run.
std::string format_summary(const RunSummary& summary);

}  // namespace precompute
