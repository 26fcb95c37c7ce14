#include "pipeline/empty_modalities.hpp"

#include <fmt/format.h>

#include <array>
#include <limits>
#include <map>

#include "pipeline/core/error.hpp"
#include "pipeline/core/failure.hpp"
#include "pipeline/input/printable_text.hpp"
#include "storage/shard_reader.hpp"

namespace precompute {

// Note [A modality that embeds nothing]
// A configured modality that had inputs and embedded none (an encoder that fails on every
// sample, clips that all lack the stream asked for) leaves an output that looks whole and lacks
// what the config asked for. Each sample's failure is recorded, and under a failure limit that
// tolerates them the run would exit 0; so such a run exits 3 whatever run.max_failures says, and
// its last log lines name the modality, its most common failure category and an example of it,
// which is usually the cause (the same message for every sample). It is judged as the failure
// limit is, on the whole output: embeddings in shards committed by earlier runs count (the index
// entries' modality_counts), so a resume that adds only failures to a modality that has
// embeddings passes, and a rerun with nothing left to do says what the run before it said. A
// rank judges its own part (its span of the input, its folder's shards): a rank whose part gives
// a modality no input is not failed for it. The records are read back from the shards only when
// a modality is empty, which is when the message needs them.

namespace {

// An example message on one line, at most this many bytes of it.
constexpr size_t kExampleBytes = 400;

struct Tally {
  int64_t records = 0;
  int64_t first_seq = std::numeric_limits<int64_t>::max();
  std::string id;
  std::string message;
};

void tally_records(const std::filesystem::path& folder, const OutputIndex& index,
                   std::vector<EmptyModality>& empty) {
  std::array<std::map<FailureCategory, Tally>, kNumModalities> by_category;
  for (const auto& entry : index.shards) {
    if (entry.num_failures == 0) continue;
    for (const auto& record : read_shard_failures(folder / entry.file)) {
      Tally& t = by_category[modality_index(record.modality)][record.category];
      ++t.records;
      if (record.seq < t.first_seq) {
        t.first_seq = record.seq;
        t.id = record.id;
        t.message = record.message;
      }
    }
  }
  for (auto& e : empty) {
    const Tally* top = nullptr;
    for (const auto& [category, t] : by_category[modality_index(e.modality)]) {
      e.failure_records += t.records;
      if (top == nullptr || t.records > top->records ||
          (t.records == top->records && t.first_seq < top->first_seq)) {
        top = &t;
        e.top_category = std::string(failure_category_name(category));
      }
    }
    if (top == nullptr) continue;
    e.top_category_records = top->records;
    e.example_id = top->id;
    e.example_message = top->message;
  }
}

// `message` on one line, cut to kExampleBytes, its control characters and bytes that are not
// UTF-8 shown as \xHH.
std::string one_line(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  const bool cut = message.size() > kExampleBytes;
  if (cut) message.resize(kExampleBytes);
  return printable(message) + (cut ? " ..." : "");
}

}  // namespace

std::vector<EmptyModality> find_empty_modalities(const Config& config,
                                                 const std::vector<SampleSpec>& samples,
                                                 const RankSpan& span,
                                                 const std::filesystem::path& folder,
                                                 const OutputIndex& index) {
  std::array<int64_t, kNumModalities> embedded{};
  for (const auto& entry : index.shards) {
    for (int m = 0; m < kNumModalities; ++m) embedded[m] += entry.modality_counts[m];
  }
  std::vector<EmptyModality> empty;
  for (Modality m : kAllModalities) {
    if (!config.enabled(m) || embedded[modality_index(m)] > 0) continue;
    EmptyModality e;
    e.modality = m;
    for (int64_t seq = span.first_seq; seq < span.end_seq; ++seq) {
      e.inputs += gives_input(samples[static_cast<size_t>(seq)], m) ? 1 : 0;
    }
    if (e.inputs > 0) empty.push_back(std::move(e));
  }
  if (empty.empty()) return empty;
  try {
    tally_records(folder, index, empty);
  } catch (const StorageError& error) {
    // The verdict stands on the index's counts; only its explanation is missing.
    for (auto& e : empty) e.unreadable = error.what();
  }
  return empty;
}

std::string describe_empty_modality(const EmptyModality& e) {
  const std::string name(modality_name(e.modality));
  std::string why;
  if (!e.unreadable.empty()) {
    why = "its failure records could not be read (" + e.unreadable + ")";
  } else if (e.top_category.empty()) {
    why = "no failure record says why";
  } else {
    why = fmt::format("most common failure: {} ({} of {} record(s)), e.g. sample '{}': {}",
                      e.top_category, e.top_category_records, e.failure_records,
                      printable(e.example_id), one_line(e.example_message));
  }
  return fmt::format("{}: none of the {} sample(s) that give it an input was embedded; {}; fix "
                     "the cause and rerun with --retry-failed (after fixing files or raising a "
                     "limit) or with --overwrite (after changing the model or its settings, or "
                     "removing the {} section)",
                     name, e.inputs, why, name);
}

}  // namespace precompute
