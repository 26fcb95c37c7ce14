#pragma once
// The run's configuration as typed structs, expanded from one list of keys per section (Note
// [Config keys]); configs/reference.yaml documents every key with its default. load_config()
// reads YAML into these and validate() says how to fix what is wrong before any work starts.

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "pipeline/core/modality.hpp"

namespace precompute {

// Limits shared with the commands that take the same settings as flags (the key lists below have
// every other range).
// Threads one setting may start at once: more than machines have cores, far fewer than the count
// at which creating them fails.
inline constexpr int kMaxThreads = 1024;
// Tokens per text, [CLS] and [SEP] included: a shorter limit leaves no room for the text itself.
inline constexpr int kMinTokenizerMaxLength = 3;
inline constexpr int kMaxTokenizerMaxLength = 65536;
inline constexpr double kDay = 24 * 3600.0;  // seconds, for the ranges of time limits

// Floating-point type the encoder runs in.
enum class ComputeDtype { kFloat32, kFloat16, kBFloat16 };
// Floating-point type embeddings are stored in.
enum class StorageDtype { kFloat16, kFloat32 };

// How a sample's per-step model outputs become what is stored.
enum class Pooling {
  kMean,   // average over frames / windows / tokens (tokens: attention-masked)
  kNone,   // keep one vector per frame / window / token (CSR layout in the shard)
  kCls,    // text only: the first token's vector
  kMax,    // text only: element-wise max over tokens
  kModel,  // the model already returns one vector per sample
};

// How video frames are scaled to the encoder's input size.
enum class ResizeMode {
  kShorterSideCrop,  // scale the shorter side to the target, then centre-crop (aspect kept)
  kStretch,          // scale straight to the target size (aspect not kept)
};

// Shape the video encoder takes.
enum class VideoLayout {
  kFrames,  // [B*T, C, H, W]: every frame on its own
  kClips,   // [B, T, C, H, W]: every sample's frames together (T equal within a batch)
};

// Where video is decoded (Note [NVDEC through FFmpeg] in pipeline/media/nvdec.cpp).
enum class VideoDecoderKind {
  kAuto,   // NVDEC sessions and CPU decoders side by side, each file to whichever is free (CPU
           // only in builds without CUDA or without a CUDA device for video)
  kCpu,    // FFmpeg's software decoders
  kNvdec,  // NVDEC only; a stream it cannot take still falls back to the CPU
};

// The model format an encoder section names (encoder.type).
enum class EncoderType {
  kTorchScript,  // a torch.jit.save'd file
  kBert,         // a Hugging Face BERT folder (text only)
  kPt2,          // an AOTInductor package (torch.export + aoti_compile_and_package; video, audio)
};

std::string_view compute_dtype_name(ComputeDtype d);
std::string_view encoder_type_name(EncoderType t);
std::string_view video_decoder_name(VideoDecoderKind k);
// The CUDA device number of a device string that validate() accepted: 0 for "cuda", N for
// "cuda:N"; nullopt for "cpu".
std::optional<int> cuda_ordinal(const std::string& device);
std::string_view storage_dtype_name(StorageDtype d);
std::string_view pooling_name(Pooling p);
std::string_view resize_mode_name(ResizeMode r);
std::string_view video_layout_name(VideoLayout l);

// How much device memory each GPU may use: bytes, or a fraction of the card. Unset: no budget.
struct MemoryBudget {
  int64_t bytes = 0;      // > 0: this many bytes
  double fraction = 0.0;  // > 0: this fraction of the card's memory
  bool set() const { return bytes > 0 || fraction > 0; }
  // The budget on a card of `total_bytes`.
  int64_t bytes_of(int64_t total_bytes) const;
};

// Parses "20GiB", "512MiB", "8GB", "1.5e9" (bytes), "0.8" or "80%" (of the card). Throws
// ConfigError naming `key` and the forms it takes.
MemoryBudget parse_memory_budget(const std::string& text, std::string_view key);
// Parses a byte size like "4GiB", "300MB" or "1000000". Throws ConfigError naming `key`.
int64_t parse_byte_size(const std::string& text, std::string_view key);
std::string format_bytes(int64_t bytes);

// A list of names that the config file writes as a YAML list of strings (output.keep_columns).
// Its own type, not a std::vector<std::string> (which the table reads and checks as devices):
// the table reads it as a list of strings (empty allowed), writes it as a JSON array, checks
// that each name is non-empty UTF-8 text without NUL and given once, and takes its flag as one
// comma-separated text ("label,split"; "" is none, though `precompute run` takes an empty flag
// as not given).
struct NameList {
  std::vector<std::string> names;
  bool empty() const { return names.empty(); }
  size_t size() const { return names.size(); }
  bool operator==(const NameList&) const = default;
};
// At most this many names in one NameList, each at most kMaxNameBytes bytes long.
inline constexpr size_t kMaxListedNames = 1024;
inline constexpr size_t kMaxNameBytes = 255;

// input.tars: one path (a .tar, a folder of them, a brace range) or a list of them, read in the
// order listed. A config file may write one path as a list of one and the other way round: both
// are the same input.
struct PathList {
  std::vector<std::filesystem::path> paths;
  bool empty() const { return paths.empty(); }
  size_t size() const { return paths.size(); }
  bool operator==(const PathList&) const = default;
  // One path as itself, several as "a, b, c": for messages and index.json's "input".
  std::string text() const;
};
inline constexpr size_t kMaxListedPaths = 1000000;

// Note [Config keys]
// Every key of a config file is declared once, in the lists below: the member that holds it
// (type, name, default), a doc line, and a spec (its YAML key when that differs from the member's
// name, its range, which JSON forms record it, the `precompute run` flag that sets it). The
// structs expand the lists into members; pipeline/core/config_fields.cpp expands the same lists
// into the table that YAML reading, key checking, flags, validate(), both JSON forms and the
// reference test (tests/unit/config_reference_test.cpp) iterate. An entry is one of
//   KEY(type, member, default, doc, spec)  a key held in one member
//   MEMBER(type, member, default, doc)     a member no key sets on its own
//   ROW(doc, spec)                         a key held in MEMBERs (its spec says how)
// A default or type with a comma goes in parentheses; specs are compiled in config_fields.cpp
// only, and a comment inside a list is a /* */ one (a // one would swallow the continuation).
// Entries are in the order the keys are read and listed in messages.

#define PC_DECLARE_KEY(type, member, default_value, doc, spec) type member = default_value;
#define PC_DECLARE_MEMBER(type, member, default_value, doc) type member = default_value;
#define PC_DECLARE_ROW(doc, spec)

using Float3 = std::array<float, 3>;

// The model behind one encoder: keys encoder.type and encoder.path of every modality's section.
#define PRECOMPUTE_ENCODER_SPEC_KEYS(KEY, MEMBER, ROW)                                          \
  KEY(EncoderType, type, EncoderType::kTorchScript,                                             \
      "torchscript (a file); pt2 (an AOTInductor package, video and audio; the default for a "      \
      ".pt2 file); bert (a Hugging Face folder, text only)",                                        \
      Spec().key("encoder.type").in_fingerprint())                                              \
  KEY(std::filesystem::path, path, {}, "resolved against the config file's folder",             \
      Spec().key("encoder.path").no_default().in_record().required("the encoder's model file"))

struct EncoderSpec {
  PRECOMPUTE_ENCODER_SPEC_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

// What every modality's encoder section has in common.
#define PRECOMPUTE_ENCODER_KEYS(KEY, MEMBER, ROW)                                               \
  MEMBER(bool, enabled, false, "the section is present in the config")                          \
  MEMBER(EncoderSpec, encoder, {}, "the model (PRECOMPUTE_ENCODER_SPEC_KEYS)")                  \
  KEY(std::vector<std::string>, devices, {}, "\"cpu\", \"cuda\", \"cuda:1\"; empty: run.device",  \
      Spec().key("device").json("devices").no_default().in_record())                           \
  KEY(ComputeDtype, dtype, ComputeDtype::kFloat32, "float32, float16 or bfloat16",              \
      Spec().in_fingerprint())                                                                  \
  KEY(int, batch_size, 16, "samples per batch, at most",                                        \
      Spec().range(count(1, 65536)).in_record().flag("--batch-size",                            \
                                                     "Samples per batch, every encoder"))       \
  KEY(std::optional<Pooling>, pooling, {},                                                      \
      "unset: mean (text with a bert folder: the folder's pooling)",                            \
      Spec().no_default().in_fingerprint())                                                     \
  KEY(std::optional<bool>, normalize, {},                                                       \
      "L2-normalise each stored vector; unset: no (text with a bert folder: whether the "       \
      "folder has a Normalize module)",                                                         \
      Spec().no_default().in_fingerprint())

// The effective value of a setting and where it came from: "model folder", "model package",
// "config file" or "default" (Note [Where a text setting comes from] in
// encoders/bert/text_settings.cpp). Logged at start-up and kept in index.json (model_settings).
struct SettingOrigin {
  std::string key;     // as a config file spells it: "text.normalize"
  std::string value;   // as JSON: true, 256, "mean"
  std::string source;
  bool operator==(const SettingOrigin&) const = default;
};

struct EncoderSection {
  PRECOMPUTE_ENCODER_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
  // The section's keys the config file sets ("size", "mean"): a model package's settings fill
  // only the others (encoders/package_settings.hpp). Not a key.
  std::vector<std::string> keys_in_file;
  // Every setting a model folder or package may decide, once resolved (text:
  // encoders/bert/text_settings.hpp; video, audio: encoders/package_settings.hpp). Not a key.
  std::vector<SettingOrigin> origins;

