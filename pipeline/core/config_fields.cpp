#include "pipeline/core/config_fields.hpp"

#include <algorithm>
#include <array>
#include <set>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "pipeline/core/config_yaml.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Path = std::filesystem::path;
using Json = nlohmann::json;

// The spellings a config file may use for each choice, and the name the JSON forms store.
template <class E>
struct Choices;

template <>
struct Choices<ComputeDtype> {
  static constexpr std::array<std::pair<const char*, ComputeDtype>, 6> kNames = {{
      {"float32", ComputeDtype::kFloat32},
      {"fp32", ComputeDtype::kFloat32},
      {"float16", ComputeDtype::kFloat16},
      {"fp16", ComputeDtype::kFloat16},
      {"bfloat16", ComputeDtype::kBFloat16},
      {"bf16", ComputeDtype::kBFloat16},
  }};
  static std::string_view name(ComputeDtype d) { return compute_dtype_name(d); }
};

template <>
struct Choices<StorageDtype> {
  static constexpr std::array<std::pair<const char*, StorageDtype>, 4> kNames = {{
      {"float16", StorageDtype::kFloat16},
      {"fp16", StorageDtype::kFloat16},
      {"float32", StorageDtype::kFloat32},
      {"fp32", StorageDtype::kFloat32},
  }};
  static std::string_view name(StorageDtype d) { return storage_dtype_name(d); }
};

template <>
struct Choices<Pooling> {
  static constexpr std::array<std::pair<const char*, Pooling>, 5> kNames = {{
      {"mean", Pooling::kMean},
      {"none", Pooling::kNone},
      {"cls", Pooling::kCls},
      {"max", Pooling::kMax},
      {"model", Pooling::kModel},
  }};
  static std::string_view name(Pooling p) { return pooling_name(p); }
};

template <>
struct Choices<ResizeMode> {
  static constexpr std::array<std::pair<const char*, ResizeMode>, 2> kNames = {{
      {"shorter_side_crop", ResizeMode::kShorterSideCrop},
      {"stretch", ResizeMode::kStretch},
  }};
  static std::string_view name(ResizeMode r) { return resize_mode_name(r); }
};

template <>
struct Choices<VideoLayout> {
  static constexpr std::array<std::pair<const char*, VideoLayout>, 2> kNames = {{
      {"frames", VideoLayout::kFrames},
      {"clips", VideoLayout::kClips},
  }};
  static std::string_view name(VideoLayout l) { return video_layout_name(l); }
};

template <>
struct Choices<VideoDecoderKind> {
  static constexpr std::array<std::pair<const char*, VideoDecoderKind>, 3> kNames = {{
      {"auto", VideoDecoderKind::kAuto},
      {"cpu", VideoDecoderKind::kCpu},
      {"nvdec", VideoDecoderKind::kNvdec},
  }};
  static std::string_view name(VideoDecoderKind k) { return video_decoder_name(k); }
};

template <>
struct Choices<EncoderType> {
  static std::string_view name(EncoderType t) { return encoder_type_name(t); }
};

template <class T, class = void>
struct IsChoice : std::false_type {};
template <class T>
struct IsChoice<T, std::void_t<decltype(Choices<T>::name(std::declval<T>()))>> : std::true_type {};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {
  using Value = T;
};

std::filesystem::path absolute_from_cwd(const std::filesystem::path& p) {
  return std::filesystem::absolute(p).lexically_normal();
}

// The encoder types a section takes. The message is the one validate() gave when the type was a
// string: a section names its own choices.
EncoderType read_encoder_type(const ConfigField& f, const YamlNode& n) {
  const auto text = read_string(n);
  const auto section = std::string(f.section());
  const bool text_section = section == "text";
  if (text == "torchscript") return EncoderType::kTorchScript;
  if (text == "bert" && text_section) return EncoderType::kBert;
  if (text == "pt2" && !text_section) return EncoderType::kPt2;
  PC_THROW(ConfigError, "config key '", f.key, "' is '", text, "'; for ", section,
           " use one of: ", text_section ? "torchscript, bert" : "torchscript, pt2");
}

