// `precompute doctor --config FILE [--json]`: a trainer's memory questions (does the encoder fit
// beside training, at what batch; what does precomputing save), answered by measurement: for each encoder, where its weights and inputs live (device, dtype) and any
// mismatch; device memory before and after a forward pass at batch 1, 2, 4, ... up to the
// budget; the peak per sample; the largest batch that fits; the bytes per sample on disk; and
// what a trainer saves by loading shards instead of running the encoders.

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "encoders/bert/text_settings.hpp"
#include "encoders/package_settings.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/logging.hpp"
#include "pipeline/memory_budget.hpp"
#include "pipeline/runner.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

struct DoctorOptions {
  std::string config;
  std::string device;
  std::string gpu_memory_budget;
  int max_batch = 0;
  bool json = false;
};

using Json = nlohmann::ordered_json;

int64_t storage_bytes(StorageDtype dtype) { return dtype == StorageDtype::kFloat16 ? 2 : 4; }

int64_t dtype_bytes(const std::string& name) {
  if (name == "Half" || name == "BFloat16") return 2;
  if (name == "Double" || name == "Long") return 8;
  return 4;
}

// What a trainer would feed this encoder per sample, in the dtype the encoder computes in:
// frames as [T, 3, H, W], audio as samples, text as int64 ids plus an int64 attention mask.
int64_t raw_input_bytes(Modality m, const PreparedSample& s, const std::string& input_dtype) {
  switch (m) {
    case Modality::kVideo:
      return s.video->num_frames * 3 * s.video->height * s.video->width * dtype_bytes(input_dtype);
    case Modality::kAudio:
      return static_cast<int64_t>(s.audio->samples.size()) * dtype_bytes(input_dtype);
    case Modality::kText:
      return static_cast<int64_t>(s.text->ids.size()) * 8 * 2;
  }
  return 0;
}

Json memory_json(const std::optional<DeviceMemoryUse>& use) {
  if (!use) return nullptr;
  return {{"allocated", use->allocated_bytes}, {"reserved", use->reserved_bytes}};
}

Json examine(Encoder& encoder, const Config& config, int max_batch, int64_t budget_bytes) {
  const auto& info = encoder.info();
  const Modality m = info.modality;
  const auto params = encoder.parameters();
  const std::string input_dtype = encoder.input_dtype();
  Json j;
  j["modality"] = modality_name(m);
  j["encoder"] = info.model_file;
  j["device"] = info.device;
  j["parameters"] = {{"tensors", params.tensors}, {"elements", params.elements},
                     {"bytes", params.bytes},     {"devices", params.devices},
                     {"dtypes", params.dtypes}};
  j["inputs"] = {{"device", info.device}, {"dtype", input_dtype}};
  Json mismatches = Json::array();
  for (const auto& d : params.devices) {
    if (d != info.device) {
      mismatches.push_back(fmt::format("weights on {} but inputs go to {}: every call copies "
                                       "between them", d, info.device));
    }
  }
  for (const auto& t : params.dtypes) {
    const bool floating = t == "Float" || t == "Half" || t == "BFloat16" || t == "Double";
    if (floating && t != input_dtype) {
      mismatches.push_back(fmt::format("weights in {} but inputs in {}", t, input_dtype));
    }
  }
  j["mismatches"] = mismatches;

  const auto sample = largest_sample(config, m);
  const int64_t units = sample_cost(m, *sample);
  const char* unit_name = m == Modality::kVideo ? "frames"
                          : m == Modality::kAudio ? "audio samples"
                                                  : "tokens";
  j["sample"] = {{"units", units}, {"unit", unit_name}};

  Json probes = Json::array();
  BatchProbe first, last;
  const bool gpu = info.device.rfind("cuda", 0) == 0;
  for (int b = 1; b <= max_batch; b *= 2) {
    const auto p = probe_batch(encoder, sample, b);
    Json row = {{"batch", b}, {"units", p.units}, {"out_of_memory", p.out_of_memory}};
    if (!p.out_of_memory) {
      row["seconds"] = p.seconds;
      row["before"] = memory_json(p.before);
      row["after"] = memory_json(p.after);
      row["peak_reserved"] = p.after ? Json(p.after->peak_reserved_bytes) : Json(nullptr);
      row["peak_allocated"] = p.after ? Json(p.after->peak_allocated_bytes) : Json(nullptr);
      row["peak_extra_reserved"] = p.after ? Json(p.peak_extra_reserved) : Json(nullptr);
    }
    probes.push_back(row);
    if (p.out_of_memory) break;
    if (b == 1) first = p;
    last = p;
    if (gpu && budget_bytes > 0 && p.after && p.after->peak_reserved_bytes > budget_bytes) break;
  }
  j["batches"] = probes;

  // Peak per sample from the first and last batches that fit (device memory only).
  if (gpu && last.batch > first.batch && first.after && last.after) {
    const double per_sample = static_cast<double>(last.peak_extra_reserved -
                                                  first.peak_extra_reserved) /
                              (last.batch - first.batch);
    const double fixed =
        std::max(0.0, static_cast<double>(first.peak_extra_reserved) - per_sample);
    j["peak_per_sample"] = static_cast<int64_t>(per_sample);
    if (budget_bytes > 0 && per_sample > 0) {
      const double room = static_cast<double>(budget_bytes - first.before->reserved_bytes) -
                          fixed;
      j["largest_batch_in_budget"] = static_cast<int64_t>(std::max(0.0, room / per_sample));
    } else {
      j["largest_batch_in_budget"] = nullptr;
    }
  } else {
    j["peak_per_sample"] = nullptr;
    j["largest_batch_in_budget"] = nullptr;
  }

  const int64_t rows = std::max<int64_t>(1, first.rows_per_sample);
  int64_t disk = rows * first.dim * storage_bytes(config.output.dtype);
  if (info.per_step) disk += rows * 8 + 8;  // timestamps and the CSR offset
  j["output"] = {{"rows_per_sample", rows}, {"dim", first.dim}};
  j["disk_bytes_per_sample"] = disk;
  j["raw_input_bytes_per_sample"] = raw_input_bytes(m, *sample, input_dtype);
  return j;
}

