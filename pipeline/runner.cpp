#include "pipeline/runner.hpp"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "encoders/early_start.hpp"
#include "encoders/encoder.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/core/sha256.hpp"
#include "pipeline/graph.hpp"
#include "pipeline/input/manifest.hpp"
#include "pipeline/input/tar_index_cache.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/crash_containment.hpp"
#include "pipeline/early_decoding.hpp"
#include "pipeline/host_memory_budget.hpp"
#include "pipeline/memory_budget.hpp"
#include "pipeline/metrics_file.hpp"
#include "pipeline/preprocessing_attribute.hpp"
#include "pipeline/progress_reporter.hpp"
#include "pipeline/resume.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/run_summary.hpp"
#include "pipeline/start_up_trace.hpp"
#include "pipeline/stages/batch_cost_feedback.hpp"
#include "pipeline/summary_file.hpp"
#include "storage/atomic_file.hpp"
#include "storage/dataset_view.hpp"
#include "storage/hdf5_lock.hpp"
#include "storage/job_ranks.hpp"
#include "storage/output_folder.hpp"
#include "storage/output_id.hpp"
#include "storage/output_index.hpp"
#include "storage/rank_lifecycle.hpp"
#include "storage/shard_reader.hpp"

namespace precompute {

// Note [The default failure limit]
// Failed samples are part of the data (a few broken files, clips without a sound track), so a
// run that records them succeeds. A run where most samples failed has a systematic fault
// instead (a wrong path prefix, an encoder that rejects what it is sent, a config made for
// another dataset), and exit 0 would let a scheduler go on as if its output were usable. So by
// default a run exits 3 when more than half of its samples have failure records
// (run.max_failures: 50%), counted over the whole output as the limit always is; a count,
// another percentage or -1 (no limit) is the user's to set. A modality that embeds nothing fails
// the run under any limit (Note [A modality that embeds nothing] in empty_modalities.cpp).
bool RunSummary::over_failure_limit(const RunSection& run) const {
  if (run.max_failures >= 0 && output_failed_samples > run.max_failures) return true;
  if (run.max_failure_fraction >= 0 && total_samples > 0 &&
      static_cast<double>(output_failed_samples) >
          run.max_failure_fraction * static_cast<double>(total_samples)) {
    return true;
  }
  return false;
}

namespace {

int cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

EncoderPools load_encoders(const Config& config, EarlyStart* early) {
  EncoderPools pools;
  for (Modality m : kAllModalities) {
    if (!config.enabled(m)) continue;
    std::vector<std::unique_ptr<Encoder>> encoders;
    std::set<std::string> seen;
    for (const auto& device : config.devices_for(m)) {
      const auto resolved = resolve_device(device);
      if (!seen.insert(resolved).second) continue;
      const auto started = std::chrono::steady_clock::now();
      encoders.push_back(
          load_encoder(config, m, resolved, early ? early->model_hash(m) : ModelHash()));
      const auto& info = encoders.back()->info();
      spdlog::info("{} encoder {} on {}: {} vectors of dim {}, loaded and warmed up in {:.2f} s",
                   modality_name(m), info.model_file, info.device,
                   info.per_step ? "per-step" : "pooled", info.dim,
                   seconds_since(started));
    }
    pools[modality_index(m)] = std::make_shared<EncoderPool>(std::move(encoders));
  }
  return pools;
}

namespace {

// `recorded`: the config the shards record; a rank of a split job records the job's (its
// output.path is the job's output, not the rank folder), so that its shards are the ones a single
// run writes.
ShardMeta make_meta(const Config& config, const EncoderPools& pools, const Config& recorded) {
  ShardMeta meta;
  meta.tool_version = PRECOMPUTE_VERSION;
  meta.dtype = config.output.dtype;
  meta.chunk_rows = config.output.chunk_rows;
  meta.config_json = full_config_json(recorded);
  meta.kept_columns = config.output.keep_columns.names;
  Sha256 fingerprint;
  fingerprint.update(semantic_config_json(config));
  for (Modality m : kAllModalities) {
    if (!pools[modality_index(m)]) continue;
    const auto& info = pools[modality_index(m)]->info();
    ModalitySchema schema;
    schema.modality = m;
    schema.per_step = info.per_step;
    schema.dim = info.dim;
    schema.encoder = info.model_file;
    schema.encoder_sha256 = info.model_sha256;
    schema.pooling = std::string(pooling_name(config.section(m).pooling_mode()));
    schema.preprocessing_json = preprocessing_json(config, m);
    fingerprint.update(info.model_sha256);
    fingerprint.update(schema.preprocessing_json);
    meta.modalities[modality_index(m)] = std::move(schema);
  }
  meta.config_fingerprint = fingerprint.hex_digest();
  meta.output_id = output_id_for(meta.config_fingerprint);
  return meta;
}

// Note [Samples without a configured input]
// A line may give inputs that no configured modality uses (only text under a config with only a
// video section). Such a sample gets a no_input failure record per configured modality
// (SamplePreparer), so it is counted and listed instead of vanishing. When no line at all can be
// used, the config and the input do not belong together: the run is refused before any work.
// A configured modality that no line feeds is refused too (Note [A modality that no line feeds]
// in pipeline/input/input_columns.cpp).
void check_usable_input(const std::vector<SampleSpec>& samples, const Config& config,
                        const std::filesystem::path& input, const InputColumns& columns) {
  int64_t usable = 0;
  for (const auto& s : samples) usable += sample_has_configured_input(s, config) ? 1 : 0;
  if (usable > 0) {
    if (usable < static_cast<int64_t>(samples.size())) {
      spdlog::warn("{} of {} samples give no input that the configured modalities use; each is "
                   "recorded as a failure of category no_input",
                   static_cast<int64_t>(samples.size()) - usable, samples.size());
    }
    return;
  }
  std::string configured;
  for (Modality m : kAllModalities) {
    if (config.enabled(m)) {
      configured += (configured.empty() ? "" : ", ") + std::string(modality_name(m));
    }
  }
  PC_THROW(InputError, "none of the ", samples.size(), " samples of ", input,
           " gives an input that the config's modalities (", configured,
           ") use (", describe_columns(columns),
           "); add a section for the modalities the input has (video, audio, text) or check "
           "input.manifest / --input");
}

using Clock = std::chrono::steady_clock;

// The input, held once: the plan and the graph refer to its samples by position (seq).
struct Input {
  std::vector<SampleSpec> samples;
  std::filesystem::path path;  // input.manifest, or input.folder without one
  // Tar input: the tars' indexes, kept from an earlier run or read now, and those read now until
  // the run may write them (Note [Tar indexes kept in the output folder]).
  std::shared_ptr<TarIndexCache> tar_indexes;

