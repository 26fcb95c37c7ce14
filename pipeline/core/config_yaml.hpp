#pragma once
// Reading config values from YAML. Every reader fails with a ConfigError that names the dotted
// key, so that a message says which line of the file to fix.

#include <yaml-cpp/yaml.h>

#include <array>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeline/core/config_bounds.hpp"

namespace precompute {

// A YAML node with the dotted key path that led to it.
struct YamlNode {
  YAML::Node node;
  std::string path;

  YamlNode child(const std::string& key) const {
    return {node[key], path.empty() ? key : path + "." + key};
  }
  YamlNode element(size_t i) const { return {node[i], path + "[" + std::to_string(i) + "]"}; }
  bool has(const std::string& key) const { return node.IsMap() && node[key].IsDefined(); }
};

// A user's string as a message shows it: control characters and bytes past ASCII as \xHH, so
// that a NUL does not cut the message short and a terminal shows what is wrong.
std::string shown(std::string_view text);

bool read_bool(const YamlNode& n);
std::string read_string(const YamlNode& n);
// Resolved against `base` when relative; an empty path is refused.
std::filesystem::path read_path(const YamlNode& n, const std::filesystem::path& base);
// One device or a list of them.
std::vector<std::string> read_devices(const YamlNode& n);

// A number read as T. yaml-cpp refuses one that does not fit T, or an integer written with a
// fraction or an exponent, without saying which: the range `b` says both.
template <class T>
T read_number(const YamlNode& n, const Bound& b, std::string_view flag) {
  T value{};
  if (n.node.IsScalar() && YAML::convert<T>::decode(n.node, value)) return value;
  PC_THROW(ConfigError, "config key '", n.path, "' must be ", range_text(b), ", got ",
           n.node.IsScalar() ? "'" + n.node.Scalar() + "'" : std::string("a list or mapping"),
           origin_text(flag));
}

// One of `names`; the message lists them.
template <class Enum, size_t N>
Enum read_choice(const YamlNode& n, const std::array<std::pair<const char*, Enum>, N>& names) {
  const auto text = read_string(n);
  std::string list;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    list += (list.empty() ? "" : ", ") + std::string(name);
  }
  PC_THROW(ConfigError, "config key '", n.path, "' is '", shown(text), "'; use one of: ", list);
}

// Fails on keys the mapping does not know: a typo must not silently fall back to a default.
void check_keys(const YamlNode& n, const std::vector<std::string>& known);

}  // namespace precompute
