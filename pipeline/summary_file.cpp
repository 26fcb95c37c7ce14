#include "pipeline/summary_file.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipeline/core/error.hpp"
#include "storage/atomic_file.hpp"
#include "storage/output_folder.hpp"

namespace precompute {

// Note [The run's summary file]
// Scripts that drive precompute (the benchmarks in tools/bench, a scheduler's epilogue) need the
// run's numbers without parsing English, so every run that gets past reading its config writes
// them as JSON: to run.summary_json when set, and, once the run has begun changing its output
// folder, to the folder's summary.json, which `precompute run` keeps next to the shards as the
// record of the run that last changed them (a run with nothing to do leaves it as it is, so
// rerunning a finished job changes no file). Its "output_totals" are read from the index.json it
// leaves (and the failure records of its shards), so they equal `precompute inspect --json`;
// "run" counts what this process did. Like every file of the tool's in an output folder, the
// folder's copy carries the output id, second after "format", where the ownership check finds
// it in the first bytes (Note [Proving a file is ours] in storage/output_id.cpp); a run that
// ended before its settings were known has no id and writes no copy there.

namespace {

using Json = nlohmann::ordered_json;

Json or_null(const std::string& text) { return text.empty() ? Json() : Json(text); }

Json by_category(const std::map<std::string, int64_t>& counts) {
  Json j = Json::object();
  for (const auto& [category, n] : counts) j[category] = n;
  return j;
}

int64_t sum(const std::map<std::string, int64_t>& counts) {
  int64_t total = 0;
  for (const auto& [category, n] : counts) total += n;
  return total;
}

std::map<std::string, int64_t> merged(
    const std::array<std::map<std::string, int64_t>, kNumModalities>& per_modality) {
  std::map<std::string, int64_t> all;
  for (const auto& counts : per_modality) {
    for (const auto& [category, n] : counts) all[category] += n;
  }
  return all;
}

Json output_totals_json(const RunSummary& s) {
  if (!s.output_totals) return Json();
  const OutputTotals& t = *s.output_totals;
  Json modalities = Json::object();
  for (Modality m : kAllModalities) {
    if (!s.modalities[modality_index(m)]) continue;
    const int64_t embedded = t.embedded[modality_index(m)];
    Json item = {{"samples", Json()},
                 {"embedded", embedded},
                 {"failed", Json()},
                 {"failures_by_category", Json()}};
    if (t.failures) {
      const auto& counts = (*t.failures)[modality_index(m)];
      item["samples"] = embedded + sum(counts);
      item["failed"] = sum(counts);
      item["failures_by_category"] = by_category(counts);
    }
    modalities[std::string(modality_name(m))] = std::move(item);
  }
  return {{"total_samples", t.total_samples},
          {"covered_samples", t.covered_samples},
          {"complete", t.complete},
          {"samples_with_embeddings", t.samples_with_embeddings},
          {"failed_samples", t.failed_samples},
          {"failure_records", t.failure_records},
          {"shards", t.shards},
          {"bytes", t.bytes},
          {"modalities", std::move(modalities)},
          {"failures_by_category", t.failures ? by_category(merged(*t.failures)) : Json()}};
}

Json run_json(const RunSummary& s) {
  Json embedded = Json::object();
  Json failures = Json::object();
  for (Modality m : kAllModalities) {
    if (!s.modalities[modality_index(m)]) continue;
    const std::string name(modality_name(m));
    embedded[name] = s.run_embedded[modality_index(m)];
    failures[name] = by_category(s.run_failures[modality_index(m)]);
  }
  return {{"samples", s.processed_samples},
          {"resumed_samples", s.resumed_samples},
          {"embedded", std::move(embedded)},
          {"failed_samples", s.failed_samples},
          {"failure_records", s.failure_records},
          {"failures", std::move(failures)},
          {"failures_by_category", by_category(s.failures_by_category)},
          {"shards_written", s.shards},
          {"bytes_written", s.bytes_written},
          {"repaired_texts", s.repaired_texts},
          {"oom_splits", s.oom_splits}};
}

Json gpu_budget_json(const std::vector<DeviceBudget>& devices) {
  Json out = Json::array();
  for (const auto& d : devices) {
    Json encoders = Json::array();
    for (const auto& e : d.encoders) {
      encoders.push_back({{"modality", std::string(modality_name(e.modality))},
                          {"need_bytes", e.need_bytes},
                          {"share_bytes", e.share_bytes},
                          {"sample_units", e.sample_units},
                          {"batch_units", e.batch_units},
                          {"warmup_batch", e.warmup_batch},
                          {"warmup_reserved_bytes", e.warmup_reserved_bytes}});
    }
    out.push_back({{"device", d.device},
                   {"budget_bytes", d.budget_bytes},
                   {"weights_bytes", d.weights_bytes},
                   {"resident_bytes", d.resident_bytes},
                   {"concurrent_calls", d.concurrent_calls},
                   {"encoders", std::move(encoders)}});
  }
  return out;
}

Json video_json(const RunSummary& s) {
  const double graph = s.decoding_seconds();
  return {{"clips", s.video_clips},
          {"clips_on_nvdec", s.video_nvdec_clips},
          {"clips_on_cpu", s.video_clips - s.video_nvdec_clips},
          {"frames_decoded", s.video_decoded_frames},
          {"frames_decoded_on_nvdec", s.video_nvdec_decoded_frames},
          {"frames_decoded_on_cpu", s.video_decoded_frames - s.video_nvdec_decoded_frames},
          {"frames_kept", s.video_kept_frames},
          {"seeks", s.video_seeks},
          {"seeks_undone", s.video_seeks_undone},
          {"nvdec_fallbacks", s.video_nvdec_fallbacks},
          {"nvdec_handovers", s.video_nvdec_handovers},
          {"decoders", s.video_decoders.empty() ? std::string("CPU") : s.video_decoders},
          {"nvdec_sessions", s.nvdec_sessions},
          // Note [How busy the decoders were] in runner.cpp
          {"nvdec_busy_fraction", s.nvdec_sessions > 0 && graph > 0
                                      ? Json(s.video_nvdec_seconds / (s.nvdec_sessions * graph))
                                      : Json()},
          {"cpu_decodes_at_once", graph > 0 ? Json(s.video_cpu_decode_seconds / graph) : Json()}};
}

}  // namespace

std::string_view summary_end_name(int exit_code) {
  switch (exit_code) {
    case 0:
      return "done";
    case 3:
      return "too_many_failures";
    case 129:
    case 130:
    case 143:
      return "stopped";
    case 2:
    case 65:
    case 69:
    case 73:
      return "refused";
    default:
      return "failed";
  }
}

std::string summary_text(const RunSummary& s) {
  Json j;
  j["format"] = kSummaryFormat;
  // Second, so that it sits in the file's first bytes (Note [Proving a file is ours] in
  // storage/output_id.cpp).
  j["output_id"] = or_null(s.output_id);
  j["format_version"] = kSummaryFormatVersion;
  j["tool_version"] = PRECOMPUTE_VERSION;
  j["end"] = summary_end_name(s.exit_code);
  j["exit_code"] = s.exit_code;
  j["message"] = s.message;
  j["output"] = s.output.string();
  j["rank"] = s.world_size > 1 ? Json{{"rank", s.rank}, {"world_size", s.world_size}} : Json();
  j["config_fingerprint"] = or_null(s.config_fingerprint);
  j["input_samples"] = s.total_samples;
  j["run"] = run_json(s);
  j["output_totals"] = output_totals_json(s);
  j["seconds"] = {{"load", s.load_seconds},
                  {"load_waited", s.load_waited_seconds},
                  {"calibrate", s.calibrate_seconds},
                  {"run", s.seconds},
                  {"graph", s.graph_seconds},
                  {"early_decoding", s.early_decoding_seconds}};
  const auto processed = static_cast<double>(s.processed_samples);
  Json start_up = Json::array();
  for (const auto& mark : s.start_up) {
    start_up.push_back({{"at_s", mark.at_seconds}, {"step", mark.step}});
  }
  j["start_up"] = std::move(start_up);
  j["throughput"] = {
      {"samples_per_s", s.seconds > 0 ? processed / s.seconds : 0.0},
      {"samples_per_s_with_load", s.seconds + s.load_waited_seconds > 0
                                      ? processed / (s.seconds + s.load_waited_seconds)
                                      : 0.0}};
  Json busy = Json::object();
  Json fractions = Json::object();
  for (const auto& [stage, seconds] : s.busy_seconds) {
    busy[stage] = seconds;
    fractions[stage] = s.graph_seconds > 0 ? seconds / s.graph_seconds : 0.0;
  }
  j["busy_seconds"] = std::move(busy);
  j["busy_fraction"] = std::move(fractions);
  Json gpus = Json::array();
  for (const auto& peak : s.device_memory) {
    gpus.push_back({{"device", peak.device},
                    {"peak_reserved_bytes", peak.reserved_bytes},
                    {"peak_allocated_bytes", peak.allocated_bytes}});
  }
  j["memory"] = {{"peak_rss_bytes", s.peak_rss_bytes},
                 {"peak_decoded_bytes", s.peak_decoded_bytes},
                 {"gpu", std::move(gpus)},
                 {"gpu_budget", gpu_budget_json(s.gpu_budget)}};
  j["video_decoding"] = s.modalities[modality_index(Modality::kVideo)] ? video_json(s) : Json();
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

void write_summary_files(const RunSummary& summary, const std::filesystem::path& path,
                         bool keep_in_output) {
  const std::string text = summary_text(summary);
  if (keep_in_output) {
    PC_ASSERT(!summary.output_id.empty(), "a summary without an output id kept in ",
              summary.output);
    write_file_atomically(summary.output / kRunSummaryFileName, text);
  }
  if (!path.empty()) write_file_atomically(path, text);
}

bool kept_summary_ended_with(const std::filesystem::path& folder, int exit_code) {
  std::ifstream in(folder / kRunSummaryFileName);
  if (!in) return false;
  std::stringstream text;
  text << in.rdbuf();
  const Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kSummaryFormat) return false;
  const auto code = j.find("exit_code");
  return code != j.end() && code->is_number_integer() && code->get<int>() == exit_code;
}

}  // namespace precompute
