// Reading a config file: the table (config_fields.hpp) says which keys each mapping knows, in
// what order they are read and how each is read; this file walks the YAML along it.

#include "pipeline/core/config_yaml.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_fields.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {

namespace {

template <class T>
T scalar(const YamlNode& n, const char* what) {
  PC_CHECK(n.node.IsScalar(), ConfigError, "config key '", n.path, "' must be ", what);
  try {
    return n.node.as<T>();
  } catch (const YAML::Exception&) {
    PC_THROW(ConfigError, "config key '", n.path, "' must be ", what, ", got '",
             n.node.Scalar(), "'");
  }
}

// The name of the key under `prefix` ("video." or "") that `key` ("video.sampling.fps") is held
// in: "sampling"; empty when `key` is not under `prefix`.
std::string_view child_name(std::string_view key, std::string_view prefix) {
  if (key.substr(0, prefix.size()) != prefix) return {};
  key.remove_prefix(prefix.size());
  return key.substr(0, key.find('.'));
}

// The keys a mapping at `prefix` knows, in table order.
std::vector<std::string> known_keys(std::string_view prefix) {
  std::vector<std::string> known;
  for (const auto& f : config_fields()) {
    const auto name = child_name(f.key, prefix);
    if (!name.empty() && std::find(known.begin(), known.end(), name) == known.end()) {
      known.emplace_back(name);
    }
  }
  return known;
}

// Reads the present mapping `n` (at `prefix`, "video.") and the mappings it holds, key by key in
// table order.
void read_mapping(const YamlNode& n, const std::string& prefix, const std::filesystem::path& base,
                  Config& c) {
  check_keys(n, known_keys(prefix));
  for (const auto& f : config_fields()) {
    const auto name = child_name(f.key, prefix);
    if (f.on_mapping && !name.empty() && prefix.size() + name.size() == f.key.size()) {
      f.on_mapping(n);
    }
  }
  std::vector<std::string_view> done;
  for (const auto& f : config_fields()) {
    const auto name = child_name(f.key, prefix);
    if (name.empty()) continue;
    if (prefix.size() + name.size() < f.key.size()) {  // a key of a mapping inside this one
      if (std::find(done.begin(), done.end(), name) != done.end()) continue;
      done.push_back(name);
      const std::string child(name);
      if (!n.has(child)) continue;
      read_mapping(n.child(child), prefix + child + ".", base, c);
      continue;
    }
    const std::string key(name);
    if (!n.has(key)) {
      PC_CHECK(f.required.empty(), ConfigError, "config key '", n.path, "' needs '", key,
               "': ", f.required);
      continue;
    }
    const YamlNode value = n.child(key);
    if (f.null_unsets && value.node.IsNull()) continue;
    f.read(f, value, base, c);
  }
}

std::filesystem::path absolute_from_cwd(const std::filesystem::path& p) {
  return std::filesystem::absolute(p).lexically_normal();
}

}  // namespace

std::string shown(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte >= 0x7F) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
    } else {
      out += ch;
    }
  }
  return out;
}

bool read_bool(const YamlNode& n) { return scalar<bool>(n, "true or false"); }
std::string read_string(const YamlNode& n) { return scalar<std::string>(n, "a string"); }

std::filesystem::path read_path(const YamlNode& n, const std::filesystem::path& base) {
  std::filesystem::path p = read_string(n);
  PC_CHECK(!p.empty(), ConfigError, "config key '", n.path, "' is empty; give a path");
  return p.is_absolute() ? p : (base / p).lexically_normal();
}

std::vector<std::string> read_devices(const YamlNode& n) {
  std::vector<std::string> out;
  if (n.node.IsSequence()) {
    for (size_t i = 0; i < n.node.size(); ++i) out.push_back(read_string(n.element(i)));
  } else {
    out.push_back(read_string(n));
  }
  PC_CHECK(!out.empty(), ConfigError, "config key '", n.path, "' lists no device");
  return out;
}

void check_keys(const YamlNode& n, const std::vector<std::string>& known) {
  if (!n.node.IsDefined() || n.node.IsNull()) return;
  PC_CHECK(n.node.IsMap(), ConfigError, "config key '", n.path, "' must be a mapping");
  for (const auto& kv : n.node) {
    const auto key = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      PC_THROW(ConfigError, "unknown config key '", n.path.empty() ? key : n.path + "." + key,
               "'; known keys here: ", list);
    }
  }
}

Config parse_config(const std::string& yaml_text, const std::filesystem::path& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    PC_THROW(ConfigError, "config is not valid YAML: ", e.what());
  }
  PC_CHECK(root.IsMap(), ConfigError, "config must be a YAML mapping with sections such as "
                                      "input, output, video, audio, text");
  const YamlNode top{root, ""};
  const auto sections = known_keys("");
  check_keys(top, sections);
  const auto base = absolute_from_cwd(base_dir);
  Config c;
  for (const auto& section : sections) {
    if (!top.has(section)) continue;
    enable_section(c, section);
    read_mapping(top.child(section), section + ".", base, c);
  }
  // A .pt2 file is an AOTInductor package whatever the section: no type to restate, unless the
  // section names one (then that one is loaded, and refuses a file it cannot read).
  const auto pt2_unless_typed = [&](EncoderSection& s, const char* section) {
    const YAML::Node encoder = root[section] ? root[section]["encoder"] : YAML::Node();
    const bool typed = encoder && encoder.IsMap() && encoder["type"];
    if (s.enabled && !typed && s.encoder.path.extension() == ".pt2") {
      s.encoder.type = EncoderType::kPt2;
    }
  };
  pt2_unless_typed(c.video, "video");
  pt2_unless_typed(c.audio, "audio");
  for (auto [s, section] : {std::pair<EncoderSection*, const char*>{&c.video, "video"},
                            {&c.audio, "audio"}, {&c.text, "text"}}) {
    if (!root[section] || !root[section].IsMap()) continue;
    for (const auto& kv : root[section]) s->keys_in_file.push_back(kv.first.as<std::string>());
  }
  return c;
}

Config load_config(const std::filesystem::path& file) {
  std::ifstream in(file);
  PC_CHECK(in.good(), ConfigError, "cannot read config file ", file,
           ": check the path (see configs/reference.yaml for an example)");
  std::stringstream text;
  text << in.rdbuf();
  Config c = parse_config(text.str(), file.parent_path().empty() ? "." : file.parent_path());
  c.file = absolute_from_cwd(file);
  return c;
}

}  // namespace precompute
