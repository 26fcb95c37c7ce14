#include "pipeline/core/config.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>

#include "pipeline/core/error.hpp"

namespace precompute {

std::string_view compute_dtype_name(ComputeDtype d) {
  switch (d) {
    case ComputeDtype::kFloat32:
      return "float32";
    case ComputeDtype::kFloat16:
      return "float16";
    case ComputeDtype::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

std::string_view storage_dtype_name(StorageDtype d) {
  return d == StorageDtype::kFloat16 ? "float16" : "float32";
}

std::string_view pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kMean:
      return "mean";
    case Pooling::kNone:
      return "none";
    case Pooling::kCls:
      return "cls";
    case Pooling::kMax:
      return "max";
    case Pooling::kModel:
      return "model";
  }
  return "?";
}

std::string_view video_decoder_name(VideoDecoderKind k) {
  return k == VideoDecoderKind::kAuto ? "auto" : k == VideoDecoderKind::kCpu ? "cpu" : "nvdec";
}

std::optional<int> cuda_ordinal(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0) return std::stoi(device.substr(5));
  return std::nullopt;
}

std::string_view resize_mode_name(ResizeMode r) {
  return r == ResizeMode::kShorterSideCrop ? "shorter_side_crop" : "stretch";
}

std::string_view video_layout_name(VideoLayout l) {
  return l == VideoLayout::kFrames ? "frames" : "clips";
}

const EncoderSection& Config::section(Modality m) const {
  switch (m) {
    case Modality::kVideo:
      return video;
    case Modality::kAudio:
      return audio;
    case Modality::kText:
      return text;
  }
  PC_ASSERT(false, "unknown modality");
}

std::vector<std::string> Config::devices_for(Modality m) const {
  const auto& own = section(m).devices;
  return own.empty() ? run.devices : own;
}

namespace {

// A YAML node with the dotted key path that led to it, so that every message names the key.
struct Node {
  YAML::Node node;
  std::string path;

  Node child(const std::string& key) const {
    return {node[key], path.empty() ? key : path + "." + key};
  }
  bool has(const std::string& key) const { return node.IsMap() && node[key].IsDefined(); }
};

std::string where(const Config& c) {
  return c.file.empty() ? std::string("config") : "config " + c.file.string();
}

template <class T>
T scalar(const Node& n, const char* what) {
  PC_CHECK(n.node.IsScalar(), ConfigError, "config key '", n.path, "' must be ", what);
  try {
    return n.node.as<T>();
  } catch (const YAML::Exception&) {
    PC_THROW(ConfigError, "config key '", n.path, "' must be ", what, ", got '",
             n.node.Scalar(), "'");
  }
}

// Note [Config bounds]
// Every number a config file or a `run` flag sets has a range below. validate() checks them after
// the flags are applied, and the readers quote the same range when the YAML number does not fit
// the field at all (99999999999 for an int, 1e10 for any integer). The ranges are far beyond real
// use; they exist so that nothing downstream overflows or runs away: seconds become int64 clock
// ticks (wait_for and the watchdog's 2 * sample_timeout_s + 5 wrap into the past beyond about 292
// years, so every wait ends at once), audio seconds are multiplied by sample rates, thread counts
// become threads started at once, and counts are summed into batch, shard and in-flight limits.
// NaN fails every comparison, so each check asks "inside?", never "outside?".
struct Bound {
  std::string_view key;  // as the config spells it
  bool integer = false;
  double lo = 0;
  double hi = 0;
  bool above_lo = false;  // lo itself is refused (a limit of 0 s would refuse every sample)
  std::string_view flag;  // the `precompute run` flag that sets it too, if any
  std::string_view zero;  // when set, 0 is allowed besides [lo, hi] and means this
  std::string_view note;  // units and special values, shown after the range