  Pooling pooling_mode() const { return pooling.value_or(Pooling::kMean); }
  bool normalized() const { return normalize.value_or(false); }
};

// Seek: the same frames either way, so not part of the fingerprint. Decoder: NVDEC's frames
// differ from the CPU's within a bound (Note [Converting NVDEC pictures on the GPU]), as one GPU's
// arithmetic differs from another's, and under auto which files go where is up to timing: like
// the device, not part of the fingerprint.
#define PRECOMPUTE_VIDEO_KEYS(KEY, MEMBER, ROW)                                                 \
  KEY(double, fps, 0.0, "sample this many frames per second of video, or ...",                  \
      Spec().key("sampling.fps").no_default().unset_when_zero()                                 \
          .range(number(0.001, 1000).noted("frames per second")).in_fingerprint()               \
          .on_mapping(check_sampling_mapping))                                                  \
  KEY(int, num_frames, 0, "... this many frames spread evenly over the clip",                   \
      Spec().key("sampling.num_frames").no_default().unset_when_zero()                          \
          .range(count(1, 100000)).in_fingerprint())                                            \
  MEMBER(int, height, 224, "encoder input size (key size)")                                     \
  MEMBER(int, width, 224, "encoder input size (key size)")                                      \
  ROW("encoder input size: one integer, or [height, width]",                                    \
      Spec().key("size").range(count(8, 4096).noted("pixels")).in_fingerprint()                 \
          .type("integer or list of 2 integers").reads(read_video_size).writes(write_video_size).checks(check_video_size))            \
  KEY(ResizeMode, resize, ResizeMode::kShorterSideCrop, "shorter_side_crop or stretch",         \
      Spec().in_fingerprint())                                                                  \
  KEY(Float3, mean, (Float3{0.485f, 0.456f, 0.406f}), "per channel, on [0, 1] pixels",          \
      Spec().range(number(-1e6, 1e6)).in_fingerprint())                                         \
  KEY(Float3, std, (Float3{0.229f, 0.224f, 0.225f}), "per channel, on [0, 1] pixels",           \
      Spec().range(above(0, 1e6)).in_fingerprint())                                             \
  KEY(VideoLayout, layout, VideoLayout::kFrames, "frames or clips", Spec().in_fingerprint())    \
  KEY(int64_t, max_batch_frames, 0, "frames per batch, at most (0: batch_size alone)",          \
      Spec().range(count(0, 1e9).noted("0: no limit")).in_record())                            \
  KEY(double, max_duration_s, 4 * 3600.0, "longer clips fail with category too_long",           \
      Spec().range(above(0, 30 * kDay).noted("seconds; 2592000 is 30 days")).in_record())       \
  KEY(int, max_frames, 4096, "frames per sample, at most (fps sampling of long clips)",         \
      Spec().range(count(1, 1e6)).in_record())                                                  \
  KEY(int, decoder_threads, 1, "FFmpeg threads per decoder (parallelism is across samples)",    \
      Spec().range(count(0, 64).noted("0: FFmpeg chooses")))                                    \
  KEY(int64_t, max_pixels, 8192LL * 8192, "coded width x height above this: category too_large",\
      Spec().range(count(1, 1e12)).in_record())                                                 \
  KEY(int64_t, max_decoded_frames, 1000000, "frames through the decoder per sample: too_long",  \
      Spec().range(count(1, 1e12)).in_record())                                                 \
  KEY(bool, autorotate, true, "apply the stream's display matrix (rotation, flips)",            \
      Spec().in_fingerprint())                                                                  \
  KEY(bool, seek, true, "seek to keyframes and drop frames nobody keeps (same frames)",         \
      Spec().in_record())                                                                       \
  KEY(VideoDecoderKind, decoder, VideoDecoderKind::kAuto,                                       \
      "auto: NVDEC beside the CPU decoders where the build has CUDA and video runs on a GPU, "   \
      "else the CPU; cpu; nvdec: NVDEC only (a stream it cannot take falls back to the CPU)",   \
      Spec().in_record())                                                                       \
  KEY(int, nvdec_sessions, 0,                                                                   \
      "NVDEC sessions on each GPU video runs on, with decoder auto or nvdec (cpu opens none); "  \
      "0: two per NVDEC engine as the driver reports them, 4 where the count is unknown",        \
      Spec().range(count(0, 64).noted("per GPU; 0: two per NVDEC engine")).in_record())         \
  KEY(bool, nvdec_own_context, true,                                                            \
      "NVDEC sessions in a CUDA context of their own; false: in the encoders' (the GPU's "      \
      "primary one), so the GPU need not switch between contexts, but a CUDA fault while "      \
      "decoding then stops the encoders too",                                                   \
      Spec())

struct VideoSection : EncoderSection {
  PRECOMPUTE_VIDEO_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

#define PRECOMPUTE_AUDIO_KEYS(KEY, MEMBER, ROW)                                                 \
  KEY(int, sample_rate, 16000, "the encoder's rate; audio is resampled to it, mono",            \
      Spec().range(count(1000, 384000).noted("Hz")).in_fingerprint())                           \
  KEY(double, window_s, 0.0, "window length; 0: the whole clip is one window",                  \
      Spec().range(number(0, kDay).noted("seconds; 0: the whole clip is one window; 86400 is "  \
                                         "1 day")).in_fingerprint())                            \
  KEY(double, hop_s, 0.0, "window start to start; 0: window_s",                                 \
      Spec().range(number(0, kDay).noted("seconds; 0: window_s; 86400 is 1 day"))               \
          .in_fingerprint())                                                                    \
  KEY(int64_t, max_batch_seconds, 0, "audio seconds per batch, at most (0: batch_size alone)",  \
      Spec().range(count(0, 30 * kDay).noted("0: no limit; 2592000 is 30 days")).in_record())   \
  KEY(double, max_duration_s, 4 * 3600.0, "longer clips fail with category too_long",           \
      Spec().range(above(0, 30 * kDay).noted("seconds; 2592000 is 30 days")).in_record())

struct AudioSection : EncoderSection {
  PRECOMPUTE_AUDIO_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

// Tokenizer settings left unset take the model folder's (encoder type bert, see
// encoders/bert/text_settings.hpp) or BERT's defaults (lower_case true, strip_accents following
// lower_case, tokenize_chinese_chars true, max_length 128).
#define PRECOMPUTE_TEXT_KEYS(KEY, MEMBER, ROW)                                                  \
  KEY(std::filesystem::path, vocab, {}, "WordPiece vocab.txt; type bert: the folder's by default",\
      Spec().key("tokenizer.vocab").no_default().in_record())                                   \
  KEY(std::optional<bool>, lower_case, {}, "unset: the folder's, else true",                    \
      Spec().key("tokenizer.lower_case").no_default().in_fingerprint())                         \
  KEY(std::optional<bool>, strip_accents, {}, "null: same as lower_case",                       \
      Spec().key("tokenizer.strip_accents").null_unsets().in_fingerprint())                     \
  KEY(std::optional<bool>, tokenize_chinese_chars, {}, "unset: the folder's, else true",        \
      Spec().key("tokenizer.tokenize_chinese_chars").no_default().in_fingerprint())             \
  KEY(std::string, prefix, {}, "put before every caption, such as e5's 'passage: '; empty: the " \
      "folder's default prompt, if any",                                                        \
      Spec().no_default().in_fingerprint().omitted_when_empty())                                \
  KEY(std::optional<int>, max_length, {}, "tokens per caption, [CLS] and [SEP] included",       \
      Spec().key("tokenizer.max_length").no_default().in_fingerprint()                          \
          .range(count(kMinTokenizerMaxLength, kMaxTokenizerMaxLength)                          \
                     .noted("[CLS], at least one token and [SEP]")))                            \
  KEY(int64_t, max_batch_tokens, 0, "tokens per batch, at most (0: batch_size alone); padded "  \
      "tokens for torchscript, real tokens for bert",                                           \
      Spec().range(count(0, 1e9).noted("0: no limit")).in_record())                            \
  KEY(int, output_layer, -1, "bert: hidden states after this layer (-1: last, 0: embeddings)",  \
      Spec().range(count(-1, 1000).noted("-1: the last layer, 0: the embeddings"))              \
          .in_fingerprint())                                                                    \
  KEY(int64_t, max_text_bytes, 1 << 20, "longer captions fail with category too_large",         \
      Spec().range(count(1, 1 << 30).noted("bytes; 1073741824 is 1 GiB")).in_record())

struct TextSection : EncoderSection {
  PRECOMPUTE_TEXT_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

#define PRECOMPUTE_INPUT_KEYS(KEY, MEMBER, ROW)                                                 \
  KEY(std::filesystem::path, manifest, {}, "JSONL, CSV or TSV; or ...",                         \
      Spec().no_default().in_record()                                                           \
          .flag("-i,--input", "Manifest (.jsonl/.csv/.tsv), media folder, or tar shards")                    \
          .applies(apply_input_flag))                                                           \
  KEY(std::filesystem::path, folder, {},                                                        \
      "... a folder of media files with optional .txt captions",                                \
      Spec().no_default().in_record())                                                          \
  KEY(PathList, tars, {},                                                                       \
      "... WebDataset tar shards: a .tar, a folder of .tar files, 'shards/{000000..000099}.tar', " \
      "or a list of these",                                                                     \
      Spec().no_default().in_record().omitted_when_empty())

struct InputSection {
  PRECOMPUTE_INPUT_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

// Shard size changes where samples are stored, not how an embedding is computed: a resume may
// change it (Note [Limits are not semantic]).
#define PRECOMPUTE_OUTPUT_KEYS(KEY, MEMBER, ROW)                                                \
  KEY(std::filesystem::path, path, {}, "output folder; created if missing",                     \
      Spec().no_default().in_record().flag("-o,--output", "Output folder"))                     \
  KEY(int64_t, shard_size, 1024, "manifest samples per shard",                                  \
      Spec().range(count(1, 1e9)).in_record().flag("--shard-size", "Input samples per shard"))  \
  KEY(StorageDtype, dtype, StorageDtype::kFloat16, "float16 or float32",                        \
      Spec().in_fingerprint())                                                                  \
  KEY(int, chunk_rows, 256, "HDF5 chunk height for embedding datasets",                         \
      Spec().range(count(1, 1 << 20)).in_record())                                              \
  /* Left out of both JSON forms while empty, so that every fingerprint made before the key */  \
  /* existed stays as it was (Note [Kept columns] in pipeline/input/manifest.cpp). */           \
  KEY(NameList, keep_columns, {}, "manifest (or tar .json) columns stored per sample (/columns)",\
      Spec().in_fingerprint().omitted_when_empty().null_unsets()                                \
          .flag("--keep-columns", "Manifest columns stored per sample as strings, comma-"       \
                                  "separated: label,split"))                                    \
  KEY(bool, overwrite, false, "start over: remove an earlier run's files in `path`",            \
      Spec().flag("--overwrite", "Start over: remove an earlier run's files from the output "   \
                                 "folder (by default a rerun resumes it); also accepts a "      \
                                 "folder that holds other files, which are left alone"))        \
  KEY(bool, retry_failed, false, "resume, and also redo the samples that failed before",        \
      Spec().flag("--retry-failed", "Resume, and also redo the samples that have failure "      \
                                    "records"))

struct OutputSection {
  PRECOMPUTE_OUTPUT_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

// Note [Limits are not semantic]: sample_timeout_s, max_file_bytes (and the modalities' max_*
// caps) decide whether a sample is attempted, never how an embedding is computed, so they may
// change between a run and its resume; none is in the fingerprint.
#define PRECOMPUTE_RUN_KEYS(KEY, MEMBER, ROW)                                                   \
  KEY(std::vector<std::string>, devices, {"cpu"}, "default device(s) of every encoder",         \
      Spec().key("device").json("devices").in_record()                                          \
          .flag("--device", "Device of every encoder: cpu, cuda, cuda:N")                       \
          .applies(apply_device_flag))                                                          \
  KEY(int, decode_threads, 0, "concurrent decodes; 0: one per core",                            \
      Spec().range(count(0, kMaxThreads).noted("0: one per core")).in_record()                  \
          .flag("--decode-threads", "Samples decoded at once (0: one per core)"))               \
  KEY(int, torch_threads, 0, "LibTorch intra-op threads on CPU; 0: one per core",               \
      Spec().range(count(0, kMaxThreads).noted("0: one per core")).in_record()                  \
          .flag("--torch-threads", "LibTorch CPU threads (0: one per core)"))                   \
  KEY(int, max_in_flight, 0, "samples between source and writer; 0: automatic",                 \
      Spec().range(count(0, 1e6).noted("0: automatic")).in_record())                            \
  /* Note [The default failure limit] in pipeline/runner.cpp: 50%, as a fraction.      */       \
  KEY(int64_t, max_failures, -1,                                                                \
      "samples with failure records allowed before exit code 3: a count, a percentage of the "  \
      "samples (\"1%\"), or -1 for no limit; the default is 50%",                               \
      Spec().in_record().type("count or percentage").reads(read_max_failures)                   \
          .writes(write_max_failures)                                                           \
          .flag("--max-failures", "Samples with failure records allowed before exit code 3: a " \
                                  "count, a percentage like 1%, or -1 for no limit (default: "  \
                                  "50%); a modality that embeds nothing exits 3 under any "     \
                                  "limit")                                                      \
          .applies(apply_max_failures_flag))                                                    \
  MEMBER(double, max_failure_fraction, 0.5, "max_failures as a fraction of all samples; -1: none")\
  /* An interval under a millisecond is a flood of lines, not progress. */                      \
  KEY(double, progress_interval_s, 2.0, "seconds between progress lines; 0: none",              \
      Spec().range(number(0.001, kDay).zero_means("no progress lines")                          \
                       .noted("seconds; 86400 is 1 day"))                                       \
          .flag("--progress-interval", "Seconds between progress lines (0: none)"))             \
  KEY(std::string, log_level, "info", "trace, debug, info, warn, error or off",                 \
      Spec().flag("--log-level", "trace, debug, info, warn, error, off"))                       \
  /* Where this process reports, not what it stores: in neither JSON form, so a resume may */   \
  /* change them (pipeline/report_files.hpp checks and places them). */                         \
  KEY(std::filesystem::path, summary_json, {},                                                  \
      "also write the run's summary (JSON) to this file; null: only OUT/summary.json",          \
      Spec().no_default().null_unsets()                                                         \
          .flag("--summary-json", "Also write the run's summary as JSON to this file "          \
                                  "(docs/format.md, \"Run summary\")"))                         \
  KEY(std::filesystem::path, metrics_file, {},                                                  \
      "Prometheus text file rewritten every progress interval; null: none",                     \
      Spec().no_default().null_unsets()                                                         \
          .flag("--metrics-file", "Keep the run's metrics in this file in Prometheus' text "    \
                                  "format, rewritten every progress interval (for "             \
                                  "node_exporter's textfile collector)"))                       \
  KEY(double, sample_timeout_s, 600.0, "a sample's decode time limit (category timeout)",       \
      Spec().range(above(0, 7 * kDay).noted("seconds; 604800 is 7 days")).in_record())          \
  KEY(int64_t, max_file_bytes, 64LL << 30, "larger media files fail with category too_large",   \
      Spec().range(count(1, 1125899906842624.0).noted("bytes; 1125899906842624 is 1 PiB"))      \
          .in_record())                                                                         \
  KEY(bool, supervise, true, "run the job in a child process restarted after a crash",          \
      Spec().flag("--no-supervisor", "Run in this process, without a supervisor that restarts " \
                                     "the run after a decoder crash (for debuggers)")           \
          .applies(apply_no_supervisor_flag))                                                   \
  KEY(int, max_restarts, 5, "restarts after crashes before the run gives up",                   \
      Spec().range(count(0, 1000)))                                                             \
  /* Ranks of a job split across processes (docs/distributed.md); not recorded: every rank */   \
  /* writes the shards a single run would. */                                                   \
  KEY(int64_t, world_size, 0,                                                                   \
      "ranks the job is split into, when the rank comes from the environment without a "         \
      "count (JOB_COMPLETION_INDEX); --world-size and the environment's count beat it",           \
      Spec().range(count(1, 100000).zero_means("not set: --world-size or the environment")))    \
  KEY(MemoryBudget, gpu_memory_budget, {},                                                      \
      "per GPU (Note [Memory budgets] in pipeline/memory_budget.cpp); null: none",              \
      Spec().null_unsets().in_record()                                                          \
          .flag("--gpu-memory-budget", "Device memory per GPU: a size (8GiB) or a fraction of " \
                                       "the card (0.8); batch limits are calibrated to it at "  \
                                       "start-up"))                                             \
  KEY(int64_t, host_memory_budget, 0,                                                           \
      "bytes of decoded samples held in the pipeline; 0: automatic",                            \
      Spec().byte_size().in_record()                                                            \
          .flag("--host-memory-budget", "Host memory for decoded samples in flight (e.g. "      \
                                        "4GiB); decoding waits while it is full"))

struct RunSection {
  PRECOMPUTE_RUN_KEYS(PC_DECLARE_KEY, PC_DECLARE_MEMBER, PC_DECLARE_ROW)
};

struct Config {
  std::filesystem::path file;      // the config file it came from (empty when built in code)
  InputSection input;
  OutputSection output;
  RunSection run;
  VideoSection video;
  AudioSection audio;
  TextSection text;