int doctor(const DoctorOptions& o) {
  Config config = load_config(o.config);
  ConfigOverrides overrides;
  if (!o.device.empty()) overrides.set("--device", o.device);
  if (!o.gpu_memory_budget.empty()) overrides.set("--gpu-memory-budget", o.gpu_memory_budget);
  apply_overrides(config, overrides);
  if (config.text.enabled) resolve_text_settings(config.text);
  resolve_package_settings(config);
  validate(config);
  setup_logging(o.json ? "warn" : config.run.log_level);

  const auto pools = load_encoders(config);
  Json report;
  report["config"] = config.file.string();
  Json encoders = Json::array();
  int64_t weights = 0, disk = 0, raw = 0;
  for (const auto& pool : pools) {
    if (!pool) continue;
    for (const auto& e : pool->encoders()) {
      const Modality m = e->info().modality;
      int64_t budget = 0;
      if (const auto use = device_memory_use(e->info().device)) {
        budget = config.run.gpu_memory_budget.set()
                     ? config.run.gpu_memory_budget.bytes_of(use->total_bytes)
                     : use->total_bytes;
      }
      const int max_batch =
          o.max_batch > 0 ? o.max_batch
                          : (budget > 0 ? 4096 : std::min(64, config.section(m).batch_size));
      auto j = examine(*e, config, max_batch, budget);
      j["budget_bytes"] = budget > 0 ? Json(budget) : Json(nullptr);
      weights += j["parameters"]["bytes"].get<int64_t>();
      disk += j["disk_bytes_per_sample"].get<int64_t>();
      raw += j["raw_input_bytes_per_sample"].get<int64_t>();
      encoders.push_back(std::move(j));
    }
  }
  report["encoders"] = encoders;
  report["training"] = {
      {"bytes_per_sample_from_shards", disk},
      {"raw_input_bytes_per_sample", raw},
      {"encoder_weights_bytes_not_needed", weights},
      {"advice", "train on the shards: the trainer loads the embeddings instead of the inputs, "
                 "and needs none of the encoders' weights or activations"}};

  if (o.json) {
    // Paths may hold bytes that are not UTF-8; JSON shows them as U+FFFD.
    std::cout << report.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  for (const auto& j : encoders) {
    std::cout << fmt::format("{} encoder {} on {}\n", j["modality"].get<std::string>(),
                             j["encoder"].get<std::string>(), j["device"].get<std::string>());
    const auto& p = j["parameters"];
    std::cout << fmt::format("  weights: {} tensors, {} on {}, dtype {}\n",
                             p["tensors"].get<int64_t>(), format_bytes(p["bytes"].get<int64_t>()),
                             p["devices"].dump(), p["dtypes"].dump());
    std::cout << fmt::format("  inputs: {} on {}\n", j["inputs"]["dtype"].get<std::string>(),
                             j["inputs"]["device"].get<std::string>());
    for (const auto& mismatch : j["mismatches"]) {
      std::cout << "  MISMATCH: " << mismatch.get<std::string>() << "\n";
    }
    std::cout << fmt::format("  largest sample: {} {}\n", j["sample"]["units"].get<int64_t>(),
                             j["sample"]["unit"].get<std::string>());
    for (const auto& b : j["batches"]) {
      if (b["out_of_memory"].get<bool>()) {
        std::cout << fmt::format("  batch {:>5}: out of memory\n", b["batch"].get<int>());
        continue;
      }
      std::string memory = "device memory n/a (CPU)";
      if (!b["before"].is_null()) {
        memory = fmt::format(
            "allocated {} -> {}, reserved {} -> {}, peak reserved {}",
            format_bytes(b["before"]["allocated"].get<int64_t>()),
            format_bytes(b["after"]["allocated"].get<int64_t>()),
            format_bytes(b["before"]["reserved"].get<int64_t>()),
            format_bytes(b["after"]["reserved"].get<int64_t>()),
            format_bytes(b["peak_reserved"].get<int64_t>()));
      }
      std::cout << fmt::format("  batch {:>5}: {:.3f} s, {}\n", b["batch"].get<int>(),
                               b["seconds"].get<double>(), memory);
    }
    if (!j["peak_per_sample"].is_null()) {
      std::cout << fmt::format("  peak per sample: {}\n",
                               format_bytes(j["peak_per_sample"].get<int64_t>()));
    }
    if (!j["largest_batch_in_budget"].is_null()) {
      std::cout << fmt::format("  largest batch in the budget of {}: {}\n",
                               format_bytes(j["budget_bytes"].get<int64_t>()),
                               j["largest_batch_in_budget"].get<int64_t>());
    }
    std::cout << fmt::format("  on disk: {} per sample ({} row(s) of dim {})\n",
                             format_bytes(j["disk_bytes_per_sample"].get<int64_t>()),
                             j["output"]["rows_per_sample"].get<int64_t>(),
                             j["output"]["dim"].get<int64_t>());
  }
  const auto& t = report["training"];
  std::cout << fmt::format(
      "training on the shards: {} per sample to load instead of {} of raw inputs, and none of "
      "the encoders' {} of weights (nor their activations) on the trainer's GPU\n",
      format_bytes(t["bytes_per_sample_from_shards"].get<int64_t>()),
      format_bytes(t["raw_input_bytes_per_sample"].get<int64_t>()),
      format_bytes(t["encoder_weights_bytes_not_needed"].get<int64_t>()));
  return kExitOk;
}

}  // namespace

CommandFn add_doctor_command(CLI::App& app) {
  auto o = std::make_shared<DoctorOptions>();
  auto* cmd = app.add_subcommand(
      "doctor", "Measure each encoder's memory per batch size and what training on shards saves");
  cmd->add_option("-c,--config", o->config, "YAML config of the run")->required();
  cmd->add_option("--device", o->device, "Device of every encoder: cpu, cuda, cuda:N");
  cmd->add_option("--gpu-memory-budget", o->gpu_memory_budget,
                  "Budget per GPU: a size (8GiB) or a fraction of the card (0.8)");
  cmd->add_option("--max-batch", o->max_batch, "Largest batch to try (default: up to the "
                  "budget on a GPU, the config's batch size on the CPU)")
      // Batches double from 1: past 2^30 the doubling would overflow an int. 65536 is the
      // largest batch_size a config may set.
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--json", o->json, "Print JSON");
  return [o]() { return doctor(*o); };
}

}  // namespace precompute