  constexpr Bound set_by(std::string_view f) const {
    Bound b = *this;
    b.flag = f;
    return b;
  }
  constexpr Bound zero_means(std::string_view z) const {
    Bound b = *this;
    b.zero = z;
    return b;
  }
  constexpr Bound noted(std::string_view n) const {
    Bound b = *this;
    b.note = n;
    return b;
  }
};

// An integer in [lo, hi].
constexpr Bound count(std::string_view key, double lo, double hi) {
  Bound b;
  b.key = key;
  b.integer = true;
  b.lo = lo;
  b.hi = hi;
  return b;
}

// A real number in [lo, hi].
constexpr Bound number(std::string_view key, double lo, double hi) {
  Bound b = count(key, lo, hi);
  b.integer = false;
  return b;
}

// A real number in (lo, hi].
constexpr Bound above(std::string_view key, double lo, double hi) {
  Bound b = number(key, lo, hi);
  b.above_lo = true;
  return b;
}

constexpr double kDay = 24 * 3600.0;

constexpr Bound kBounds[] = {
    count("output.shard_size", 1, 1e9).set_by("--shard-size"),
    count("output.chunk_rows", 1, 1 << 20),
    count("run.decode_threads", 0, kMaxThreads).set_by("--decode-threads").noted("0: one per core"),
    count("run.torch_threads", 0, kMaxThreads).set_by("--torch-threads").noted("0: one per core"),
    count("run.max_in_flight", 0, 1e6).noted("0: automatic"),
    // An interval under a millisecond is a flood of lines, not progress.
    number("run.progress_interval_s", 0.001, kDay)
        .set_by("--progress-interval")
        .zero_means("no progress lines")
        .noted("seconds; 86400 is 1 day"),
    above("run.sample_timeout_s", 0, 7 * kDay).noted("seconds; 604800 is 7 days"),
    count("run.max_file_bytes", 1, 1125899906842624.0).noted("bytes; 1125899906842624 is 1 PiB"),
    count("run.max_restarts", 0, 1000),
    count("video.batch_size", 1, 65536).set_by("--batch-size"),
    count("audio.batch_size", 1, 65536).set_by("--batch-size"),
    count("text.batch_size", 1, 65536).set_by("--batch-size"),
    number("video.sampling.fps", 0.001, 1000).noted("frames per second"),
    count("video.sampling.num_frames", 1, 100000),
    count("video.size", 8, 4096).noted("pixels"),
    number("video.mean", -1e6, 1e6),
    above("video.std", 0, 1e6),
    count("video.max_batch_frames", 0, 1e9).noted("0: no limit"),
    above("video.max_duration_s", 0, 30 * kDay).noted("seconds; 2592000 is 30 days"),
    count("video.max_frames", 1, 1e6),
    count("video.decoder_threads", 0, 64).noted("0: FFmpeg chooses"),
    count("video.max_pixels", 1, 1e12),
    count("video.max_decoded_frames", 1, 1e12),
    count("video.nvdec_sessions", 1, 64).noted("per GPU"),
    count("audio.sample_rate", 1000, 384000).noted("Hz"),
    number("audio.window_s", 0, kDay)
        .noted("seconds; 0: the whole clip is one window; 86400 is 1 day"),
    number("audio.hop_s", 0, kDay).noted("seconds; 0: window_s; 86400 is 1 day"),
    count("audio.max_batch_seconds", 0, 30 * kDay).noted("0: no limit; 2592000 is 30 days"),
    above("audio.max_duration_s", 0, 30 * kDay).noted("seconds; 2592000 is 30 days"),
    count("text.max_batch_tokens", 0, 1e9).noted("0: no limit"),
    count("text.tokenizer.max_length", kMinTokenizerMaxLength, kMaxTokenizerMaxLength)
        .noted("[CLS], at least one token and [SEP]"),
    count("text.output_layer", -1, 1000).noted("-1: the last layer, 0: the embeddings"),
    count("text.max_text_bytes", 1, 1 << 30).noted("bytes; 1073741824 is 1 GiB"),
};

// The bound of a config key; an element such as video.size[1] has its list's.
const Bound& bound_of(std::string_view key) {
  key = key.substr(0, key.find('['));
  for (const auto& b : kBounds) {
    if (b.key == key) return b;
  }
  PC_THROW(InternalError, "config key '", key, "' has no bound (Note [Config bounds])");
}

// Bounds are whole numbers up to 1e12 or simple decimals; printed without an exponent.
std::string number_text(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::abs(x) < 1e15) {
    return std::to_string(static_cast<int64_t>(x));
  }
  return fmt::format("{}", x);
}

template <class T>
std::string value_text(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    return fmt::format("{}", value);
  } else {
    return std::to_string(value);
  }
}

// "an integer from 0 to 1024 (0: one per core)" and the like.
std::string range_text(const Bound& b) {
  std::string text;
  if (!b.zero.empty()) text += fmt::format("0 ({}) or ", b.zero);
  text += b.integer ? "an integer " : "a number ";
  text += b.above_lo ? fmt::format("above {} and at most {}", number_text(b.lo), number_text(b.hi))
                     : fmt::format("from {} to {}", number_text(b.lo), number_text(b.hi));
  if (!b.note.empty()) text += fmt::format(" ({})", b.note);
  return text;
}

// Where a wrong value came from: the file, or the flag that overrides it.
std::string origin_text(const Bound& b) {
  return b.flag.empty() ? std::string() : fmt::format(" (config file or {})", b.flag);
}

bool in_bounds(const Bound& b, double value) {
  if (!b.zero.empty() && value == 0) return true;
  return (b.above_lo ? value > b.lo : value >= b.lo) && value <= b.hi;
}

// Throws ConfigError naming `key` (the element, for a list), its range and `value`.
template <class T>
void check_bound(std::string_view key, T value) {
  const Bound& b = bound_of(key);
  PC_CHECK(in_bounds(b, static_cast<double>(value)), ConfigError, "config key '", key,
           "' must be ", range_text(b), ", got ", value_text(value), origin_text(b));
}

// A number of key n.path, read as T. yaml-cpp refuses one that does not fit T, or an integer
// written with a fraction or an exponent, without saying which: the range says both.
template <class T>
T read_number(const Node& n) {
  T value{};
  if (n.node.IsScalar() && YAML::convert<T>::decode(n.node, value)) return value;
  const Bound& b = bound_of(n.path);
  PC_THROW(ConfigError, "config key '", n.path, "' must be ", range_text(b), ", got ",
           n.node.IsScalar() ? "'" + n.node.Scalar() + "'" : std::string("a list or mapping"),
           origin_text(b));
}

bool read_bool(const Node& n) { return scalar<bool>(n, "true or false"); }
int read_int(const Node& n) { return read_number<int>(n); }
int64_t read_int64(const Node& n) { return read_number<int64_t>(n); }
double read_double(const Node& n) { return read_number<double>(n); }
std::string read_string(const Node& n) { return scalar<std::string>(n, "a string"); }