void check_device(const std::string& device, const std::string& key) {
  const bool cpu = device == "cpu";
  bool cuda = device == "cuda";
  // At most 4 digits: a device number past any machine's, without overflowing an int.
  if (!cuda && device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 9) {
    cuda = std::all_of(device.begin() + 5, device.end(), [](char ch) {
      return ch >= '0' && ch <= '9';
    });
  }
  PC_CHECK(cpu || cuda, ConfigError, "config key '", key, "' has device '", shown(device),
           "'; use cpu, cuda or cuda:N (N from 0 to 9999)");
}

// A device listed twice would run one encoder there all the same (the run loads one per device),
// so the list says something the run does not do: refused, as a typo more likely than a wish.
// "cuda:07" is "cuda:7"; "cuda" (the current device) is told apart from "cuda:0" only when the
// encoders load, which loads one for both.
void check_devices_once(const std::vector<std::string>& devices, const std::string& key) {
  std::set<std::string> seen;
  for (const auto& device : devices) {
    std::string canonical = device;
    if (device.rfind("cuda:", 0) == 0) {
      const size_t digits = device.find_first_not_of('0', 5);
      canonical = digits == std::string::npos ? "cuda:0" : "cuda:" + device.substr(digits);
    }
    PC_CHECK(seen.insert(canonical).second, ConfigError, "config key '", key, "' lists device '",
             shown(device), "' twice; list each device once (each GPU already runs several "
             "encode calls at once)");
  }
}

std::string_view flag_name(const ConfigField& f) { return f.flag.name(); }

// Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF (Unicode's table
// 3-7), what HDF5 readers such as h5py's asstr() and JSON decode.
bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (i + length > text.size()) return false;
    if (length > 1 && (byte(i + 1) < low || byte(i + 1) > high)) return false;
    for (size_t k = 2; k < length; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

NameList read_name_list(const YamlNode& n) {
  PC_CHECK(n.node.IsSequence(), ConfigError, "config key '", n.path,
           "' must be a list of names, e.g. [label, split] ([] for none)");
  NameList out;
  for (size_t i = 0; i < n.node.size(); ++i) out.names.push_back(read_string(n.element(i)));
  return out;
}

// One path, or a list of at least one (each relative to the config file's folder).
PathList read_path_list(const YamlNode& n, const Path& base) {
  PathList out;
  if (!n.node.IsSequence()) {
    out.paths.push_back(read_path(n, base));
    return out;
  }
  PC_CHECK(n.node.size() > 0, ConfigError, "config key '", n.path,
           "' lists no path; give a path, or a list of at least one");
  PC_CHECK(n.node.size() <= kMaxListedPaths, ConfigError, "config key '", n.path, "' lists ",
           n.node.size(), " paths; at most ", kMaxListedPaths,
           " are allowed (a folder or a brace range names many in one)");
  for (size_t i = 0; i < n.node.size(); ++i) out.paths.push_back(read_path(n.element(i), base));
  return out;
}

// Every name non-empty UTF-8 text without NUL, at most kMaxNameBytes bytes, given once; at most
// kMaxListedNames of them.
void check_name_list(const ConfigField& f, const NameList& list) {
  PC_CHECK(list.size() <= kMaxListedNames, ConfigError, "config key '", f.key, "' lists ",
           list.size(), " names; at most ", kMaxListedNames, " are allowed",
           origin_text(flag_name(f)));
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string& name = list.names[i];
    const std::string at = f.key + "[" + std::to_string(i) + "]";
    PC_CHECK(!name.empty(), ConfigError, "config key '", at, "' is an empty name; give a name",
             origin_text(flag_name(f)));
    PC_CHECK(name.find('\0') == std::string::npos, ConfigError, "config key '", at, "' is '",
             shown(name), "': a name cannot hold a NUL character (shown as \\x00)",
             origin_text(flag_name(f)));
    PC_CHECK(is_valid_utf8(name), ConfigError, "config key '", at, "' is '", shown(name),
             "': not valid UTF-8 (the bad bytes are shown as \\xHH); names must be UTF-8 text",
             origin_text(flag_name(f)));
    PC_CHECK(name.size() <= kMaxNameBytes, ConfigError, "config key '", at, "' is ",
             name.size(), " bytes long; a name has at most ", kMaxNameBytes,
             origin_text(flag_name(f)));
    for (size_t j = 0; j < i; ++j) {
      PC_CHECK(list.names[j] != name, ConfigError, "config key '", f.key, "' names '",
               shown(name), "' twice (entries ", j, " and ", i, "); give each name once",
               origin_text(flag_name(f)));
    }
  }
}

