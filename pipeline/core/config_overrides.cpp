// Flags of `precompute run` over the file's values: each flag sets the keys whose spec names it
// (config_fields.hpp), in table order.

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_fields.hpp"

namespace precompute {

void apply_overrides(Config& c, const ConfigOverrides& o) {
  for (const auto& f : config_fields()) {
    if (f.flag.names.empty()) continue;
    const auto given = o.values.find(f.flag.name());
    if (given != o.values.end()) f.apply(c, given->second);
  }
}

}  // namespace precompute
