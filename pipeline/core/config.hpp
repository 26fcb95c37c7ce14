#pragma once
// The run's configuration as typed structs. configs/reference.yaml documents every field with
// the same words; load_config() reads YAML into these and validate() says how to fix what is
// wrong before any work starts.

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/core/modality.hpp"

namespace precompute {

// Limits shared with the commands that take the same settings as flags (Note [Config bounds] in
// config.cpp has every other range).
// Threads one setting may start at once: more than machines have cores, far fewer than the count
// at which creating them fails.
inline constexpr int kMaxThreads = 1024;
// Tokens per text, [CLS] and [SEP] included: a shorter limit leaves no room for the text itself.
inline constexpr int kMinTokenizerMaxLength = 3;
inline constexpr int kMaxTokenizerMaxLength = 65536;

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

std::string_view compute_dtype_name(ComputeDtype d);
std::string_view video_decoder_name(VideoDecoderKind k);
// The CUDA device number of a device string that validate() accepted: 0 for "cuda", N for
// "cuda:N"; nullopt for "cpu".
std::optional<int> cuda_ordinal(const std::string& device);
std::string_view storage_dtype_name(StorageDtype d);
std::string_view pooling_name(Pooling p);
std::string_view resize_mode_name(ResizeMode r);
std::string_view video_layout_name(VideoLayout l);

// The model behind one encoder.
struct EncoderSpec {
  std::string type = "torchscript";  // torchscript (a file), or bert (a Hugging Face folder)
  std::filesystem::path path;        // resolved against the config file's folder
};

// What every modality's encoder section has in common.
struct EncoderSection {
  bool enabled = false;            // the section is present in the config
  EncoderSpec encoder;
  std::vector<std::string> devices;  // "cpu", "cuda", "cuda:1"; empty: run.device
  ComputeDtype dtype = ComputeDtype::kFloat32;
  int batch_size = 16;             // samples per batch, at most
  std::optional<Pooling> pooling;  // unset: mean (text with a bert folder: the folder's pooling)
  std::optional<bool> normalize;   // L2-normalise each stored vector; unset: no (text with a
                                   // bert folder: whether the folder has a Normalize module)

