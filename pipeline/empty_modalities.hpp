#pragma once
// A configured modality that had inputs and embedded none: the run fails for it, whatever its
// failure limit (Note [A modality that embeds nothing] in empty_modalities.cpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/partition.hpp"
#include "pipeline/core/sample.hpp"
#include "storage/output_index.hpp"

namespace precompute {

struct EmptyModality {
  Modality modality = Modality::kVideo;
  int64_t inputs = 0;           // samples of the output's part that give it an input
  int64_t failure_records = 0;  // its failure records in the output
  std::string top_category;     // its most common failure category; empty: no record read
  int64_t top_category_records = 0;
  std::string example_id;       // the first sample of that category, in input order
  std::string example_message;  // and its record's message
  std::string unreadable;       // why the records could not be read, if they could not
};

// The modalities of `config` that the samples of `span` give an input and that no shard of
// `index` (in `folder`) holds an embedding of, each with its failure records tallied from the
// shards (read only when there is such a modality).
std::vector<EmptyModality> find_empty_modalities(const Config& config,
                                                 const std::vector<SampleSpec>& samples,
                                                 const RankSpan& span,
                                                 const std::filesystem::path& folder,
                                                 const OutputIndex& index);

// One line for the end of the run's log: the modality, how many inputs it had, its most common
// failure category with an example of it, and the fix.
std::string describe_empty_modality(const EmptyModality& empty);

}  // namespace precompute