// Fails on keys the section does not know: a typo must not silently fall back to a default.
void check_keys(const Node& n, std::initializer_list<const char*> known) {
  if (!n.node.IsDefined() || n.node.IsNull()) return;
  PC_CHECK(n.node.IsMap(), ConfigError, "config key '", n.path, "' must be a mapping");
  std::set<std::string> allowed(known.begin(), known.end());
  for (const auto& kv : n.node) {
    const auto key = kv.first.as<std::string>();
    if (allowed.count(key) == 0) {
      std::ostringstream list;
      for (const auto* k : known) list << (list.tellp() > 0 ? ", " : "") << k;
      PC_THROW(ConfigError, "unknown config key '", n.path.empty() ? key : n.path + "." + key,
               "'; known keys here: ", list.str());
    }
  }
}

// A user's string as a message shows it: control characters and bytes past ASCII as \xHH, so
// that a NUL does not cut the message short and a terminal shows what is wrong.
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

template <class Enum, size_t N>
Enum read_enum(const Node& n, const std::array<std::pair<const char*, Enum>, N>& names) {
  const auto text = read_string(n);
  std::ostringstream list;
  for (const auto& [name, value] : names) {
    if (text == name) return value;
    list << (list.tellp() > 0 ? ", " : "") << name;
  }
  PC_THROW(ConfigError, "config key '", n.path, "' is '", shown(text), "'; use one of: ",
           list.str());
}

std::filesystem::path read_path(const Node& n, const std::filesystem::path& base) {
  std::filesystem::path p = read_string(n);
  PC_CHECK(!p.empty(), ConfigError, "config key '", n.path, "' is empty; give a path");
  return p.is_absolute() ? p : (base / p).lexically_normal();
}

std::vector<std::string> read_devices(const Node& n) {
  std::vector<std::string> out;
  if (n.node.IsSequence()) {
    for (size_t i = 0; i < n.node.size(); ++i) {
      out.push_back(read_string({n.node[i], n.path + "[" + std::to_string(i) + "]"}));
    }
  } else {
    out.push_back(read_string(n));
  }
  PC_CHECK(!out.empty(), ConfigError, "config key '", n.path, "' lists no device");
  return out;
}

template <size_t N>
std::array<float, N> read_floats(const Node& n) {
  PC_CHECK(n.node.IsSequence() && n.node.size() == N, ConfigError, "config key '", n.path,
           "' must be a list of ", N, " numbers");
  std::array<float, N> out{};
  for (size_t i = 0; i < N; ++i) {
    const Node element{n.node[i], n.path + "[" + std::to_string(i) + "]"};
    const double value = read_double(element);
    // Checked before the cast: a double beyond float's range has no float to become.
    check_bound(element.path, value);
    out[i] = static_cast<float>(value);
  }
  return out;
}

constexpr std::array<std::pair<const char*, ComputeDtype>, 6> kComputeDtypes = {{
    {"float32", ComputeDtype::kFloat32},
    {"fp32", ComputeDtype::kFloat32},
    {"float16", ComputeDtype::kFloat16},
    {"fp16", ComputeDtype::kFloat16},
    {"bfloat16", ComputeDtype::kBFloat16},
    {"bf16", ComputeDtype::kBFloat16},
}};

constexpr std::array<std::pair<const char*, StorageDtype>, 4> kStorageDtypes = {{
    {"float16", StorageDtype::kFloat16},
    {"fp16", StorageDtype::kFloat16},
    {"float32", StorageDtype::kFloat32},
    {"fp32", StorageDtype::kFloat32},
}};

constexpr std::array<std::pair<const char*, Pooling>, 5> kPoolings = {{
    {"mean", Pooling::kMean},
    {"none", Pooling::kNone},
    {"cls", Pooling::kCls},
    {"max", Pooling::kMax},
    {"model", Pooling::kModel},
}};

void read_encoder_section(const Node& n, const std::filesystem::path& base, EncoderSection& s) {
  s.enabled = true;
  if (n.has("encoder")) {
    const Node e = n.child("encoder");
    check_keys(e, {"type", "path"});
    if (e.has("type")) s.encoder.type = read_string(e.child("type"));
    PC_CHECK(e.has("path"), ConfigError, "config key '", e.path,
             "' needs 'path': the encoder's model file");
    s.encoder.path = read_path(e.child("path"), base);
  }
  if (n.has("device")) s.devices = read_devices(n.child("device"));
  if (n.has("dtype")) s.dtype = read_enum(n.child("dtype"), kComputeDtypes);
  if (n.has("batch_size")) s.batch_size = read_int(n.child("batch_size"));
  if (n.has("pooling")) s.pooling = read_enum(n.child("pooling"), kPoolings);
  if (n.has("normalize")) s.normalize = read_bool(n.child("normalize"));
}