// A flag's "label,split": the names between commas; "" is no name at all.
NameList split_names(const std::string& text) {
  NameList out;
  if (text.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.names.push_back(text.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// --- what each member type does, unless its spec says otherwise -------------------------------

template <class T>
T read_value(const ConfigField& f, const YamlNode& n, const Path& base) {
  if constexpr (std::is_same_v<T, bool>) {
    return read_bool(n);
  } else if constexpr (std::is_arithmetic_v<T>) {
    if (f.byte_size) {
      const auto text = read_string(n);
      return text == "0" ? 0 : parse_byte_size(text, "config key '" + f.key + "'");
    }
    PC_ASSERT(f.bound, "config key '", f.key, "' is a number without a range");
    return read_number<T>(n, *f.bound, flag_name(f));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return read_string(n);
  } else if constexpr (std::is_same_v<T, Path>) {
    return read_path(n, base);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return read_devices(n);
  } else if constexpr (std::is_same_v<T, NameList>) {
    return read_name_list(n);
  } else if constexpr (std::is_same_v<T, PathList>) {
    return read_path_list(n, base);
  } else if constexpr (std::is_same_v<T, Float3>) {
    PC_CHECK(n.node.IsSequence() && n.node.size() == 3, ConfigError, "config key '", n.path,
             "' must be a list of ", 3, " numbers");
    Float3 out{};
    for (size_t i = 0; i < out.size(); ++i) {
      const YamlNode element = n.element(i);
      const double value = read_number<double>(element, *f.bound, flag_name(f));
      // Checked before the cast: a double beyond float's range has no float to become.
      check_bound(element.path, *f.bound, flag_name(f), value);
      out[i] = static_cast<float>(value);
    }
    return out;
  } else if constexpr (std::is_same_v<T, MemoryBudget>) {
    return parse_memory_budget(read_string(n), "config key '" + f.key + "'");
  } else if constexpr (std::is_same_v<T, EncoderType>) {
    return read_encoder_type(f, n);
  } else if constexpr (IsChoice<T>::value) {
    return read_choice(n, Choices<T>::kNames);
  } else {
    static_assert(IsOptional<T>::value, "a config member type without a reader");
    return read_value<typename IsOptional<T>::Value>(f, n, base);
  }
}

// What a config file writes for a member of type T, in the words docs/config.md uses.
template <class T>
std::string_view type_words(const ConfigField& f) {
  if constexpr (std::is_same_v<T, bool>) {
    return "boolean";
  } else if constexpr (std::is_arithmetic_v<T>) {
    if (f.byte_size) return "size";
    return std::is_integral_v<T> ? "integer" : "number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "text";
  } else if constexpr (std::is_same_v<T, Path>) {
    return "path";
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return "device or list of devices";
  } else if constexpr (std::is_same_v<T, NameList>) {
    return "list of names";
  } else if constexpr (std::is_same_v<T, PathList>) {
    return "path or list of paths";
  } else if constexpr (std::is_same_v<T, Float3>) {
    return "list of 3 numbers";
  } else if constexpr (std::is_same_v<T, MemoryBudget>) {
    return "size or fraction";
  } else if constexpr (std::is_same_v<T, EncoderType> || IsChoice<T>::value) {
    return "choice";
  } else {
    static_assert(IsOptional<T>::value, "a config member type without words for its type");
    return type_words<typename IsOptional<T>::Value>(f);
  }
}

template <class T>
Json json_value(const T& value) {
  if constexpr (std::is_same_v<T, Path>) {
    return value.string();
  } else if constexpr (std::is_same_v<T, MemoryBudget>) {
    return value.bytes > 0 ? Json(value.bytes) : Json(value.fraction);
  } else if constexpr (std::is_same_v<T, NameList>) {
    return value.names;
  } else if constexpr (std::is_same_v<T, PathList>) {
    // One path as a path, as configs wrote it before lists were allowed.
    if (value.size() == 1) return value.paths[0].string();
    Json list = Json::array();
    for (const auto& path : value.paths) list.push_back(path.string());
    return list;
  } else if constexpr (IsChoice<T>::value) {
    return Choices<T>::name(value);
  } else if constexpr (IsOptional<T>::value) {
    return value ? json_value(*value) : Json();
  } else {
    return value;
  }
}

template <class T>
void check_value(const ConfigField& f, const T& value) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (!f.bound || (f.unset_when_zero && value == 0)) return;
    check_bound(f.key, *f.bound, flag_name(f), value);
  } else if constexpr (std::is_same_v<T, Float3>) {
    for (const float v : value) check_bound(f.key, *f.bound, flag_name(f), v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    for (const auto& d : value) check_device(d, f.key);
    check_devices_once(value, f.key);
  } else if constexpr (std::is_same_v<T, NameList>) {
    check_name_list(f, value);
  } else if constexpr (IsOptional<T>::value) {
    if (value) check_value(f, *value);
  }
}

template <class T>
FlagKind flag_kind(const ConfigField& f) {
  if constexpr (std::is_same_v<T, bool>) return FlagKind::kSwitch;
  if constexpr (std::is_same_v<T, int>) return FlagKind::kInt;
  if constexpr (std::is_same_v<T, int64_t>) return f.byte_size ? FlagKind::kText : FlagKind::kInt64;
  if constexpr (std::is_same_v<T, double>) return FlagKind::kDouble;
  return FlagKind::kText;
}

template <class T>
T flag_as(const FlagValue& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return std::get<std::string>(v);
  } else {
    return std::visit(
        [](const auto& x) -> T {
          if constexpr (std::is_arithmetic_v<std::decay_t<decltype(x)>>) {
            return static_cast<T>(x);
          } else {
            PC_ASSERT(false, "a flag's value of the wrong kind");
          }
        },
        v);
  }
}

template <class T>
void apply_value(const ConfigField& f, T& member, const FlagValue& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (std::get<bool>(v)) member = true;  // a switch sets; its absence leaves the file's value
  } else if constexpr (std::is_arithmetic_v<T>) {
    member = f.flag.kind == FlagKind::kText ? parse_byte_size(std::get<std::string>(v), f.flag.name())
                                            : flag_as<T>(v);
  } else if constexpr (std::is_same_v<T, Path>) {
    member = absolute_from_cwd(std::get<std::string>(v));
  } else if constexpr (std::is_same_v<T, std::string>) {
    member = std::get<std::string>(v);
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    member = {std::get<std::string>(v)};
  } else if constexpr (std::is_same_v<T, NameList>) {
    member = split_names(std::get<std::string>(v));
  } else if constexpr (std::is_same_v<T, PathList>) {
    member = PathList{{absolute_from_cwd(std::get<std::string>(v))}};
  } else if constexpr (std::is_same_v<T, MemoryBudget>) {
    member = parse_memory_budget(std::get<std::string>(v), f.flag.name());
  } else {
    PC_ASSERT(false, "config key '", f.key, "' has a flag but no way to apply it");
  }
}

