// The two JSON forms of a config: every recorded key (full), and the fingerprint (semantic), the
// keys whose spec says they change what is stored. Sections absent from the config are absent
// here too; nlohmann::json orders an object's keys by name, so the table's order does not show.

#include <nlohmann/json.hpp>

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_fields.hpp"

namespace precompute {
namespace {

nlohmann::json config_json(const Config& c, bool semantic) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : config_fields()) {
    const bool recorded = semantic ? f.recorded == Recorded::kFingerprint
                                   : f.recorded != Recorded::kNowhere;
    if (!recorded || !section_enabled(c, f.section())) continue;
    f.write(f, c, j[std::string(f.section())]);
  }
  return j;
}

}  // namespace

// Paths are bytes and may hold invalid UTF-8, which JSON cannot: such bytes become U+FFFD here
// (the JSON is a record for people and a fingerprint; the run uses the paths themselves).
std::string semantic_config_json(const Config& c) {
  return config_json(c, true).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
std::string full_config_json(const Config& c) {
  return config_json(c, false).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace precompute