void read_video(const Node& n, const std::filesystem::path& base, VideoSection& v) {
  check_keys(n, {"encoder", "device", "dtype", "batch_size", "pooling", "normalize", "sampling",
                 "size", "resize", "mean", "std", "layout", "max_batch_frames", "max_duration_s",
                 "max_frames", "decoder_threads", "max_pixels", "max_decoded_frames",
                 "autorotate", "seek", "decoder", "nvdec_sessions"});
  read_encoder_section(n, base, v);
  if (n.has("sampling")) {
    const Node s = n.child("sampling");
    check_keys(s, {"fps", "num_frames"});
    PC_CHECK(s.has("fps") != s.has("num_frames"), ConfigError, "config key '", s.path,
             "' needs exactly one of 'fps' (frames per second) or 'num_frames' (per clip)");
    if (s.has("fps")) v.fps = read_double(s.child("fps"));
    if (s.has("num_frames")) v.num_frames = read_int(s.child("num_frames"));
  }
  if (n.has("size")) {
    const Node s = n.child("size");
    if (s.node.IsSequence()) {
      PC_CHECK(s.node.size() == 2, ConfigError, "config key '", s.path,
               "' must be one integer or [height, width]");
      v.height = read_int({s.node[0], s.path + "[0]"});
      v.width = read_int({s.node[1], s.path + "[1]"});
    } else {
      v.height = v.width = read_int(s);
    }
  }
  if (n.has("resize")) {
    v.resize = read_enum(n.child("resize"),
                         std::array<std::pair<const char*, ResizeMode>, 2>{{
                             {"shorter_side_crop", ResizeMode::kShorterSideCrop},
                             {"stretch", ResizeMode::kStretch},
                         }});
  }
  if (n.has("mean")) v.mean = read_floats<3>(n.child("mean"));
  if (n.has("std")) v.std = read_floats<3>(n.child("std"));
  if (n.has("layout")) {
    v.layout = read_enum(n.child("layout"), std::array<std::pair<const char*, VideoLayout>, 2>{{
                                                {"frames", VideoLayout::kFrames},
                                                {"clips", VideoLayout::kClips},
                                            }});
  }
  if (n.has("max_batch_frames")) v.max_batch_frames = read_int64(n.child("max_batch_frames"));
  if (n.has("max_duration_s")) v.max_duration_s = read_double(n.child("max_duration_s"));
  if (n.has("max_frames")) v.max_frames = read_int(n.child("max_frames"));
  if (n.has("decoder_threads")) v.decoder_threads = read_int(n.child("decoder_threads"));
  if (n.has("max_pixels")) v.max_pixels = read_int64(n.child("max_pixels"));
  if (n.has("max_decoded_frames")) {
    v.max_decoded_frames = read_int64(n.child("max_decoded_frames"));
  }
  if (n.has("autorotate")) v.autorotate = read_bool(n.child("autorotate"));
  if (n.has("seek")) v.seek = read_bool(n.child("seek"));
  if (n.has("decoder")) {
    v.decoder = read_enum(n.child("decoder"),
                          std::array<std::pair<const char*, VideoDecoderKind>, 3>{{
                              {"auto", VideoDecoderKind::kAuto},
                              {"cpu", VideoDecoderKind::kCpu},
                              {"nvdec", VideoDecoderKind::kNvdec},
                          }});
  }
  if (n.has("nvdec_sessions")) v.nvdec_sessions = read_int(n.child("nvdec_sessions"));
}

void read_audio(const Node& n, const std::filesystem::path& base, AudioSection& a) {
  check_keys(n, {"encoder", "device", "dtype", "batch_size", "pooling", "normalize",
                 "sample_rate", "window_s", "hop_s", "max_batch_seconds", "max_duration_s"});
  read_encoder_section(n, base, a);
  if (n.has("sample_rate")) a.sample_rate = read_int(n.child("sample_rate"));
  if (n.has("window_s")) a.window_s = read_double(n.child("window_s"));
  if (n.has("hop_s")) a.hop_s = read_double(n.child("hop_s"));
  if (n.has("max_batch_seconds")) a.max_batch_seconds = read_int64(n.child("max_batch_seconds"));
  if (n.has("max_duration_s")) a.max_duration_s = read_double(n.child("max_duration_s"));
}

void read_text(const Node& n, const std::filesystem::path& base, TextSection& t) {
  check_keys(n, {"encoder", "device", "dtype", "batch_size", "pooling", "normalize", "tokenizer",
                 "max_batch_tokens", "output_layer", "max_text_bytes"});
  read_encoder_section(n, base, t);
  if (n.has("max_batch_tokens")) t.max_batch_tokens = read_int64(n.child("max_batch_tokens"));
  if (n.has("output_layer")) t.output_layer = read_int(n.child("output_layer"));
  if (n.has("max_text_bytes")) t.max_text_bytes = read_int64(n.child("max_text_bytes"));
  if (!n.has("tokenizer")) return;
  const Node k = n.child("tokenizer");
  check_keys(k, {"vocab", "lower_case", "strip_accents", "tokenize_chinese_chars", "max_length"});
  if (k.has("vocab")) t.vocab = read_path(k.child("vocab"), base);
  if (k.has("lower_case")) t.lower_case = read_bool(k.child("lower_case"));
  if (k.has("strip_accents") && !k.child("strip_accents").node.IsNull()) {
    t.strip_accents = read_bool(k.child("strip_accents"));
  }
  if (k.has("tokenize_chinese_chars")) {
    t.tokenize_chinese_chars = read_bool(k.child("tokenize_chinese_chars"));
  }
  if (k.has("max_length")) t.max_length = read_int(k.child("max_length"));
}