// --- keys a spec handles itself ------------------------------------------------------------------

void check_sampling_mapping(const YamlNode& s) {
  PC_CHECK(s.has("fps") != s.has("num_frames"), ConfigError, "config key '", s.path,
           "' needs exactly one of 'fps' (frames per second) or 'num_frames' (per clip)");
}

void read_video_size(const ConfigField& f, const YamlNode& n, const Path&, Config& c) {
  if (n.node.IsSequence()) {
    PC_CHECK(n.node.size() == 2, ConfigError, "config key '", n.path,
             "' must be one integer or [height, width]");
    c.video.height = read_number<int>(n.element(0), *f.bound, flag_name(f));
    c.video.width = read_number<int>(n.element(1), *f.bound, flag_name(f));
  } else {
    c.video.height = c.video.width = read_number<int>(n, *f.bound, flag_name(f));
  }
}

void write_video_size(const ConfigField& f, const Config& c, Json& j) {
  j[f.json_key] = {c.video.height, c.video.width};
}

void check_video_size(const ConfigField& f, const Config& c) {
  check_bound(f.key, *f.bound, flag_name(f), c.video.height);
  check_bound(f.key, *f.bound, flag_name(f), c.video.width);
}

void read_max_failures(const ConfigField&, const YamlNode& n, const Path&, Config& c) {
  parse_max_failures(read_string(n), c.run);
}

void write_max_failures(const ConfigField&, const Config& c, Json& j) {
  j["max_failures"] = c.run.max_failures;
  j["max_failure_fraction"] = c.run.max_failure_fraction;
}

void apply_max_failures_flag(Config& c, const FlagValue& v) {
  parse_max_failures(std::get<std::string>(v), c.run);
}

