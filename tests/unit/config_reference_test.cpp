// configs/reference.yaml is where people read what every key does: it must list every key of
// the table (Note [Config keys]), each with the default the code has.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "pipeline/core/config.hpp"
#include "pipeline/core/config_fields.hpp"
#include "pipeline/core/config_yaml.hpp"

namespace precompute {
namespace {

const std::filesystem::path kReference =
    std::filesystem::path(PRECOMPUTE_SOURCE_DIR) / "configs/reference.yaml";

std::string file_text(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The node at a dotted key; undefined when absent.
YAML::Node at(const YAML::Node& root, const std::string& key) {
  std::vector<YAML::Node> path = {root};
  std::stringstream parts(key);
  for (std::string part; std::getline(parts, part, '.');) {
    const YAML::Node& parent = path.back();
    if (!parent.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    path.push_back(parent[part]);
    if (!path.back().IsDefined()) return path.back();
  }
  return path.back();
}

// A key shown in a comment, as an alternative to another ("# folder: data/", "or {num_frames:").
bool in_a_comment(const std::string& text, const std::string& key) {
  const std::string name = key.substr(key.rfind('.') + 1);
  const std::regex shown("#.*(^|[^A-Za-z0-9_])" + name + ":");
  std::stringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_search(line, shown)) return true;
  }
  return false;
}

TEST(ConfigReferenceTest, ListsEveryKeyWithTheDefaultTheCodeHas) {
  const std::string text = file_text(kReference);
  const YAML::Node root = YAML::Load(text);
  Config defaults;
  for (const auto& f : config_fields()) enable_section(defaults, f.section());
  for (const auto& f : config_fields()) {
    EXPECT_FALSE(f.doc.empty()) << f.key << " has no doc line";
    const YAML::Node node = at(root, f.key);
    if (!node.IsDefined()) {
      EXPECT_TRUE(in_a_comment(text, f.key))
          << f.key << " is not in configs/reference.yaml (nor in a comment there)";
      continue;
    }
    if (!f.has_default) continue;  // an example value
    Config read = defaults;
    if (!(f.null_unsets && node.IsNull())) f.read(f, YamlNode{node, f.key}, "/ref", read);
    nlohmann::json want;
    nlohmann::json shown;
    f.write(f, defaults, want);
    f.write(f, read, shown);
    EXPECT_EQ(shown, want) << f.key << ": configs/reference.yaml shows " << shown.dump()
                           << ", the code's default is " << want.dump();
  }
}

TEST(ConfigReferenceTest, ParsesAndPassesValidationOfItsRanges) {
  const auto c = load_config(kReference);
  EXPECT_TRUE(c.video.enabled && c.audio.enabled && c.text.enabled);
  for (const auto& f : config_fields()) {
    if (f.check) {
      EXPECT_NO_THROW(f.check(f, c)) << f.key;
    }
  }
}

}  // namespace
}  // namespace precompute