std::filesystem::path absolute_from_cwd(const std::filesystem::path& p) {
  return std::filesystem::absolute(p).lexically_normal();
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::filesystem::path& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    PC_THROW(ConfigError, "config is not valid YAML: ", e.what());
  }
  PC_CHECK(root.IsMap(), ConfigError, "config must be a YAML mapping with sections such as "
                                      "input, output, video, audio, text");
  const Node top{root, ""};
  check_keys(top, {"input", "output", "run", "video", "audio", "text"});
  const auto base = absolute_from_cwd(base_dir);
  Config c;

  if (top.has("input")) {
    const Node n = top.child("input");
    check_keys(n, {"manifest", "folder"});
    if (n.has("manifest")) c.input.manifest = read_path(n.child("manifest"), base);
    if (n.has("folder")) c.input.folder = read_path(n.child("folder"), base);
  }
  if (top.has("output")) {
    const Node n = top.child("output");
    check_keys(n, {"path", "shard_size", "dtype", "chunk_rows", "overwrite", "retry_failed"});
    if (n.has("path")) c.output.path = read_path(n.child("path"), base);
    if (n.has("shard_size")) c.output.shard_size = read_int64(n.child("shard_size"));
    if (n.has("dtype")) c.output.dtype = read_enum(n.child("dtype"), kStorageDtypes);
    if (n.has("chunk_rows")) c.output.chunk_rows = read_int(n.child("chunk_rows"));
    if (n.has("overwrite")) c.output.overwrite = read_bool(n.child("overwrite"));
    if (n.has("retry_failed")) c.output.retry_failed = read_bool(n.child("retry_failed"));
  }
  if (top.has("run")) {
    const Node n = top.child("run");
    check_keys(n, {"device", "decode_threads", "torch_threads", "max_in_flight", "max_failures",
                   "progress_interval_s", "log_level", "sample_timeout_s", "max_file_bytes",
                   "supervise", "max_restarts", "gpu_memory_budget", "host_memory_budget"});
    if (n.has("device")) c.run.devices = read_devices(n.child("device"));
    if (n.has("decode_threads")) c.run.decode_threads = read_int(n.child("decode_threads"));
    if (n.has("torch_threads")) c.run.torch_threads = read_int(n.child("torch_threads"));
    if (n.has("max_in_flight")) c.run.max_in_flight = read_int(n.child("max_in_flight"));
    if (n.has("max_failures")) parse_max_failures(read_string(n.child("max_failures")), c.run);
    if (n.has("progress_interval_s")) {
      c.run.progress_interval_s = read_double(n.child("progress_interval_s"));
    }
    if (n.has("log_level")) c.run.log_level = read_string(n.child("log_level"));
    if (n.has("sample_timeout_s")) {
      c.run.sample_timeout_s = read_double(n.child("sample_timeout_s"));
    }
    if (n.has("max_file_bytes")) c.run.max_file_bytes = read_int64(n.child("max_file_bytes"));
    if (n.has("supervise")) c.run.supervise = read_bool(n.child("supervise"));
    if (n.has("max_restarts")) c.run.max_restarts = read_int(n.child("max_restarts"));
    if (n.has("gpu_memory_budget") && !n.child("gpu_memory_budget").node.IsNull()) {
      c.run.gpu_memory_budget = parse_memory_budget(read_string(n.child("gpu_memory_budget")),
                                                    "config key 'run.gpu_memory_budget'");
    }
    if (n.has("host_memory_budget")) {
      const auto text = read_string(n.child("host_memory_budget"));
      c.run.host_memory_budget =
          text == "0" ? 0 : parse_byte_size(text, "config key 'run.host_memory_budget'");
    }
  }
  if (top.has("video")) read_video(top.child("video"), base, c.video);
  if (top.has("audio")) read_audio(top.child("audio"), base, c.audio);
  if (top.has("text")) read_text(top.child("text"), base, c.text);
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

int64_t MemoryBudget::bytes_of(int64_t total_bytes) const {
  if (bytes > 0) return bytes;
  return static_cast<int64_t>(fraction * static_cast<double>(total_bytes));
}

namespace {

// The number and unit of "4GiB", "1.5 GB", "300"; false when it is not of that form.
bool split_size(const std::string& text, double& number, std::string& unit) {
  size_t used = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  return std::isfinite(number) && number >= 0;
}

double unit_bytes(const std::string& unit) {
  static const std::array<std::pair<const char*, double>, 9> kUnits = {{
      {"", 1.0}, {"B", 1.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
  }};
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) return factor;
  }
  return unit == "TiB" ? 1099511627776.0 : -1.0;
}

}  // namespace

int64_t parse_byte_size(const std::string& text, std::string_view key) {
  double number = 0;
  std::string unit;
  const bool ok = split_size(text, number, unit) && unit_bytes(unit) > 0;
  PC_CHECK(ok && number * unit_bytes(unit) >= 1 && number * unit_bytes(unit) < 9.2e18,
           ConfigError, key, " '", text, "' is not a size; write it like 8GiB, 512MiB, 4GB or "
           "a number of bytes");
  return static_cast<int64_t>(number * unit_bytes(unit));
}