// --input names a manifest file, a media folder or tar shards, whichever the path is
// (input_section_for in config.hpp).
void apply_input_flag(Config& c, const FlagValue& v) {
  c.input = input_section_for(absolute_from_cwd(std::get<std::string>(v)));
}

// --device is every encoder's: the sections' own devices give way to it.
void apply_device_flag(Config& c, const FlagValue& v) {
  c.run.devices = {std::get<std::string>(v)};
  for (auto* s : {static_cast<EncoderSection*>(&c.video), static_cast<EncoderSection*>(&c.audio),
                  static_cast<EncoderSection*>(&c.text)}) {
    s->devices.clear();
  }
}

void apply_no_supervisor_flag(Config& c, const FlagValue& v) {
  if (std::get<bool>(v)) c.run.supervise = false;
}

// --- the spec of a key, as the lists in config.hpp write it --------------------------------------

using Reader = void (*)(const ConfigField&, const YamlNode&, const Path&, Config&);
using Writer = void (*)(const ConfigField&, const Config&, Json&);
using Checker = void (*)(const ConfigField&, const Config&);
using Applier = void (*)(Config&, const FlagValue&);
using MappingCheck = void (*)(const YamlNode&);

class Spec {
 public:
  Spec key(std::string_view k) { return with([&](Spec& s) { s.key_ = k; }); }
  Spec json(std::string_view k) { return with([&](Spec& s) { s.f_.json_key = k; }); }
  Spec range(Bound b) { return with([&](Spec& s) { s.f_.bound = b; }); }
  Spec in_record() { return with([](Spec& s) { s.f_.recorded = Recorded::kRecord; }); }
  Spec in_fingerprint() { return with([](Spec& s) { s.f_.recorded = Recorded::kFingerprint; }); }
  Spec no_default() { return with([](Spec& s) { s.f_.has_default = false; }); }
  Spec unset_when_zero() { return with([](Spec& s) { s.f_.unset_when_zero = true; }); }
  Spec null_unsets() { return with([](Spec& s) { s.f_.null_unsets = true; }); }
  Spec byte_size() { return with([](Spec& s) { s.f_.byte_size = true; }); }
  Spec omitted_when_empty() { return with([](Spec& s) { s.f_.omitted_when_empty = true; }); }
  Spec required(std::string_view what) { return with([&](Spec& s) { s.f_.required = what; }); }
  Spec type(std::string_view words) { return with([&](Spec& s) { s.f_.type = words; }); }
  Spec flag(std::string_view names, std::string_view help) {
    return with([&](Spec& s) { s.f_.flag = ConfigFlag{names, help}; });
  }
  Spec reads(Reader r) { return with([&](Spec& s) { s.f_.read = r; }); }
  Spec writes(Writer w) { return with([&](Spec& s) { s.f_.write = w; }); }
  Spec checks(Checker c) { return with([&](Spec& s) { s.f_.check = c; }); }
  Spec applies(Applier a) { return with([&](Spec& s) { s.f_.apply = a; }); }
  Spec on_mapping(MappingCheck m) { return with([&](Spec& s) { s.f_.on_mapping = m; }); }

  // The field of a key in `section`, held in the member `access` returns (named `member`).
  template <class Access>
  ConfigField field(std::string_view section, std::string_view member, std::string_view doc,
                    Access access) && {
    using T = std::remove_reference_t<decltype(access(std::declval<Config&>()))>;
    ConfigField f = named(section, key_.empty() ? member : key_, doc);
    if (f.type.empty()) f.type = type_words<T>(f);
    const bool custom_read = static_cast<bool>(f.read);
    if (!f.read) {
      f.read = [access](const ConfigField& self, const YamlNode& n, const Path& base, Config& c) {
        access(c) = read_value<T>(self, n, base);
      };
    }
    if (!f.write) {
      f.write = [access](const ConfigField& self, const Config& c, Json& j) {
        if constexpr (requires(const T& v) { v.empty(); }) {
          if (self.omitted_when_empty && access(c).empty()) return;
        }
        j[self.json_key] = json_value(access(c));
      };
    }
    if (!f.check) {
      f.check = [access](const ConfigField& self, const Config& c) {
        check_value(self, access(c));
      };
    }
    if (!f.flag.names.empty()) {
      // A key with its own reader is text that reader parses ("2.5%"): so is its flag.
      f.flag.kind = custom_read ? FlagKind::kText : flag_kind<T>(f);
      if (!f.apply) {
        f.apply = [access, self = f](Config& c, const FlagValue& v) {
          apply_value(self, access(c), v);
        };
      }
    }
    return f;
  }