  // The id at a position, for rebuilding an index from the shards.
  std::optional<std::string_view> id_at(int64_t seq) const {
    if (seq < 0 || seq >= static_cast<int64_t>(samples.size())) return std::nullopt;
    return samples[static_cast<size_t>(seq)].id;
  }
  // The input of a shard's range, stored in each shard and checked when an index is rebuilt.
  std::string range_identity(int64_t first, int64_t count) const {
    return input_identity(samples, first, count);
  }
  // The kept columns' values at a position, stored next to its embeddings.
  std::vector<std::string> columns_at(int64_t seq) const {
    return samples[static_cast<size_t>(seq)].columns;
  }
  // The whole input's identity for the index (input_identity()), hashed on a thread of its own
  // while the encoders load (0.3 s for 1,000,000 captions on the GPU machine); a resume's input
  // check takes it too. Declared after `samples`, which it reads: it is destroyed first, and its
  // destructor waits for the hashing to end.
  std::shared_future<std::string> sha256;
};

// Fills `input` in place: the hashing thread reads input.samples, so the Input never moves.
// `folder`: the output folder this process writes (a rank's folder for a rank), where the tars'
// indexes are kept.
void read_checked_input(const Config& config, const std::filesystem::path& folder, Input& input) {
  InputColumns columns;
  if (!config.input.tars.empty()) input.tar_indexes = std::make_shared<TarIndexCache>(folder);
  input.samples = read_input(config.input, config.output.keep_columns.names, &columns,
                             config.text.max_text_bytes, input.tar_indexes.get());
  if (input.tar_indexes) {
    spdlog::info("tar indexes: {} kept from an earlier run, {} read from the tars",
                 input.tar_indexes->reused(), input.tar_indexes->scanned());
  }
  input.path = !config.input.manifest.empty()
                   ? config.input.manifest
                   : !config.input.tars.empty() ? std::filesystem::path(config.input.tars.text())
                                                : config.input.folder;
  spdlog::info("input: {} samples from {}", input.samples.size(), input.path.string());
  check_usable_input(input.samples, config, input.path, columns);
  check_input_columns(input.samples, columns, config);
  mark_start_up("input checked");
  input.sha256 = std::async(std::launch::async, [&samples = input.samples] {
                   return input_identity(samples, samples.size());
                 }).share();
}

// The output folder, locked, and the earlier run in it as found; nothing in it changed yet.
struct Output {
  OutputFolder folder;
  bool overwrite = false;  // this run removes the earlier run's files (Note [Overwrite once])
  std::optional<OutputIndex> earlier;  // the earlier run's index on disk, unless overwriting
};

// Locks the folder (creating it and its lock file, nothing else); another's files are refused
// unless --overwrite removes them.
OutputFolder open_output_folder(const Config& config, const RunContext& context) {
  OutputFolderOptions options;
  options.allow_foreign = config.output.overwrite;
  options.owner_pid = context.owner_pid;
  return OutputFolder::open(config.output.path, options);
}

Output open_output(const Config& config, const RunContext& context, const Input& input) {
  Output output{open_output_folder(config, context),
                config.output.overwrite && !context.overwrite_done, std::nullopt};
  if (!output.overwrite) {
    output.earlier = output.folder.peek_previous_run();
    if (output.earlier) {
      check_same_input(*output.earlier, input.samples, input.sha256,
                       config.output.keep_columns.names, config.output.path);
    }
  }
  mark_start_up("output folder opened and locked");
  return output;
}

// Crash containment around every decode of the run (Note [Crash containment] in
// crash_containment.cpp): the in-flight journal, the contained preparer and the watchdog, from
// the first decode (early or in the graph) to the graph's end.
struct Containment {
  Containment(const Config& config, const SamplePreparer& preparer, int decode_threads)
      : journal(config.output.path, decode_threads),
        contained(preparer, journal, read_quarantine(config.output.path)),
        // Two decodes (video, audio) may each take the limit; the watchdog is the backstop for a
        // decoder that ignores FFmpeg's interrupt callback.
        watchdog(journal, std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::duration<double>(2 * config.run.sample_timeout_s + 5))) {
  }
  InflightJournal journal;
  ContainedPreparer contained;
  SampleWatchdog watchdog;
};

// The encoders and decoders, ready, and what they and the device budget decided.
struct Calibrated {
  EncoderPools pools;
  double load_seconds = 0.0;  // loading and warming up the encoders
  // Of load_seconds, the time no sample was being decoded beside the load (Note [Decoding while
  // the encoders load] in early_decoding.cpp): the run's clock leaves it out.
  double load_waited_seconds = 0.0;
  double calibrate_seconds = 0.0;  // setting up the decoders, and the rest of load_and_calibrate()
  SamplePreparer preparer;
  int decode_threads = 1;
  ShardMeta meta;               // what every shard of this run records
  BatchLimitsByModality limits;  // under run.gpu_memory_budget
  std::vector<DeviceBudget> gpu_budget;  // what that budget came to on each GPU
  // Set when samples were decoded while the encoders loaded; the graph takes them. Declared
  // after `containment`, which they use: they end first.
  std::unique_ptr<Containment> containment;
  std::unique_ptr<EarlyDecoding> early;
};

// The input positions to decode while the encoders load, or none where early decoding could
// change what the run does (Note [Decoding while the encoders load]): the first of those the
// folder, as found, leaves to do, twice the decode threads.
std::vector<int64_t> early_positions(const Config& config, const RunContext& context,
                                     const Output& output, const Input& input,
                                     const RankSpan& span, int decode_threads) {
  if (config.run.host_memory_budget > 0 || config.output.retry_failed) return {};
  // An earlier run's quarantine, which --overwrite removes: its positions are not this input's.
  if (output.overwrite && !context.quarantine_is_this_commands &&
      std::filesystem::exists(config.output.path / kQuarantineFileName)) {
    return {};
  }
  const OutputIndex nothing_done;
  auto positions = plan_run(input.samples, output.overwrite || !output.earlier
                                               ? nothing_done
                                               : *output.earlier,
                            config.output.shard_size, /*retry_failed=*/false, config.output.path,
                            span.first_seq, span.end_seq)
                       .positions;
  positions.resize(std::min(positions.size(), 2 * static_cast<size_t>(decode_threads)));
  return positions;
}

// Refusals come first (Note [Refuse before touching the output]): nothing here changes the
// output folder but the in-flight journal of early decoding, which a refusal removes.
Calibrated load_and_calibrate(const Config& config, const RunContext& context,
                              const Output& output, RunStats& stats, const Config& recorded,
                              EarlyStart& early, const Input& input, const RankSpan& span) {
  spdlog::info("compute: {}", early.devices());
  // The encoders load on a thread of their own while the decoders are set up and start on the
  // first samples (Note [Decoding while the encoders load]).
  auto loading = std::async(std::launch::async, [&config, &early] {
    const auto started = Clock::now();
    auto pools = load_encoders(config, &early);
    return std::make_tuple(std::move(pools), started, Clock::now());
  });
  const auto calibrate_started = Clock::now();
  // Also before the output is touched: it opens the NVDEC sessions and the tokenizer, either of
  // which may refuse the run.
  SamplePreparer preparer(config, stats);
  mark_start_up("decoders and tokenizer set up");
  // One decode thread per core, plus one per NVDEC session that joins the CPU decoders (Note
  // [Choosing the video decoder]).
  const int decode_threads = config.run.decode_threads > 0
                                 ? config.run.decode_threads
                                 : cores() + preparer.decode_threads_beside_the_cpu();
  std::unique_ptr<Containment> containment;
  std::unique_ptr<EarlyDecoding> early_decoding;
  if (auto positions = early_positions(config, context, output, input, span, decode_threads);
      !positions.empty()) {
    containment = std::make_unique<Containment>(config, preparer, decode_threads);
    const size_t count = positions.size();
    early_decoding = std::make_unique<EarlyDecoding>(
        input.samples, std::move(positions),
        [c = containment.get()](const SampleSpec& spec) { return c->contained(spec); },
        decode_threads,
        // A sample counts as prepared once the graph takes it (the progress line's "decoding").
        [&stats] { stats.prepared.fetch_sub(1, std::memory_order_relaxed); },
        [&stats] { stats.prepared.fetch_add(1, std::memory_order_relaxed); });
    mark_start_up(detail::concat("early decoding started: ", count, " sample(s)"));
  }
  double calibrate_seconds = seconds_since(calibrate_started);
  auto [pools, load_started, loaded] = loading.get();
  const double load_seconds = std::chrono::duration<double>(loaded - load_started).count();
  // The decoders stood idle from when the early samples were done, or from the start.
  auto idle_from = load_started;
  if (early_decoding) {
    const auto idle = early_decoding->idle_since();
    idle_from = idle ? std::max(*idle, load_started) : loaded;
    spdlog::info("{} sample(s) decoded while the encoders loaded", early_decoding->prepared());
  }
  const double load_waited_seconds =
      std::max(0.0, std::chrono::duration<double>(loaded - idle_from).count());
  mark_start_up("encoders loaded and warmed up");
  const auto rest_started = Clock::now();
  auto meta = make_meta(config, pools, recorded);
  if (output.earlier) {
    check_same_settings(output.earlier->meta, meta, semantic_config_json(config),
                        config.output.path);
  }
  mark_start_up("settings recorded and checked");
  // Batch limits under run.gpu_memory_budget (Note [Memory budgets]); throughput settings only.
  auto budgeted = apply_memory_budget(config, pools);
  mark_start_up("batch limits set");
  calibrate_seconds += seconds_since(rest_started);
  Calibrated calibrated{std::move(pools),
                        load_seconds,
                        load_waited_seconds,
                        calibrate_seconds,
                        std::move(preparer),
                        decode_threads,
                        std::move(meta),
                        std::move(budgeted.limits),
                        std::move(budgeted.devices),
                        std::move(containment),
                        std::move(early_decoding)};
  return calibrated;
}

// The index this run starts from and the work left to do.
struct Planned {
  OutputIndex index;  // as written at the start: the committed shards this run keeps
  RunPlan plan;
};

// Writes the tars' indexes read by this run into its folder (Note [Tar indexes kept in the
// output folder]). They only spare a later run reading headers again: one that cannot be
// written is a warning, and the run goes on.
void keep_tar_indexes(const Config& config, const Input& input) {
  if (!input.tar_indexes) return;
  for (const auto& [name, bytes] : input.tar_indexes->take_files()) {
    try {
      write_file_atomically(config.output.path / name, bytes);
    } catch (const StorageError& e) {
      spdlog::warn("a tar's index is not kept for later runs: {}", e.what());
    }
  }
}

// The first step that changes the output folder: the earlier run's files are removed
// (--overwrite) or repaired (a resume), and the index of what is kept is written.
// `span`: the input positions this run covers (a rank's; the whole input otherwise).
Planned plan(const Config& config, const RunContext& context, const Input& input,
             const Output& output, const Calibrated& calibrated, const RankSpan& span) {
  OutputIndex index;
  index.meta = calibrated.meta;
  if (config.text.enabled) index.model_settings = config.text.origins;
  for (const EncoderSection* media : {static_cast<const EncoderSection*>(&config.video),
                                      static_cast<const EncoderSection*>(&config.audio)}) {
    index.model_settings.insert(index.model_settings.end(), media->origins.begin(),
                                media->origins.end());
  }
  std::optional<OutputIndex> previous;
  if (output.overwrite) {
    // This command's own files stay: the journal of the samples decoded early, and a quarantine
    // its supervisor wrote after a crash among them (Note [Decoding while the encoders load]).
    std::vector<std::string> own;
    if (calibrated.containment) own.emplace_back(kInflightFileName);
    if (context.quarantine_is_this_commands) own.emplace_back(kQuarantineFileName);
    output.folder.remove_previous_run(own);
    mark_start_up("the earlier run's files removed (--overwrite)");
  } else {
    previous = output.folder.load_previous_run(
        [&](int64_t seq) { return input.id_at(seq); },
        [&](int64_t first, int64_t count, const std::vector<std::string>& kept_columns) {
          // Another list of kept columns: not this input's identity to judge; the settings
          // check below refuses the run (Note [Kept columns]).
          return kept_columns == config.output.keep_columns.names
                     ? input.range_identity(first, count)
                     : std::string();
        });
    if (previous && !output.earlier) {
      // Rebuilt from the shards (the index on disk was damaged or gone): not checked above.
      check_same_input(*previous, input.samples, input.sha256, config.output.keep_columns.names,
                       config.output.path);
      check_same_settings(previous->meta, index.meta, semantic_config_json(config),
                          config.output.path);
    }
    if (previous) index.shards = std::move(previous->shards);
    mark_start_up("the earlier run, if any, read and repaired");
  }
  index.total_samples = static_cast<int64_t>(input.samples.size());
  index.shard_size = config.output.shard_size;
  index.input = input.path.string();
  index.input_samples = static_cast<int64_t>(input.samples.size());
  index.input_sha256 = input.sha256.get();
  if (context.partition.split()) {
    index.rank = IndexRank{context.partition.rank, context.partition.world_size, span.first_seq,
                           span.end_seq};
  }
  RunPlan plan = plan_run(input.samples, index, config.output.shard_size,
                          config.output.retry_failed, config.output.path, span.first_seq,
                          span.end_seq);
  if (previous && output.earlier && plan.positions.empty()) {
    // Note [A resume with nothing to do]
    // Every sample is committed already, so the earlier index stays as it is on disk, with the
    // config it records: a rerun with another --batch-size (free to change on resume) stores
    // nothing new, and rewriting the index would only make the record disagree with the run
    // that made the shards. The view is remade only when it is not this index's.
    index = *output.earlier;
    if (!dataset_view_problem(config.output.path, index).empty()) {
      refresh_dataset_view(config.output.path, index);
    }
  } else {
    write_index(config.output.path, index);
    refresh_dataset_view(config.output.path, index);  // never throws: the view is a convenience
  }
  mark_start_up("index and view written, or kept when there is nothing to do");
  keep_tar_indexes(config, input);
  if (output.overwrite && context.after_overwrite) context.after_overwrite();

  if (previous) {
    spdlog::info("resuming {}: {} of {} samples are in committed shards; {} to process in {} "
                 "shard(s)",
                 config.output.path.string(), plan.committed_samples, span.samples(),
                 plan.positions.size(), plan.shards.ranges().size());
  }
  return {std::move(index), std::move(plan)};
}

// The graph's threads and bounds for the encoders and decode threads of the run.
struct GraphSizing {
  GraphSettings settings;
  size_t needed = 0;  // samples in flight that a full batch of every modality needs
};

GraphSizing size_graph(const Config& config, const Calibrated& calibrated) {
  GraphSizing sizing;
  GraphSettings& settings = sizing.settings;
  const int decode_threads = calibrated.decode_threads;
  settings.decode_concurrency = decode_threads;
  int max_batch = 1;
  size_t encoders = 0;
  for (Modality m : kAllModalities) {
    const auto& pool = calibrated.pools[modality_index(m)];
    if (!pool) continue;
    settings.encode_concurrency[modality_index(m)] = pool->size();
    encoders += pool->size();
    max_batch = std::max(max_batch, calibrated.limits[modality_index(m)]->max_samples);
  }
  // The limit must leave room for a full batch of every modality plus the samples being decoded,
  // or batches would wait for samples the limit holds back.
  const size_t needed = static_cast<size_t>(max_batch) * (encoders + 1) +
                        2 * static_cast<size_t>(decode_threads);
  sizing.needed = needed;
  settings.max_in_flight = std::max<size_t>(needed, static_cast<size_t>(config.run.max_in_flight));
  // With a host budget, bytes bound memory and the count may be larger (Note [Host memory
  // budget]).
  if (config.run.host_memory_budget > 0 && config.run.max_in_flight == 0) {
    settings.max_in_flight = 8 * needed;
  }
  if (config.run.max_in_flight > 0 && static_cast<size_t>(config.run.max_in_flight) < needed) {
    spdlog::warn("run.max_in_flight {} is too small for batch size {} and {} decode threads; "
                 "using {}", config.run.max_in_flight, max_batch, decode_threads, needed);
  }
  // Decode bodies, one body per encoder and the two serial stages each occupy a thread.
  settings.threads = std::max(cores(), decode_threads + static_cast<int>(encoders) + 2);
  spdlog::info("pipeline: {} decode threads, {} samples in flight at most, shards of {} samples",
               decode_threads, settings.max_in_flight, config.output.shard_size);
  return sizing;
}

// The CUDA devices the encoders run on, for the progress line.
std::vector<std::string> gpu_devices(const EncoderPools& pools) {
  std::vector<std::string> devices;
  for (const auto& pool : pools) {
    if (!pool) continue;
    for (const auto& e : pool->encoders()) {
      const auto& device = e->info().device;
      if (device.rfind("cuda", 0) == 0 &&
          std::find(devices.begin(), devices.end(), device) == devices.end()) {
        devices.push_back(device);
      }
    }
  }
  return devices;
}

// What the graph left behind.
struct Executed {
  OutputIndex index;  // every shard of the output, committed
  int64_t peak_decoded_bytes = 0;
  double early_decoding_seconds = 0.0;  // RunSummary::early_decoding_seconds
};

// Throws StoppedError after a stop request; otherwise every planned sample is committed.
void check_finished(const Config& config, const OutputIndex& index, const RunStats& stats) {
  if (stop_requested()) {
    const int signal = stop_signal();
    throw StoppedError(
        signal,
        detail::concat("stopped by ", stop_signal_name(signal), ": ", index.shards.size(),
                       " shard(s) committed in ", config.output.path.string(),
                       ", samples of unfinished shards dropped; rerun the same command to resume"),
        __FILE__, __LINE__);
  }
  PC_ASSERT(stats.completed.load() == stats.total.load(), "run ended with ",
            stats.completed.load(), " of ", stats.total.load(), " samples complete");
}

// Runs the planned samples through the graph, in crash containment and under the host memory
// budget, and commits their shards; `metrics` is rewritten at every progress tick.
Executed execute(const Config& config, const Input& input, const Calibrated& calibrated,
                 Planned& planned, RunStats& stats, MetricsFile& metrics) {
  stats.total = static_cast<int64_t>(planned.plan.positions.size());
  GraphSizing sizing = size_graph(config, calibrated);
  // Made before the encoders loaded when samples were decoded then (Calibrated::early).
  std::unique_ptr<Containment> own_containment;
  Containment* containment = calibrated.containment.get();
  if (containment == nullptr) {
    own_containment =
        std::make_unique<Containment>(config, calibrated.preparer, calibrated.decode_threads);
    containment = own_containment.get();
  }
  HostMemoryBudget host_budget(config.run.host_memory_budget,
                               static_cast<int64_t>(sizing.needed));
  sizing.settings.before_sample = [&] {
    host_budget.wait_for_room([&] { return stats.submitted.load() - stats.completed.load(); },
                              [&] { return stats.submitted.load() - stats.prepared.load(); });
  };
  const PrepareFn prepare = [&](const SampleSpec& spec) {
    PreparedSamplePtr sample = calibrated.early ? calibrated.early->take(spec.seq) : nullptr;
    if (!sample) return host_budget.charge(containment->contained(spec));
    if (sample->order != spec.order) {
      // Planned at another place than the folder as found suggested (a repaired index).
      auto moved = std::make_shared<PreparedSample>(*sample);
      moved->order = spec.order;
      sample = std::move(moved);
    }
    return host_budget.charge(std::move(sample));
  };
  BatchCostFeedback feedback;
  BatchRouter router(calibrated.limits, planned.plan.shards, &feedback);
  EncodeStage encode(calibrated.pools, stats, feedback);
  ShardCommitter committer(config.output.path, planned.index, stats);
  ShardAssembler assembler(committer, planned.plan.shards, stats,
                           [&](int64_t first, int64_t count) {
                             return input.range_identity(first, count);
                           },
                           [&](int64_t seq) { return input.columns_at(seq); });
  for (auto& kept : planned.plan.kept) assembler.preload(std::move(kept));
  mark_start_up("graph set up");
  // The decoders' time before the graph: from the early samples' start until they were done or
  // the graph began (Note [How busy the decoders were]).
  double early_decoding_seconds = 0.0;
  if (calibrated.early) {
    const auto now = Clock::now();
    const auto end = std::min(calibrated.early->idle_since().value_or(now), now);
    early_decoding_seconds =
        std::max(0.0, std::chrono::duration<double>(end - calibrated.early->started()).count());
  }
  const ProgressContext progress_context{Clock::now(), gpu_devices(calibrated.pools)};
  {
    metrics.write(stats);
    std::function<void()> on_tick;
    if (metrics.enabled()) on_tick = [&] { metrics.write(stats); };
    ProgressReporter progress(stats, progress_context, config.run.progress_interval_s, on_tick);
    const StageTimer graph(stats.graph_ns);
    run_graph(input.samples, planned.plan.positions, prepare, router, encode, assembler, stats,
              sizing.settings);
    committer.finish();
  }
  spdlog::info("progress: {}", progress_line(stats, progress_context));
  calibrated.preparer.warn_about_unknown_tokens();
  check_finished(config, committer.index(), stats);
  // Every sample is committed: suspects of earlier crashes are settled.
  std::error_code ignored;
  std::filesystem::remove(config.output.path / kQuarantineFileName, ignored);
  return {committer.index(), host_budget.peak_bytes(), early_decoding_seconds};
}

// Note [How busy the decoders were]
// A video job is bound by its decoders (docs/benchmarks.md, "Video"), so the
// summary says how busy they kept while they had work: the time files spent on NVDEC sessions as
// a share of sessions x that wall time, and the time in CPU video decodes divided by it, the CPU
// decodes running at once on average (at most the decode threads). That wall time is the graph's
// plus, where samples were decoded while the encoders loaded (Note [Decoding while the encoders
// load] in early_decoding.cpp), the time from their start until they were done or the graph
// began. Sessions near 100% and CPU decodes near the cores mean the decoders are the bound;
// lower figures mean the rest of the graph (the encoders, the memory bounds, the writer) kept
// them waiting. It leaves out the rest of `seconds` (reading the input, opening the sessions,
// calibrating the budget).
//
// The run's summary: its counters (summary_from_stats()) and what the run around them decided.
// `span`: the input positions this run covers; `resumed_samples`: those already committed when
// it started; `executed.index`: the output as it ends.
RunSummary summarise(const Config& config, const Calibrated& calibrated, const RankSpan& span,
                     int64_t resumed_samples, const Executed& executed, const RunStats& stats,
                     Clock::time_point run_started) {
  std::array<bool, kNumModalities> configured{};
  for (int i = 0; i < kNumModalities; ++i) configured[i] = calibrated.pools[i] != nullptr;
  RunSummary summary = summary_from_stats(stats, configured);
  summary.output = config.output.path;
  // A rank's --max-failures (a count or a percentage) applies to its part.
  summary.total_samples = span.samples();
  summary.resumed_samples = resumed_samples;
  summary.video_decoders = calibrated.preparer.video_decoders();
  summary.nvdec_sessions = calibrated.preparer.nvdec_sessions();
  summary.peak_decoded_bytes = executed.peak_decoded_bytes;
  summary.early_decoding_seconds = executed.early_decoding_seconds;
  summary.peak_rss_bytes = peak_rss_bytes();
  summary.device_memory = device_memory_peaks();
  summary.gpu_budget = calibrated.gpu_budget;
  summary.start_up = start_up_marks();
  summary.load_seconds = calibrated.load_seconds;
  summary.load_waited_seconds = calibrated.load_waited_seconds;
  summary.seconds = seconds_since(run_started) - calibrated.load_waited_seconds;
  // The whole output's failures: a resumed run is judged like an uninterrupted one.
  summary.output_failed_samples = 0;
  for (const auto& entry : executed.index.shards) {
    summary.output_failed_samples += entry.failed_samples;
    summary.samples_with_embeddings += entry.num_samples;
    for (int m = 0; m < kNumModalities; ++m) summary.embedded[m] += entry.modality_counts[m];
  }
  // For the summary file (pipeline/summary_file.hpp).
  summary.output_id = calibrated.meta.output_id;
  summary.config_fingerprint = calibrated.meta.config_fingerprint;
  summary.calibrate_seconds = calibrated.calibrate_seconds;
  return summary;
}

// The output's totals from its index, with the failure records of `index`'s shards per modality
// and category: read back from the shards not in `counted`, whose records `counted_failures`
// already holds (this run's, counted as it made them). An output whose shards cannot be read
// back gets totals without the records (OutputTotals::failures unset).
OutputTotals output_totals(
    const std::filesystem::path& folder, const OutputIndex& index,
    const std::set<std::string>& counted,
    const std::array<std::map<std::string, int64_t>, kNumModalities>& counted_failures) {
  OutputTotals totals;
  totals.total_samples = index.total_samples;
  for (const auto& entry : index.shards) {
    totals.covered_samples += entry.seq_count;
    totals.samples_with_embeddings += entry.num_samples;
    totals.failed_samples += entry.failed_samples;
    totals.failure_records += entry.num_failures;
    totals.bytes += static_cast<int64_t>(entry.bytes);
    for (int m = 0; m < kNumModalities; ++m) totals.embedded[m] += entry.modality_counts[m];
  }
  totals.shards = static_cast<int64_t>(index.shards.size());
  totals.complete = totals.covered_samples == index.covers_end() - index.covers_first();
  auto failures = counted_failures;
  try {
    const std::lock_guard lock(hdf5_lock());
    for (const auto& entry : index.shards) {
      if (entry.num_failures == 0 || counted.count(entry.file) > 0) continue;
      for (const auto& f : read_shard_failures(folder / entry.file)) {
        ++failures[modality_index(f.modality)][std::string(failure_category_name(f.category))];
      }
    }
    totals.failures = std::move(failures);
  } catch (const Error& e) {
    spdlog::warn("the summary leaves out the output's failure records by category: {}", e.what());
  }
  return totals;
}

// Note [Reporting a run's end]
// From the moment plan() begins changing the output folder, every end of the run is reported
// before the folder's lock is released: the metrics file's last state and the summary (run.
// summary_json, and the folder's summary.json: Note [The run's summary file] in
// summary_file.cpp), with the exit code the command then ends with (RunContext::exit_code).
// Written under the lock, the folder's copy can never land in a folder another run has taken
// since. A run that succeeds is summarised from its counters and the index it leaves; one that
// an error ends (a stop, a full disk, a bug) from its counters and the index.json it committed,
// read back, and the error goes on to the command. The folder's copy is written only where that
// index is this run's output: a run refused in plan() for other settings (the index rebuilt from
// another output's shards) would leave a copy whose id contradicts the folder's files, which the
// next run would refuse as someone else's. A summary that cannot be written is the run's error
// (exit 74: nothing that failed may end in exit 0), reported in turn as the run's end; after an
// error, only a warning beside it. Refusals before plan() leave the folder as it was:
// the command writes their summary to run.summary_json alone (tools/cli/run_command.cpp).

MetricsContext metrics_context(const Config& config, const RunContext& context,
                               const Calibrated& calibrated, Clock::time_point run_started) {
  MetricsContext m;
  m.output = config.output.path.string();
  m.config_fingerprint = calibrated.meta.config_fingerprint;
  m.rank = context.partition.rank;
  m.world_size = context.partition.world_size;
  for (int i = 0; i < kNumModalities; ++i) m.modalities[i] = calibrated.pools[i] != nullptr;
  m.gpu_devices = gpu_devices(calibrated.pools);
  m.started =
      std::chrono::system_clock::now() -
      std::chrono::duration_cast<std::chrono::system_clock::duration>(Clock::now() - run_started);
  return m;
}

// Writes the end's metrics and summary. The folder's summary.json only where the folder holds
// this run's output (`ours`: a run refused for other settings leaves another output's files,
// whose id the copy would contradict), and left as it is by a run that changed nothing there and
// ends as the run it records did.
void report_end(const Config& config, const RunSummary& summary, const RunStats& stats,
                MetricsFile& metrics, bool ours, bool overwrote) {
  metrics.write(stats, summary.exit_code);
  const bool keep = ours && (summary.processed_samples > 0 || overwrote ||
                             !kept_summary_ended_with(config.output.path, summary.exit_code));
  write_summary_files(summary, config.run.summary_json, keep);
}

// Plans, executes and summarises the run, and reports its end, whatever it is (Note [Reporting a
// run's end]). `after_plan` runs once the folder is planned (a rank records --overwrite done).
RunSummary run_and_report(const Config& config, const RunContext& context, const Input& input,
                          const Output& output, const Calibrated& calibrated, const RankSpan& span,
                          RunStats& stats, Clock::time_point run_started,
                          const std::function<void()>& after_plan = {}) {
  MetricsFile metrics(config.run.metrics_file,
                      metrics_context(config, context, calibrated, run_started));
  const auto with_rank = [&](RunSummary summary) {
    summary.rank = context.partition.rank;
    summary.world_size = context.partition.world_size;
    return summary;
  };
  std::optional<Planned> planned;
  try {
    planned.emplace(plan(config, context, input, output, calibrated, span));
    if (after_plan) after_plan();
    const Executed executed = execute(config, input, calibrated, *planned, stats, metrics);
    RunSummary summary = with_rank(summarise(
        config, calibrated, span, planned->plan.committed_samples, executed, stats, run_started));
    // Note [A modality that embeds nothing]: judged over the output's span, as the limit is.
    summary.empty_modalities =
        find_empty_modalities(config, input.samples, span, config.output.path, executed.index);
    // The shards this run wrote: their records are counted already.
    std::set<std::string> earlier, written;
    for (const auto& entry : planned->index.shards) earlier.insert(entry.file);
    for (const auto& entry : executed.index.shards) {
      if (earlier.count(entry.file) == 0) written.insert(entry.file);
    }
    summary.output_totals =
        output_totals(config.output.path, executed.index, written, summary.run_failures);
    summary.exit_code = context.exit_code ? context.exit_code(summary, nullptr) : 0;
    spdlog::debug("end: the run summarised");
    report_end(config, summary, stats, metrics, /*ours=*/true, output.overwrite);
    spdlog::debug("end: the summary and metrics written");
    return summary;
  } catch (const std::exception& error) {
    // What the run committed before the error: the index on disk.
    Executed left;
    std::optional<OutputIndex> on_disk;
    try {
      on_disk = read_index(config.output.path);
    } catch (const Error& e) {
      spdlog::warn("the summary leaves out the output's totals: {}", e.what());
    }
    // A folder refused for other settings holds another output: its totals are not this run's.
    const bool ours = on_disk && on_disk->meta.output_id == calibrated.meta.output_id;
    if (ours) left.index = *on_disk;
    RunSummary summary =
        with_rank(summarise(config, calibrated, span, planned ? planned->plan.committed_samples : 0,
                            left, stats, run_started));
    if (ours) summary.output_totals = output_totals(config.output.path, *on_disk, {}, {});
    summary.exit_code = context.exit_code ? context.exit_code(summary, &error) : 70;
    summary.message = error.what();
    try {
      report_end(config, summary, stats, metrics, ours, output.overwrite);
    } catch (const std::exception& report_error) {
      spdlog::warn("cannot write the run's summary: {}", report_error.what());
    }
    throw;
  }
}

}  // namespace

// Note [Overwrite once]
// --overwrite is a decision about the folder as the command found it. The supervisor restarts
// the run after a crash; a restarted run that applied --overwrite again would delete the shards
// committed since and the quarantine that pins the crash on its sample, and crash on the same
// file forever. So the first run reports when the removal is done (RunContext::after_overwrite)
// and the supervisor's later runs resume instead.
//
// Note [Refuse before touching the output]
// The order of the steps is deliberate: the input is read, the folder is locked (which only
// creates it and its lock file), the earlier run's index is read without changing anything for
// the checks that may refuse a resume, the encoders are loaded (the decoders and tokenizer set up
// and the first samples decoded meanwhile: Note [Decoding while the encoders load] in
// early_decoding.cpp) and the memory budget calibrated. Only then does plan() remove earlier
// files (--overwrite) or repair them (a resume), so a run that is refused leaves the earlier
// output as it was. What no refusal protects (CUDA's start, the models' hashes) runs from the
// start, beside the input's read (Note [Started beside the input's read] in
// encoders/early_start.cpp).

namespace {

// Note [A rank is an ordinary run]
// A rank of a split job (docs/distributed.md) runs every step above unchanged, on its own
// folder OUT/ranks/rank-R-of-N and over its span of the input (Note [Splitting a job into
// ranks] in pipeline/core/partition.cpp): its own lock, journals, quarantine, index.json and
// resume. Only two things differ: the shards record the job's config (output.path is OUT), so
// they are the shards a single run writes; and rank.json says how the rank is doing (running,
// done, failed; host, pid, times) for `precompute status` and the job summary (Note [A rank's
// record] in storage/rank_lifecycle.cpp). The rank's folder must hold the same split as this
// run: an input of another length or another shard_size moves every rank's span, and is refused.
void check_same_split(const Output& output, const Input& input, const Config& work,
                      const RankSpan& span) {
  if (!output.earlier) return;
  const auto& earlier = *output.earlier;
  PC_CHECK(earlier.total_samples == static_cast<int64_t>(input.samples.size()) &&
               earlier.shard_size == work.output.shard_size,
           ConfigError, "rank folder ", work.output.path, " holds a rank of a job over ",
           earlier.total_samples, " samples in shards of ", earlier.shard_size,
           "; this run has ", input.samples.size(), " samples in shards of ",
           work.output.shard_size, ", which splits the job into other ranks. Rerun every rank "
           "with the earlier input and shard_size, or start the job over (--overwrite on every "
           "rank, or another --output)");
  for (const auto& e : earlier.shards) {
    PC_CHECK(e.first_seq >= span.first_seq && e.first_seq + e.seq_count <= span.end_seq,
             ConfigError, "rank folder ", work.output.path, " holds ", e.file, " (positions ",
             e.first_seq, " to ", e.first_seq + e.seq_count - 1, "), outside this rank's span [",
             span.first_seq, ", ", span.end_seq, "); rerun the rank with --overwrite");
  }
}

// One run over a range of the input into `work`'s output.path: the whole input into the output
// folder, or a rank's span into its rank folder (`rank` set: Note [A rank is an ordinary run]).
// `config`: the job's config, which the shards record.
RunSummary run_range(const Config& config, const Config& work, const RankSpan& span,
                     RankLifecycle* rank, const RunContext& context, const Input& input,
                     Clock::time_point run_started, RunStats& stats, EarlyStart& early) {
  const Output output = open_output(work, context, input);
  if (rank != nullptr) check_same_split(output, input, work, span);
  // Note [A rank's record]: a refused start-up leaves rank.json as it was.
  const Calibrated calibrated =
      load_and_calibrate(work, context, output, stats, config, early, input, span);
  // Nothing can refuse the run any more: the folder may change now.
  if (rank == nullptr) {
    return run_and_report(work, context, input, output, calibrated, span, stats, run_started);
  }
  // With --overwrite, the removal happens in plan(); a restarted run (Note [Overwrite once])
  // resumes, and so does the rerun command once the removal is done.
  rank->running(calibrated.meta.output_id, output.overwrite,
                config.output.overwrite && context.overwrite_done);
  RunSummary summary;
  try {
    summary = run_and_report(work, context, input, output, calibrated, span, stats, run_started,
                             [&] {
                               if (config.output.overwrite) rank->overwrite_carried_out();
                             });
  } catch (const Error& e) {
    rank->ended_by(e);
    throw;
  }
  rank->done(summary.processed_samples, summary.seconds + summary.load_waited_seconds);
  return summary;
}

// This attempt as rank.json first records it (storage/rank_lifecycle.hpp).
RankRecord rank_attempt(const Config& config, const RunContext& context, const RankSpan& span,
                        int64_t total) {
  const Partition& part = context.partition;
  RankRecord record;
  record.rank = part.rank;
  record.world_size = part.world_size;
  record.total_samples = total;
  record.shard_size = config.output.shard_size;
  record.span = span;
  record.pid = context.owner_pid > 0 ? context.owner_pid : static_cast<int64_t>(::getpid());
  record.host = host_name();
  std::error_code ignored;
  record.config = config.file.empty() ? std::string()
                                      : std::filesystem::absolute(config.file, ignored).string();
  record.command = context.command;
  record.working_folder = context.working_folder;
  record.rank_source = part.source;
  record.started = unix_now();
  record.attempts = 1;
  return record;
}

RunSummary run_rank(const Config& config, const RunContext& context, const Input& input,
                    Clock::time_point run_started, RunStats& stats, EarlyStart& early) {
  const Partition& part = context.partition;
  const auto total = static_cast<int64_t>(input.samples.size());
  const RankSpan span = rank_span(total, config.output.shard_size, part.rank, part.world_size);
  Config work = config;
  work.output.path = rank_folder(config.output.path, part.rank, part.world_size);
  RankLifecycle rank(work.output.path, rank_attempt(config, context, span, total));
  if (span.empty()) {
    spdlog::info("rank {} of {} has no work: the input's {} samples make {} shard(s) of {}, fewer "
                 "than the ranks; nothing to do",
                 part.rank, part.world_size, total,
                 (total + config.output.shard_size - 1) / config.output.shard_size,
                 config.output.shard_size);
    const OutputFolder folder = open_output_folder(work, context);
    if (config.output.overwrite && !context.overwrite_done) {
      folder.remove_previous_run();
    } else if (const auto earlier = folder.peek_previous_run()) {
      PC_CHECK(earlier->shards.empty(), ConfigError, "rank folder ", work.output.path,
               " holds shards of an earlier split of the job, and this rank now has no work "
               "(the input's length or shard_size changed); rerun it with --overwrite");
    }
    rank.done_without_work(config.output.overwrite);
    RunSummary summary;
    summary.output = work.output.path;
    summary.total_samples = total;
    return summary;
  }
  spdlog::info("rank {} of {}: shards {} to {}, input positions {} to {} ({} of {} samples), "
               "into {}",
               part.rank, part.world_size, span.first_shard, span.end_shard - 1, span.first_seq,
               span.end_seq - 1, span.samples(), total, work.output.path.string());
  return run_range(config, work, span, &rank, context, input, run_started, stats, early);
}

}  // namespace

RunSummary run_precompute(const Config& config, const RunContext& context) {
  validate(config);
  const auto run_started = Clock::now();
  // Every step before the graph is marked: a "start-up:" line at debug level, and the summary's
  // `start_up` list of when each ended.
  clear_start_up_marks();
  mark_start_up("config read and checked; the run's clock starts");
  configure_torch_threads(config.run.torch_threads);
  EarlyStart early(config);  // Note [Started beside the input's read]
  RunStats stats;
  Input input;
  const Partition& part = context.partition;
  read_checked_input(config,
                     part.split() ? rank_folder(config.output.path, part.rank, part.world_size)
                                  : config.output.path,
                     input);
  const RankSpan whole{0, 0, 0, static_cast<int64_t>(input.samples.size())};
  RunSummary summary =
      context.partition.split()
          ? run_rank(config, context, input, run_started, stats, early)
          : run_range(config, config, whole, nullptr, context, input, run_started, stats, early);
  // The time since the last progress line is the run's end: the summary written, the decoders'
  // sessions closed and the encoders freed.
  spdlog::debug("end: the run's decoders and encoders released");
  return summary;
}

}  // namespace precompute