MemoryBudget parse_memory_budget(const std::string& text, std::string_view key) {
  double number = 0;
  std::string unit;
  MemoryBudget budget;
  if (split_size(text, number, unit) && (unit == "%" || (unit.empty() && number <= 1.0))) {
    budget.fraction = unit == "%" ? number / 100.0 : number;
    // Below a thousandth of a card no encoder's weights fit; say so now, not at calibration.
    PC_CHECK(budget.fraction >= 0.001 && budget.fraction <= 1.0, ConfigError, key, " '", text,
             "' must be a fraction of the card from 0.001 to 1 (or 0.1% to 100%), or a size "
             "such as 8GiB");
    return budget;
  }
  try {
    budget.bytes = parse_byte_size(text, key);
  } catch (const ConfigError&) {
    PC_THROW(ConfigError, key, " '", text, "' is neither a size (8GiB, 512MiB, 4GB) nor a "
             "fraction of the card (0.8 or 80%)");
  }
  return budget;
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1073741824.0) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  if (b >= 1048576.0) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

void parse_max_failures(const std::string& text, RunSection& run) {
  // One message for every malformed form: std::stod and std::stoll throw on text that is not a
  // number or does not fit, and NaN fails the range check.
  const auto refuse = [&] {
    PC_THROW(ConfigError, "config key 'run.max_failures' must be a count from -1 (no limit) up, "
             "or a percentage from 0% to 100% such as 1%, got '", text,
             "' (config file or --max-failures)");
  };
  size_t used = 0;
  try {
    if (!text.empty() && text.back() == '%') {
      const double pct = std::stod(text.substr(0, text.size() - 1), &used);
      if (used != text.size() - 1 || !(pct >= 0 && pct <= 100)) refuse();
      run.max_failure_fraction = pct / 100.0;
      run.max_failures = -1;
      return;
    }
    const long long count = std::stoll(text, &used);
    if (used != text.size() || count < -1) refuse();
    run.max_failures = count;
    run.max_failure_fraction = -1.0;
  } catch (const std::logic_error&) {
    refuse();
  }
}

void apply_overrides(Config& c, const ConfigOverrides& o) {
  if (o.input) {
    const auto p = absolute_from_cwd(*o.input);
    c.input = {};
    if (std::filesystem::is_directory(p)) {
      c.input.folder = p;
    } else {
      c.input.manifest = p;
    }
  }
  if (o.output) c.output.path = absolute_from_cwd(*o.output);
  if (o.device) {
    c.run.devices = {*o.device};
    for (auto* s : {static_cast<EncoderSection*>(&c.video), static_cast<EncoderSection*>(&c.audio),
                    static_cast<EncoderSection*>(&c.text)}) {
      s->devices.clear();
    }
  }
  if (o.batch_size) {
    c.video.batch_size = c.audio.batch_size = c.text.batch_size = *o.batch_size;
  }
  if (o.shard_size) c.output.shard_size = *o.shard_size;
  if (o.max_failures) parse_max_failures(*o.max_failures, c.run);
  if (o.decode_threads) c.run.decode_threads = *o.decode_threads;
  if (o.torch_threads) c.run.torch_threads = *o.torch_threads;
  if (o.log_level) c.run.log_level = *o.log_level;
  if (o.overwrite) c.output.overwrite = true;
  if (o.retry_failed) c.output.retry_failed = true;
  if (o.no_supervisor) c.run.supervise = false;
  if (o.gpu_memory_budget) {
    c.run.gpu_memory_budget = parse_memory_budget(*o.gpu_memory_budget, "--gpu-memory-budget");
  }
  if (o.host_memory_budget) {
    c.run.host_memory_budget = parse_byte_size(*o.host_memory_budget, "--host-memory-budget");
  }
}

namespace {

void validate_device(const std::string& device, const std::string& key) {
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

void validate_encoder(const EncoderSection& s, const std::string& name,
                      std::initializer_list<const char*> types,
                      std::initializer_list<Pooling> poolings) {
  PC_CHECK(!s.encoder.path.empty(), ConfigError, "config section '", name,
           "' needs 'encoder: {path: MODEL}'");
  std::ostringstream type_list;
  for (const auto* t : types) type_list << (type_list.tellp() > 0 ? ", " : "") << t;
  PC_CHECK(std::find(types.begin(), types.end(), s.encoder.type) != types.end(), ConfigError,
           "config key '", name, ".encoder.type' is '", s.encoder.type, "'; for ", name,
           " use one of: ", type_list.str());
  if (s.encoder.type == "bert") {
    PC_CHECK(std::filesystem::is_directory(s.encoder.path), ConfigError, "config key '", name,
             ".encoder.path': ", s.encoder.path,
             " is not a folder; type bert needs a Hugging Face model folder (config.json, "
             "model.safetensors, vocab.txt or tokenizer.json)");
  } else {
    PC_CHECK(std::filesystem::is_regular_file(s.encoder.path), ConfigError, "config key '", name,
             ".encoder.path': model file ", s.encoder.path,
             " does not exist; export it first (tools/scripts/export_encoders.py makes the "
             "demo's)");
  }
  check_bound(name + ".batch_size", s.batch_size);
  for (const auto& d : s.devices) validate_device(d, name + ".device");
  const bool allowed =
      std::find(poolings.begin(), poolings.end(), s.pooling_mode()) != poolings.end();
  std::ostringstream list;
  for (auto p : poolings) list << (list.tellp() > 0 ? ", " : "") << pooling_name(p);
  PC_CHECK(allowed, ConfigError, "config key '", name, ".pooling' is '",
           pooling_name(s.pooling_mode()), "'; for ", name, " use one of: ", list.str());
}

}  // namespace

void validate(const Config& c) {
  const bool has_manifest = !c.input.manifest.empty();
  const bool has_folder = !c.input.folder.empty();
  PC_CHECK(has_manifest != has_folder, ConfigError, where(c),
           ": give exactly one input, 'input.manifest' (JSONL/CSV/TSV) or 'input.folder', "
           "or pass --input");
  PC_CHECK(!c.output.path.empty(), ConfigError, where(c),
           ": no output folder; set 'output.path' or pass --output");
  check_bound("output.shard_size", c.output.shard_size);
  check_bound("output.chunk_rows", c.output.chunk_rows);
  PC_CHECK(c.video.enabled || c.audio.enabled || c.text.enabled, ConfigError, where(c),
           ": no encoder configured; add a 'video', 'audio' or 'text' section");
  for (const auto& d : c.run.devices) validate_device(d, "run.device");
  check_bound("run.decode_threads", c.run.decode_threads);
  check_bound("run.torch_threads", c.run.torch_threads);
  check_bound("run.max_in_flight", c.run.max_in_flight);
  check_bound("run.progress_interval_s", c.run.progress_interval_s);
  check_bound("run.sample_timeout_s", c.run.sample_timeout_s);
  check_bound("run.max_file_bytes", c.run.max_file_bytes);
  check_bound("run.max_restarts", c.run.max_restarts);
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn",
                                                "warning", "error", "critical", "off"};
  PC_CHECK(!(c.output.overwrite && c.output.retry_failed), ConfigError,
           "--overwrite starts over and --retry-failed resumes: give one of them");
  PC_CHECK(kLevels.count(c.run.log_level) == 1, ConfigError, "log level '", c.run.log_level,
           "' is unknown; use trace, debug, info, warn, error or off");