  // The field of a key whose spec reads, writes and checks it itself.
  ConfigField row(std::string_view section, std::string_view doc) && {
    ConfigField f = named(section, key_, doc);
    PC_ASSERT(f.read && f.write && f.check, "config key '", f.key, "' needs its own reader");
    PC_ASSERT(!f.type.empty(), "config key '", f.key, "' needs the words for its type");
    return f;
  }

 private:
  template <class Change>
  Spec with(Change change) {
    Spec s = *this;
    change(s);
    return s;
  }

  ConfigField named(std::string_view section, std::string_view key, std::string_view doc) {
    ConfigField f = f_;
    f.key = std::string(section) + "." + std::string(key);
    f.doc = doc;
    if (f.json_key.empty()) f.json_key = std::string(key.substr(key.rfind('.') + 1));
    return f;
  }

  std::string_view key_;
  ConfigField f_;
};

// Expands a key list of config.hpp into fields of `section`, held under PC_OBJECT(config).
#define PC_TABLE_KEY(type, member, default_value, doc, spec) \
  fields.push_back(                                          \
      spec.field(section, #member, doc, [](auto& c) -> auto& { return PC_OBJECT(c).member; }));
#define PC_TABLE_MEMBER(type, member, default_value, doc)
#define PC_TABLE_ROW(doc, spec) fields.push_back(spec.row(section, doc));
#define PC_TABLE(list) list(PC_TABLE_KEY, PC_TABLE_MEMBER, PC_TABLE_ROW)

std::vector<ConfigField> make_fields() {
  std::vector<ConfigField> fields;
  std::string_view section;
#define PC_OBJECT(c) c.input
  section = "input";
  PC_TABLE(PRECOMPUTE_INPUT_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.output
  section = "output";
  PC_TABLE(PRECOMPUTE_OUTPUT_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.run
  section = "run";
  PC_TABLE(PRECOMPUTE_RUN_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.video.encoder
  section = "video";
  PC_TABLE(PRECOMPUTE_ENCODER_SPEC_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.video
  PC_TABLE(PRECOMPUTE_ENCODER_KEYS)
  PC_TABLE(PRECOMPUTE_VIDEO_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.audio.encoder
  section = "audio";
  PC_TABLE(PRECOMPUTE_ENCODER_SPEC_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.audio
  PC_TABLE(PRECOMPUTE_ENCODER_KEYS)
  PC_TABLE(PRECOMPUTE_AUDIO_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.text.encoder
  section = "text";
  PC_TABLE(PRECOMPUTE_ENCODER_SPEC_KEYS)
#undef PC_OBJECT
#define PC_OBJECT(c) c.text
  PC_TABLE(PRECOMPUTE_ENCODER_KEYS)
  PC_TABLE(PRECOMPUTE_TEXT_KEYS)
#undef PC_OBJECT
  return fields;
}

}  // namespace

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = make_fields();
  return fields;
}

const ConfigField& config_field(std::string_view key) {
  key = key.substr(0, key.find('['));
  for (const auto& f : config_fields()) {
    if (f.key == key) return f;
  }
  PC_THROW(InternalError, "config key '", key, "' is not in the table (Note [Config keys])");
}

bool section_enabled(const Config& c, std::string_view name) {
  if (name == "video") return c.video.enabled;
  if (name == "audio") return c.audio.enabled;
  if (name == "text") return c.text.enabled;
  return true;
}

void enable_section(Config& c, std::string_view name) {
  if (name == "video") c.video.enabled = true;
  if (name == "audio") c.audio.enabled = true;
  if (name == "text") c.text.enabled = true;
}

std::string_view ConfigFlag::name() const { return names.substr(names.rfind(',') + 1); }

std::vector<ConfigFlag> config_flags() {
  std::vector<ConfigFlag> flags;
  for (const auto& f : config_fields()) {
    if (f.flag.names.empty()) continue;
    const bool seen = std::any_of(flags.begin(), flags.end(),
                                  [&](const ConfigFlag& g) { return g.names == f.flag.names; });
    if (!seen) flags.push_back(f.flag);
  }
  return flags;
}

}  // namespace precompute