  const EncoderSection& section(Modality m) const;
  bool enabled(Modality m) const { return section(m).enabled; }
  // Devices this modality's encoder runs on: its own, else run.devices.
  std::vector<std::string> devices_for(Modality m) const;
};

// The defaults of the sections, for option structs built from them (pipeline/media's decode
// options take theirs from here rather than declaring them again).
const VideoSection& default_video_section();
const AudioSection& default_audio_section();
const TextSection& default_text_section();

// The input section an --input argument names, whichever the path is: tar shards
// (names_tar_shards in media_names.hpp), a media folder, or else a manifest.
InputSection input_section_for(const std::filesystem::path& argument);
// Several arguments (verify -i A -i B): a list of tar shards, as input.tars may be; throws
// ConfigError when one of them does not name tars.
InputSection input_section_for(const std::vector<std::filesystem::path>& arguments);
const RunSection& default_run_section();

// A flag of `precompute run` that sets config keys (the table in config_fields.cpp says which).
enum class FlagKind { kSwitch, kInt, kInt64, kDouble, kText };
using FlagValue = std::variant<bool, int, int64_t, double, std::string>;
struct ConfigFlag {
  std::string_view names;  // as CLI11 takes them: "-o,--output"
  std::string_view help;
  FlagKind kind = FlagKind::kText;
  std::string_view name() const;  // the long name, "--output": the key of ConfigOverrides
};
// Every flag once, in the order of the keys it sets.
std::vector<ConfigFlag> config_flags();

// Flags of `precompute run` that override the file, by long name ("--shard-size"), with the value
// the command line gave; a flag not given is absent and leaves the file's value.
struct ConfigOverrides {
  std::map<std::string, FlagValue, std::less<>> values;
  void set(std::string_view flag, FlagValue value) { values[std::string(flag)] = std::move(value); }
};

// Reads a YAML config file. Relative paths in it resolve against its folder. Throws ConfigError
// naming the key and the fix for unknown keys, wrong types and bad values.
Config load_config(const std::filesystem::path& file);
// Same, from YAML text; relative paths resolve against `base_dir`.
Config parse_config(const std::string& yaml_text, const std::filesystem::path& base_dir);

// Applies command-line overrides (relative paths resolve against the working directory).
void apply_overrides(Config& config, const ConfigOverrides& overrides);

// Checks the whole config for consistency, and every number against its range (Note [Config
// bounds] in config_bounds.hpp); throws ConfigError naming the key, the range and the value. Called
// after apply_overrides(), so flags are checked too.
void validate(const Config& config);

// Parses "10" (a count) or "2.5%" (a fraction of all samples) into the run section.
void parse_max_failures(const std::string& text, RunSection& run);

// The settings that change what is stored (encoders, preprocessing, pooling, storage dtype), as
// canonical JSON; excluded: paths of input/output, threads, batch sizes, devices, logging. Two
// runs with equal fingerprints produce interchangeable shards.
std::string semantic_config_json(const Config& config);
// Every setting, for the record kept with the output.
std::string full_config_json(const Config& config);

}  // namespace precompute