  Pooling pooling_mode() const { return pooling.value_or(Pooling::kMean); }
  bool normalized() const { return normalize.value_or(false); }
};

struct VideoSection : EncoderSection {
  double fps = 0.0;                // sample this many frames per second of video, or ...
  int num_frames = 0;              // ... this many frames spread evenly over the clip
  int height = 224;                // encoder input size
  int width = 224;
  ResizeMode resize = ResizeMode::kShorterSideCrop;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // per channel, on [0, 1] pixels
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  VideoLayout layout = VideoLayout::kFrames;
  int64_t max_batch_frames = 0;    // frames per batch, at most (0: batch_size alone)
  double max_duration_s = 4 * 3600.0;  // longer clips fail with category too_long
  int max_frames = 4096;           // frames per sample, at most (fps sampling of long clips)
  int decoder_threads = 1;         // FFmpeg threads per decoder (parallelism is across samples)
  int64_t max_pixels = 8192LL * 8192;  // coded width x height above this: category too_large
  int64_t max_decoded_frames = 1000000;  // frames through the decoder per sample: too_long
  bool autorotate = true;          // apply the stream's display matrix (rotation, flips)
  bool seek = true;                // seek to keyframes and drop frames nobody keeps (same frames)
  // cpu by default: through FFmpeg's hwaccel, NVDEC decodes far slower than the CPU decoders
  // on the reference machine (3 clips/s against 97; docs/benchmarks.md, "NVDEC"), and under
  // auto its sessions hold files the CPU would finish sooner.
  VideoDecoderKind decoder = VideoDecoderKind::kCpu;
  int nvdec_sessions = 4;          // NVDEC sessions per GPU of video.device
};

struct AudioSection : EncoderSection {
  int sample_rate = 16000;         // the encoder's rate; audio is resampled to it, mono
  double window_s = 0.0;           // window length; 0: the whole clip is one window
  double hop_s = 0.0;              // window start to start; 0: window_s
  int64_t max_batch_seconds = 0;   // audio seconds per batch, at most (0: batch_size alone)
  double max_duration_s = 4 * 3600.0;
};

// Tokenizer settings left unset take the model folder's (encoder type bert, see
// encoders/bert/text_settings.hpp) or BERT's defaults (lower_case true, strip_accents following
// lower_case, tokenize_chinese_chars true, max_length 128).
struct TextSection : EncoderSection {
  std::filesystem::path vocab;     // WordPiece vocab.txt; type bert: the folder's by default
  std::optional<bool> lower_case;
  std::optional<bool> strip_accents;
  std::optional<bool> tokenize_chinese_chars;
  std::optional<int> max_length;   // tokens per caption, [CLS] and [SEP] included
  int64_t max_batch_tokens = 0;    // tokens per batch, at most (0: batch_size alone); padded
                                   // tokens for torchscript, real tokens for bert
  int output_layer = -1;           // bert: hidden states after this layer (-1: last, 0: embeddings)
  int64_t max_text_bytes = 1 << 20;  // longer captions fail with category too_large
};

struct InputSection {
  std::filesystem::path manifest;  // JSONL, CSV or TSV; or ...
  std::filesystem::path folder;    // ... a folder of media files with optional .txt captions
};

struct OutputSection {
  std::filesystem::path path;      // output folder; created if missing
  int64_t shard_size = 1024;       // manifest samples per shard
  StorageDtype dtype = StorageDtype::kFloat16;
  int chunk_rows = 256;            // HDF5 chunk height for embedding datasets
  bool overwrite = false;          // start over: remove an earlier run's files in `path`
  bool retry_failed = false;       // resume, and also redo the samples that failed before
};

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

struct RunSection {
  std::vector<std::string> devices = {"cpu"};  // default device(s) of every encoder
  int decode_threads = 0;          // concurrent decodes; 0: one per core
  int torch_threads = 0;           // LibTorch intra-op threads on CPU; 0: one per core
  int max_in_flight = 0;           // samples between source and writer; 0: automatic
  int64_t max_failures = -1;       // failed samples allowed before exit code 3; -1: no limit
  double max_failure_fraction = -1.0;  // same as a fraction of all samples; -1: no limit
  double progress_interval_s = 2.0;    // seconds between progress lines; 0: none
  std::string log_level = "info";
  // Note [Limits are not semantic]: the limits below (and the modalities' max_* caps) decide
  // whether a sample is attempted, never how an embedding is computed, so they may change
  // between a run and its resume.
  double sample_timeout_s = 600.0;  // a sample's decode time limit (category timeout)
  int64_t max_file_bytes = 64LL << 30;  // larger media files fail with category too_large
  MemoryBudget gpu_memory_budget;  // per GPU (Note [Memory budgets] in pipeline/memory_budget.cpp)
  int64_t host_memory_budget = 0;  // bytes of decoded samples held in the pipeline; 0: automatic
  bool supervise = true;           // run the job in a child process restarted after a crash
  int max_restarts = 5;            // restarts after crashes before the run gives up
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

// Flags of `precompute run` that override the file. Unset fields leave the file's value.
struct ConfigOverrides {
  std::optional<std::filesystem::path> input;   // a manifest file or a folder
  std::optional<std::filesystem::path> output;
  std::optional<std::string> device;            // every encoder
  std::optional<int> batch_size;                // every encoder
  std::optional<int64_t> shard_size;
  std::optional<std::string> max_failures;      // "10" or "2.5%"
  std::optional<int> decode_threads;
  std::optional<int> torch_threads;
  std::optional<std::string> log_level;
  bool overwrite = false;
  bool retry_failed = false;
  bool no_supervisor = false;
  std::optional<std::string> gpu_memory_budget;
  std::optional<std::string> host_memory_budget;
};

// Reads a YAML config file. Relative paths in it resolve against its folder. Throws ConfigError
// naming the key and the fix for unknown keys, wrong types and bad values.
Config load_config(const std::filesystem::path& file);
// Same, from YAML text; relative paths resolve against `base_dir`.
Config parse_config(const std::string& yaml_text, const std::filesystem::path& base_dir);

// Applies command-line overrides (relative paths resolve against the working directory).
void apply_overrides(Config& config, const ConfigOverrides& overrides);

// Checks the whole config for consistency, and every number against its range (Note [Config
// bounds] in config.cpp); throws ConfigError naming the key, the range and the value. Called
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
