// configs/reference.yaml is where people read what every key does: it must list every key of
// the table (Note [Config keys]), each with the default the code has; a key it leaves commented
// out (a setting a model folder decides, an alternative) must show, in its own section, a value
// the key takes.

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

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

// The lines of `section` ("text"): from its "text:" line to the next top-level key.
std::vector<std::string> section_lines(const std::string& text, std::string_view section) {
  std::vector<std::string> lines;
  bool inside = false;
  std::stringstream all(text);
  for (std::string line; std::getline(all, line);) {
    if (!line.empty() && std::isalpha(static_cast<unsigned char>(line[0]))) {
      inside = line.rfind(std::string(section) + ":", 0) == 0;
    }
    if (inside) lines.push_back(line);
  }
  return lines;
}

// The value a comment among `lines` shows for the key named `name`: "# name: value" on a line of
// its own (what uncommenting the line sets: a setting left to a model folder, an alternative such
// as input.folder), or "{name: value}" inside a comment (an alternative shown beside another
// key: "or {num_frames: 8}").
std::optional<std::string> commented_value(const std::vector<std::string>& lines,
                                           const std::string& name) {
  const std::regex own_line("^\\s*#\\s*" + name + ":\\s*([^#]*[^#\\s])\\s*(#.*)?$");
  const std::regex inline_form("#.*[{ ,]" + name + ":\\s*([^,}#]*[^,}#\\s])\\s*[,}]");
  std::smatch m;
  for (const auto& line : lines) {
    if (std::regex_search(line, m, own_line)) return m[1].str();
  }
  for (const auto& line : lines) {
    if (std::regex_search(line, m, inline_form)) return m[1].str();
  }
  return std::nullopt;
}

// Reads `value` as `f`'s key into `config`; the reader's or the range check's message when it
// is not a value the key takes.
std::string read_as(const ConfigField& f, const YAML::Node& value, Config& config) {
  try {
    if (!(f.null_unsets && value.IsNull())) f.read(f, YamlNode{value, f.key}, "/ref", config);
    f.check(f, config);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigReferenceTest, ListsEveryKeyWithTheDefaultTheCodeHas) {
  const std::string text = file_text(kReference);
  const YAML::Node root = YAML::Load(text);
  Config defaults;
  for (const auto& f : config_fields()) enable_section(defaults, f.section());
  for (const auto& f : config_fields()) {
    EXPECT_FALSE(f.doc.empty()) << f.key << " has no doc line";
    const YAML::Node in_file = at(root, f.key);
    YAML::Node node;  // yaml-cpp assigns through a node it handed out: never assign to in_file
    if (in_file.IsDefined()) {
      node.reset(in_file);
    } else {
      // Left commented out: the comment must show the key in its own section with a value the
      // key takes, its default where it has one.
      const auto shown =
          commented_value(section_lines(text, f.section()), f.key.substr(f.key.rfind('.') + 1));
      if (!shown) {
        ADD_FAILURE() << f.key << " is not in configs/reference.yaml, nor shown in a comment of "
                      << "its section as '# name: value'";
        continue;
      }
      node.reset(YAML::Load(*shown));
    }
    Config read = defaults;
    const std::string problem = read_as(f, node, read);
    EXPECT_EQ(problem, "") << f.key << ": configs/reference.yaml shows a value it does not take";
    if (!f.has_default || !problem.empty()) continue;  // an example value
    nlohmann::json want;
    nlohmann::json shown;
    f.write(f, defaults, want);
    f.write(f, read, shown);
    EXPECT_EQ(shown, want) << f.key << ": configs/reference.yaml shows " << shown.dump()
                           << ", the code's default is " << want.dump();
  }
}

// The comment of `name`'s line in `lines` and of the comment lines that continue it.
std::string key_comment(const std::vector<std::string>& lines, const std::string& name) {
  const std::regex key_line("^\\s*#?\\s*" + name + ":[^#]*(#.*)$");
  const std::regex continued("^\\s*#(.*)$");
  std::smatch m;
  std::string comment;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!std::regex_search(lines[i], m, key_line)) continue;
    comment = m[1].str();
    for (size_t k = i + 1; k < lines.size() && std::regex_search(lines[k], m, continued); ++k) {
      // A commented-out key of its own starts the next comment.
      if (std::regex_search(lines[k], std::regex("^\\s*#\\s*[a-z_]+:\\s"))) break;
      comment += " " + m[1].str();
    }
    break;
  }
  return std::regex_replace(comment, std::regex("\\s+"), " ");
}

// A special value a key's range gives 0 ("0: two per NVDEC engine", zero_means), up to the
// first ';', ':' or ','; empty when 0 means nothing special.
std::string zero_meaning(const ConfigField& f) {
  if (!f.bound) return "";
  std::string text = f.bound->zero.empty() ? std::string(f.bound->note)
                                           : "0: " + std::string(f.bound->zero);
  const size_t at = text.find("0: ");
  if (at == std::string::npos || (at > 0 && text[at - 1] != ' ' && text[at - 1] != ';')) {
    return "";
  }
  text = text.substr(at + 3);
  return text.substr(0, text.find_first_of(";:,"));
}