  if (c.video.enabled) {
    const auto& v = c.video;
    validate_encoder(v, "video", {"torchscript"}, {Pooling::kMean, Pooling::kNone, Pooling::kModel});
    // 0 is how the struct says "not set"; anything else, NaN included, is a choice to check.
    if (v.fps != 0) check_bound("video.sampling.fps", v.fps);
    if (v.num_frames != 0) check_bound("video.sampling.num_frames", v.num_frames);
    PC_CHECK((v.fps != 0) != (v.num_frames != 0), ConfigError,
             "config key 'video.sampling' needs exactly one of 'fps', ",
             range_text(bound_of("video.sampling.fps")), ", or 'num_frames', ",
             range_text(bound_of("video.sampling.num_frames")));
    check_bound("video.size", v.height);
    check_bound("video.size", v.width);
    for (int i = 0; i < 3; ++i) {
      check_bound("video.mean", v.mean[i]);
      check_bound("video.std", v.std[i]);
    }
    PC_CHECK(v.layout == VideoLayout::kClips || v.pooling_mode() != Pooling::kModel, ConfigError,
             "config key 'video.pooling: model' needs 'layout: clips' (the model sees whole "
             "clips); with layout: frames use mean or none");
    PC_CHECK(v.layout == VideoLayout::kFrames || v.num_frames > 0, ConfigError,
             "config key 'video.layout: clips' needs 'sampling: {num_frames: N}' so that every "
             "clip in a batch has the same number of frames");
    check_bound("video.max_batch_frames", v.max_batch_frames);
    check_bound("video.max_duration_s", v.max_duration_s);
    check_bound("video.max_frames", v.max_frames);
    check_bound("video.decoder_threads", v.decoder_threads);
    check_bound("video.max_pixels", v.max_pixels);
    check_bound("video.max_decoded_frames", v.max_decoded_frames);
    check_bound("video.nvdec_sessions", v.nvdec_sessions);
  }
  if (c.audio.enabled) {
    const auto& a = c.audio;
    validate_encoder(a, "audio", {"torchscript"}, {Pooling::kMean, Pooling::kNone});
    check_bound("audio.sample_rate", a.sample_rate);
    check_bound("audio.window_s", a.window_s);
    check_bound("audio.hop_s", a.hop_s);
    PC_CHECK(a.window_s > 0 || a.hop_s == 0, ConfigError,
             "config key 'audio.hop_s' needs 'audio.window_s' (whole-clip mode has no hop)");
    // A window or hop under one sample rounds to nothing (window) or to one sample (hop: a
    // window starting at every sample of the clip).
    for (const auto& [key, seconds] : {std::pair{"audio.window_s", a.window_s},
                                       std::pair{"audio.hop_s", a.hop_s}}) {
      PC_CHECK(seconds == 0 || seconds * a.sample_rate >= 1, ConfigError, "config key '", key,
               "' must be ", range_text(bound_of(key)), ", and at least one sample (1/",
               a.sample_rate, " s), got ", value_text(seconds));
    }
    check_bound("audio.max_batch_seconds", a.max_batch_seconds);
    check_bound("audio.max_duration_s", a.max_duration_s);
  }
  if (c.text.enabled) {
    const auto& t = c.text;
    if (t.encoder.type == "bert") {
      validate_encoder(t, "text", {"torchscript", "bert"},
                       {Pooling::kMean, Pooling::kNone, Pooling::kCls, Pooling::kMax});
    } else {
      validate_encoder(t, "text", {"torchscript", "bert"},
                       {Pooling::kMean, Pooling::kNone, Pooling::kCls, Pooling::kMax,
                        Pooling::kModel});
      PC_CHECK(!t.vocab.empty(), ConfigError,
               "config key 'text.tokenizer.vocab' is missing: a TorchScript text model needs "
               "the WordPiece vocab.txt it was trained with");
    }
    PC_CHECK(t.vocab.empty() || std::filesystem::is_regular_file(t.vocab), ConfigError,
             "config key 'text.tokenizer.vocab': ", t.vocab,
             " does not exist; point it at the model's vocab.txt");
    if (t.max_length) check_bound("text.tokenizer.max_length", *t.max_length);
    check_bound("text.max_batch_tokens", t.max_batch_tokens);
    check_bound("text.max_text_bytes", t.max_text_bytes);
    check_bound("text.output_layer", t.output_layer);
    PC_CHECK(t.encoder.type == "bert" || t.output_layer == -1, ConfigError,
             "config key 'text.output_layer' needs 'encoder.type: bert' (a TorchScript model "
             "returns what it returns)");
  }
}

