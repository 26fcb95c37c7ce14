#pragma once
// The table of config keys (Note [Config keys] in config.hpp): one ConfigField per key, in the
// order the keys are read. YAML reading, key checking, flags, validate(), both JSON forms and
// the reference test iterate it; none of them names a key on its own.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_bounds.hpp"

namespace precompute {

struct YamlNode;

// Which JSON forms hold a key.
enum class Recorded {
  kNowhere,      // neither: how this process runs (logging, supervision), not what it made
  kRecord,       // full_config_json only: kept with the output, but free to change on resume
  kFingerprint,  // both: it changes what is stored (semantic_config_json)
};

struct ConfigField {
  std::string key;              // dotted, as a config file spells it: "video.sampling.fps"
  std::string_view doc;         // what it means, in a line
  std::string_view type;        // what a config file writes, in words ("integer", "path", ...)
  std::string json_key;         // its name inside its section's JSON object
  Recorded recorded = Recorded::kNowhere;
  // false: no default a file could write (a path, a choice left to the model folder): the
  // reference config shows an example instead.
  bool has_default = true;
  std::optional<Bound> bound;
  bool unset_when_zero = false;  // 0 is how the struct says "not set": no range check then
  bool null_unsets = false;      // `key: null` leaves the default
  bool byte_size = false;        // an integer written as a size ("4GiB"), or 0
  bool omitted_when_empty = false;  // a list left out of the JSON forms while it is empty
  std::string_view required;     // when set, its mapping needs it: "needs 'path': <required>"
  ConfigFlag flag;               // names empty: no flag sets it

  // Reads the present, non-null node of `key` into `config`.
  std::function<void(const ConfigField&, const YamlNode&, const std::filesystem::path& base,
                     Config&)>
      read;
  // Writes its entries into its section's JSON object.
  std::function<void(const ConfigField&, const Config&, nlohmann::json& section)> write;
  // Throws ConfigError when its value is out of range; runs for enabled sections only.
  std::function<void(const ConfigField&, const Config&)> check;
  // Applies its flag's value.
  std::function<void(Config&, const FlagValue&)> apply;
  // Checks the mapping that holds it, once, before any of the mapping is read.
  std::function<void(const YamlNode& mapping)> on_mapping;

  // "video" for "video.sampling.fps".
  std::string_view section() const { return std::string_view(key).substr(0, key.find('.')); }
};

// Every key, in reading order: input, output, run, video, audio, text.
const std::vector<ConfigField>& config_fields();
// The field of `key`; a list element such as "video.mean[1]" has its list's.
const ConfigField& config_field(std::string_view key);

// Whether the section `name` ("video") is present in the config.
bool section_enabled(const Config& config, std::string_view name);
// Marks an encoder section present (it has no keys of its own to say so).
void enable_section(Config& config, std::string_view name);

}  // namespace precompute