// Where 0 stands for something (one per core, no limit, two sessions per NVDEC engine), the
// reference's comment says the same words the code's range does, which also make the message
// of an out-of-range value.
TEST(ConfigReferenceTest, SaysWhatZeroMeansAsTheCodeDoes) {
  const std::string text = file_text(kReference);
  int checked = 0;
  for (const auto& f : config_fields()) {
    const std::string meaning = zero_meaning(f);
    if (meaning.empty()) continue;
    ++checked;
    const std::string comment =
        key_comment(section_lines(text, f.section()), f.key.substr(f.key.rfind('.') + 1));
    EXPECT_NE(comment.find("0: " + meaning), std::string::npos)
        << f.key << ": the code says 0 means '" << meaning << "'; configs/reference.yaml says '"
        << comment << "'";
  }
  EXPECT_GE(checked, 10);
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

// docs/config.md is the key table as a user reads it: a table per section with each key's type,
// default, range and doc line. It is generated from config_fields() by the test below, so that it
// cannot drift from the code; PRECOMPUTE_UPDATE_DOCS=1 rewrites it (docs/CONTRIBUTING.md).
const std::filesystem::path kConfigDoc =
    std::filesystem::path(PRECOMPUTE_SOURCE_DIR) / "docs/config.md";

constexpr std::string_view kConfigDocHead =
    "# Config keys\n"
    "\n"
    "<!-- Generated from the key table in pipeline/core/config.hpp by the test\n"
    "     ConfigReferenceTest.DocsConfigMdIsTheTable: edit the table, then regenerate\n"
    "     (docs/CONTRIBUTING.md, \"Generated documents\"). -->\n"
    "\n"
    "Every key a config file takes, with its type, default and range. `configs/reference.yaml`\n"
    "lists the same keys as a config file to copy (with each default, checked by\n"
    "`tests/unit/config_reference_test.cpp`), and `configs/demo.yaml` is a working example.\n"
    "Many keys are also set by a flag of `precompute run` ([cli.md](cli.md)); a flag overrides\n"
    "the file.\n"
    "\n"
    "Relative paths resolve against the config file's folder. Unknown keys are errors (a typo\n"
    "never silently falls back to a default). A modality is embedded when its section (`video`,\n"
    "`audio`, `text`) is present. Every number has a range; a value outside it, `.inf` and\n"
    "`.nan` included, exits 2 with a message naming the key, the range and the flag that also\n"
    "sets it (`tests/unit/config_test.cpp`, `tests/python/test_config_boundaries.py`). Sizes\n"
    "take a unit (`4GiB`). A default of \"none\" means the key has no default a file could write\n"
    "(a path, or a setting a model folder decides: see [encoders.md](encoders.md)).\n";

// The shortest text that reads back as the same float (or, if it is not one, double).
std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  const bool is_float = static_cast<double>(static_cast<float>(v)) == v;
  char buf[64];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    const double back = std::strtod(buf, nullptr);
    if (is_float ? static_cast<float>(back) == static_cast<float>(v) : back == v) break;
  }
  return buf;
}

std::string json_text(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>().empty() ? "\"\"" : j.get<std::string>();
  if (j.is_number_float()) return number_text(j.get<double>());
  if (j.is_array()) {
    std::string text = "[";
    for (size_t i = 0; i < j.size(); ++i) text += (i ? ", " : "") + json_text(j[i]);
    return text + "]";
  }
  return j.dump();
}

std::string size_text(int64_t bytes) {
  static constexpr std::string_view kUnits[] = {"", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (bytes != 0 && bytes % 1024 == 0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + std::string(kUnits[unit]);
}

std::string cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

std::string render_config_doc() {
  Config defaults;
  for (const auto& f : config_fields()) enable_section(defaults, f.section());
  std::string out(kConfigDocHead);
  std::string section;
  for (const auto& f : config_fields()) {
    if (f.section() != section) {
      section = std::string(f.section());
      out += "\n## " + section + "\n\n| key | type | default | range | meaning |\n";
      out += "|---|---|---|---|---|\n";
    }
    nlohmann::json written = nlohmann::json::object();
    f.write(f, defaults, written);
    // A key written with a companion entry (run.max_failures and its fraction) or not at all
    // has its default in its doc line.
    const bool one_value = written.size() == 1 && written.contains(f.json_key);
    const nlohmann::json value = one_value ? written[f.json_key] : nlohmann::json();
    const std::string type(f.type);
    std::string shown = "none";
    // A budget records "none" as 0 (kept so for outputs' recorded configs); a file says null.
    const bool unset_budget = f.type == "size or fraction" && value == 0;
    if (f.has_default && one_value && !value.is_null() && !unset_budget) {
      shown = f.byte_size && value.is_number_integer() ? size_text(value.get<int64_t>())
                                                       : json_text(value);
      shown = "`" + shown + "`";
    }
    const std::string range = f.bound ? range_text(*f.bound) : "";
    out += "| `" + f.key + "` | " + type + " | " + cell(shown) + " | " + cell(range) + " | " +
           cell(std::string(f.doc)) + " |\n";
  }
  return out;
}

TEST(ConfigReferenceTest, DocsConfigMdIsTheTable) {
  const std::string rendered = render_config_doc();
  const char* update = std::getenv("PRECOMPUTE_UPDATE_DOCS");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(kConfigDoc, std::ios::binary) << rendered;
  }
  EXPECT_EQ(file_text(kConfigDoc), rendered)
      << "docs/config.md differs from the key table: rerun this test with "
      << "PRECOMPUTE_UPDATE_DOCS=1 and commit docs/config.md";
}

}  // namespace
}  // namespace precompute