namespace {

nlohmann::json encoder_json(const EncoderSection& s, bool semantic) {
  nlohmann::json j = {
      {"type", s.encoder.type},
      {"path", s.encoder.path.string()},
      {"dtype", compute_dtype_name(s.dtype)},
      {"pooling", s.pooling ? nlohmann::json(pooling_name(*s.pooling)) : nlohmann::json()},
      {"normalize", s.normalize ? nlohmann::json(*s.normalize) : nlohmann::json()},
  };
  if (semantic) {
    // The model file's identity is its content hash, stored by the writer; its path is not.
    j.erase("path");
  } else {
    j["devices"] = s.devices;
    j["batch_size"] = s.batch_size;
  }
  return j;
}

nlohmann::json config_json(const Config& c, bool semantic) {
  nlohmann::json j;
  j["output"] = {{"dtype", storage_dtype_name(c.output.dtype)}};
  // Shard size and the limits change where samples are stored and which are attempted, not how
  // an embedding is computed: a resume may change them (Note [Limits are not semantic]).
  if (!semantic) {
    j["output"]["shard_size"] = c.output.shard_size;
    j["input"] = {{"manifest", c.input.manifest.string()}, {"folder", c.input.folder.string()}};
    j["output"]["path"] = c.output.path.string();
    j["output"]["chunk_rows"] = c.output.chunk_rows;
    j["run"] = {{"devices", c.run.devices},
                {"decode_threads", c.run.decode_threads},
                {"torch_threads", c.run.torch_threads},
                {"max_in_flight", c.run.max_in_flight},
                {"max_failures", c.run.max_failures},
                {"max_failure_fraction", c.run.max_failure_fraction},
                {"sample_timeout_s", c.run.sample_timeout_s},
                {"gpu_memory_budget", c.run.gpu_memory_budget.bytes > 0
                                          ? nlohmann::json(c.run.gpu_memory_budget.bytes)
                                          : nlohmann::json(c.run.gpu_memory_budget.fraction)},
                {"host_memory_budget", c.run.host_memory_budget},
                {"max_file_bytes", c.run.max_file_bytes}};
  }
  if (c.video.enabled) {
    const auto& v = c.video;
    auto e = encoder_json(v, semantic);
    e["fps"] = v.fps;
    e["num_frames"] = v.num_frames;
    e["size"] = {v.height, v.width};
    e["resize"] = resize_mode_name(v.resize);
    e["mean"] = v.mean;
    e["std"] = v.std;
    e["layout"] = video_layout_name(v.layout);
    e["autorotate"] = v.autorotate;
    if (!semantic) {
      e["max_batch_frames"] = v.max_batch_frames;
      e["max_duration_s"] = v.max_duration_s;
      e["max_frames"] = v.max_frames;
      e["max_pixels"] = v.max_pixels;
      e["max_decoded_frames"] = v.max_decoded_frames;
      e["seek"] = v.seek;  // the same frames either way: not part of the fingerprint
      // NVDEC's frames differ from the CPU's within a bound (Note [Converting NVDEC pictures on
      // the GPU]), as one GPU's arithmetic differs from another's; under auto, which files go
      // where is up to timing. Like the device, not part of the fingerprint.
      e["decoder"] = video_decoder_name(v.decoder);
      e["nvdec_sessions"] = v.nvdec_sessions;
    }
    j["video"] = e;
  }
  if (c.audio.enabled) {
    const auto& a = c.audio;
    auto e = encoder_json(a, semantic);
    e["sample_rate"] = a.sample_rate;
    e["window_s"] = a.window_s;
    e["hop_s"] = a.hop_s;
    if (!semantic) {
      e["max_batch_seconds"] = a.max_batch_seconds;
      e["max_duration_s"] = a.max_duration_s;
    }
    j["audio"] = e;
  }
  if (c.text.enabled) {
    const auto& t = c.text;
    auto e = encoder_json(t, semantic);
    const auto optional = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
    e["lower_case"] = optional(t.lower_case);
    e["strip_accents"] = optional(t.strip_accents);
    e["tokenize_chinese_chars"] = optional(t.tokenize_chinese_chars);
    e["max_length"] = optional(t.max_length);
    e["output_layer"] = t.output_layer;
    if (!semantic) {
      e["vocab"] = t.vocab.string();
      e["max_batch_tokens"] = t.max_batch_tokens;
      e["max_text_bytes"] = t.max_text_bytes;
    }
    j["text"] = e;
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
