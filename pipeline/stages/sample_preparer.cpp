#include "pipeline/stages/sample_preparer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "encoders/bert/text_settings.hpp"
#include "encoders/text/wordpiece_tokenizer.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/low_priority_threads.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/media/audio_decoder.hpp"
#include "pipeline/media/nvdec.hpp"
#include "pipeline/media/video_decoder.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/stages/nvdec_handover.hpp"

namespace precompute {

struct SamplePreparer::State {
  bool video = false;
  bool audio = false;
  bool text = false;
  VideoDecodeOptions video_options;
  VideoDecoderKind decoder = VideoDecoderKind::kCpu;  // kCpu when no NVDEC pool could be had
  std::shared_ptr<NvdecPool> nvdec;
  // NVDEC's seconds per file, for handing CPU files over (Note [Handing a file over to NVDEC]
  // in nvdec_handover.cpp). Mutable state in a const State: it is thread-safe.
  mutable NvdecPace nvdec_pace;
  // Where CPU decodes run while NVDEC sessions decode beside them (Note [CPU decoders at a lower
  // priority]); null without sessions.
  std::unique_ptr<LowPriorityThreads> cpu_decode_threads;
  AudioDecodeOptions audio_options;
  int64_t max_text_bytes = 0;
  std::optional<WordPieceTokenizer> tokenizer;
  std::string tokenizer_settings;  // its lower_case and vocabulary, for messages
};

SamplePreparer::SamplePreparer(const Config& config, RunStats& stats) : stats_(&stats) {
  auto state = std::make_shared<State>();
  state->video = config.video.enabled;
  state->audio = config.audio.enabled;
  state->text = config.text.enabled;
  if (state->video) {
    state->video_options = video_decode_options(config.video, config.run);
    open_nvdec(config, *state);
  }
  if (state->audio) state->audio_options = audio_decode_options(config.audio, config.run);
  if (state->text) {
    state->max_text_bytes = config.text.max_text_bytes;
    state->tokenizer = make_text_tokenizer(config.text);
    state->tokenizer_settings = fmt::format(
        "text.tokenizer.lower_case {}, text.tokenizer.vocab {}",
        tokenizer_options(config.text).lower_case,
        config.text.vocab.empty() ? "from the model folder " + config.text.encoder.path.string()
                                  : config.text.vocab.string());
  }
  state_ = std::move(state);
}

namespace {

// Note [CPU decoders at a lower priority].
constexpr int kCpuDecodeNiceIncrement = 10;

// The CUDA ordinals among video's devices, each once.
std::vector<int> cuda_devices(const std::vector<std::string>& devices) {
  std::vector<int> ordinals;
  for (const auto& d : devices) {
    if (const auto ordinal = cuda_ordinal(d)) ordinals.push_back(*ordinal);
  }
  std::sort(ordinals.begin(), ordinals.end());
  ordinals.erase(std::unique(ordinals.begin(), ordinals.end()), ordinals.end());
  return ordinals;
}

}  // namespace

// Note [Choosing the video decoder]
// video.decoder: auto opens NVDEC sessions on the GPUs video runs on, when the build has CUDA
// and video has a GPU; the decode threads then take a free session for each file and decode on
// the CPU when none is free, so both kinds stay busy. A thread on NVDEC mostly waits for the
// GPU, so auto adds a decode thread per session to the one per core (unless
// run.decode_threads says otherwise): the cores keep decoding at full strength beside the
// engines. When files stop coming, auto hands a CPU file over to a session gone idle if that is
// faster (Note [Handing a file over to NVDEC] in nvdec_handover.cpp). Without a build or GPU
// for it, auto is the CPU, said once at start-up. nvdec waits for a session for every file, and
// refuses to start without them. Either way a file NVDEC fails on (a stream it cannot take, a
// decode error) is decoded again on the CPU and counted.
void SamplePreparer::open_nvdec(const Config& config, State& state) {
  const VideoDecoderKind wanted = config.video.decoder;
  if (wanted == VideoDecoderKind::kCpu) return;
  const std::vector<int> gpus = cuda_devices(config.devices_for(Modality::kVideo));
  std::string why_not;
  if (!nvdec_built()) {
    why_not = "this build of precompute has no CUDA";
  } else if (gpus.empty()) {
    why_not = "video runs on no CUDA device (video.device or run.device)";
  } else {
    try {
      state.nvdec = std::make_shared<NvdecPool>(gpus, config.video.nvdec_sessions);
      state.cpu_decode_threads = std::make_unique<LowPriorityThreads>(kCpuDecodeNiceIncrement);
      state.decoder = wanted;
      spdlog::info("video decoding: {}{}", state.nvdec->describe(),
                   wanted == VideoDecoderKind::kAuto ? " and the CPU decoders" : "");
      return;
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  PC_CHECK(wanted != VideoDecoderKind::kNvdec, ConfigError, "video.decoder: nvdec, but ", why_not,
           "; use video.decoder: auto (NVDEC where it can) or cpu");
  spdlog::info("video decoding: on the CPU ({})", why_not);
}

// Note [CPU decoders at a lower priority]
// With NVDEC sessions open, CPU decodes run on threads of their own at a nice value 10 above
// the process's (LowPriorityThreads), the thread that took the file waiting for them. A file on
// NVDEC costs the cores little (a tenth of a CPU decode's time), but its thread must run the
// moment the engine hands back a picture or the engine waits for its next one; at the same
// priority, the busy CPU decoders delay it. With the CPU decoders at nice 10 the engines get
// back most of what the CPU decoders took from them, and the CPU decoders lose nothing (the
// decoders alone: 81 clips/s together at the same priority, 88 at nice 10); nice 19 gives the
// engines no more and takes from the CPU (docs/benchmarks.md, "CPU decoders at a lower
// priority", which also has the whole job, where the gain is within the noise). Linux cannot
// raise a thread's priority back without privilege, hence threads kept for this rather than the
// graph's own threads lowered and raised per file.
VideoFrames SamplePreparer::decode_video_on(const std::filesystem::path& file) const {
  const State& s = *state_;
  if (!s.nvdec) {
    const StageTimer on_cpu(stats_->video_cpu_decode_ns);
    return decode_video(file, s.video_options);
  }
  const auto on_cpu_threads = [&](const VideoDecodeOptions& options) {
    const StageTimer on_cpu(stats_->video_cpu_decode_ns);
    return s.cpu_decode_threads->run([&] { return decode_video(file, options); });
  };
  NvdecPool::Lease lease =
      s.decoder == VideoDecoderKind::kNvdec ? s.nvdec->acquire() : s.nvdec->try_acquire();
  double seconds_left = s.video_options.timeout_s;  // of the file's time limit
  if (!lease) {
    // auto, every session busy: the CPU, until a session goes idle and is worth it (Note
    // [Handing a file over to NVDEC] in nvdec_handover.cpp).
    VideoDecodeOptions options = s.video_options;
    const auto started = std::chrono::steady_clock::now();
    options.give_up = [&](double done, double duration_s) {
      if (!s.nvdec->any_free()) return false;
      const auto nvdec_s = s.nvdec_pace.expected_seconds(duration_s);
      if (!nvdec_s) return false;
      if (!worth_handing_over(seconds_since(started), done, *nvdec_s)) return false;
      lease = s.nvdec->try_acquire_idle(kNvdecIdleBeforeHandover);
      return static_cast<bool>(lease);
    };
    try {
      return on_cpu_threads(options);
    } catch (const DecodeGivenUp& given_up) {
      seconds_left = given_up.seconds_left();
      stats_->video_nvdec_handovers.fetch_add(1, std::memory_order_relaxed);
      stats_->video_decoded_frames.fetch_add(given_up.decoded_frames(), std::memory_order_relaxed);
      spdlog::debug("{}: handed over to a free NVDEC session after {} frame(s) on the CPU",
                    file.string(), given_up.decoded_frames());
    }
  }
  VideoDecodeOptions options = s.video_options;
  options.nvdec = lease.session();
  options.timeout_s = std::max(1e-3, seconds_left);  // a file handed over keeps what is left
  try {
    const StageTimer on_nvdec(stats_->video_nvdec_ns);
    const auto started = std::chrono::steady_clock::now();
    VideoFrames frames = decode_video(file, options);
    // Frames, but none from NVDEC: FFmpeg could not set the engine up for this stream and the
    // same call decoded it on the CPU.
    if (!frames.nvdec) {
      stats_->video_nvdec_fallbacks.fetch_add(1, std::memory_order_relaxed);
    } else {
      s.nvdec_pace.add(seconds_since(started), frames.duration_s);
    }
    return frames;
  } catch (const MediaError& e) {
    // Limits (too long, too large, timeout) hold on every decoder; the rest may be NVDEC's.
    if (e.category() != FailureCategory::kDecodeError &&
        e.category() != FailureCategory::kUnsupported) {
      throw;
    }
    spdlog::debug("{}: NVDEC failed ({}); decoding on the CPU", file.string(), e.what());
  }
  lease = {};  // free for another file while this one decodes on the CPU
  stats_->video_nvdec_fallbacks.fetch_add(1, std::memory_order_relaxed);
  VideoDecodeOptions on_cpu = s.video_options;
  on_cpu.timeout_s = options.timeout_s;
  return on_cpu_threads(on_cpu);
}

int SamplePreparer::nvdec_sessions() const {
  const State& s = *state_;
  return s.video && s.nvdec ? s.nvdec->size() : 0;
}

// Note [Unknown tokens]
// WordPiece maps a word it cannot spell from its vocabulary to [UNK]. A few are normal (a rare
// symbol, an emoji); many mean that the captions and the vocabulary do not belong together: an
// uncased vocabulary given captions in capitals with lower_case false, another language's
// vocabulary, a vocab file of another model. Nothing fails then, and the vectors say little, so
// the run says so once, after the graph, when more than 5% of the caption tokens it made ([CLS]
// and [SEP] aside) were [UNK], with the share and the settings to check.
constexpr double kUnknownTokenShare = 0.05;

void SamplePreparer::warn_about_unknown_tokens() const {
  const int64_t tokens = stats_->text_tokens.load();
  const int64_t unknown = stats_->text_unknown_tokens.load();
  if (tokens == 0 || static_cast<double>(unknown) <= kUnknownTokenShare * tokens) return;
  spdlog::warn("text: {:.1f}% of the caption tokens ({} of {}) are [UNK], words the vocabulary "
               "cannot spell: the vocabulary or the lower-casing does not fit these captions "
               "({}); check text.tokenizer.lower_case and text.tokenizer.vocab (`precompute "
               "tokenize --config FILE TEXT` shows a caption's tokens)",
               100.0 * static_cast<double>(unknown) / static_cast<double>(tokens), unknown,
               tokens, state_->tokenizer_settings);
}

int SamplePreparer::decode_threads_beside_the_cpu() const {
  return state_->decoder == VideoDecoderKind::kAuto ? nvdec_sessions() : 0;
}

std::string SamplePreparer::video_decoders() const {
  const State& s = *state_;
  if (!s.video || !s.nvdec) return {};
  return s.decoder == VideoDecoderKind::kAuto ? s.nvdec->describe() + " and CPU"
                                              : s.nvdec->describe();
}

namespace {

FailureRecord failure(const SampleSpec& spec, Modality m, FailureCategory category,
                      std::string message) {
  return FailureRecord{spec.seq, spec.id, m, category, std::move(message)};
}

// Runs one modality's preparation; any error becomes a failure record of that modality.
template <class Fn>
void prepare_one(const SampleSpec& spec, Modality m, PreparedSample& out, Fn&& fn) {
  try {
    fn();
  } catch (const MediaError& e) {
    out.failures.push_back(failure(spec, m, e.category(), e.what()));
  } catch (const std::bad_alloc&) {
    out.failures.push_back(failure(spec, m, FailureCategory::kTooLarge,
                                   "out of host memory while preparing this sample"));
  } catch (const InternalError&) {
    throw;  // a bug: stop the run rather than hide it in a record
  } catch (const std::exception& e) {
    out.failures.push_back(failure(spec, m, FailureCategory::kDecodeError, e.what()));
  }
}

bool has_configured_input(const SampleSpec& spec, bool video, bool audio, bool text) {
  return (video && gives_input(spec, Modality::kVideo)) ||
         (audio && gives_input(spec, Modality::kAudio)) ||
         (text && gives_input(spec, Modality::kText));
}

// What the line gives, for the no_input message.
std::string given_inputs(const SampleSpec& spec) {
  std::string given;
  const auto add = [&](bool has, const char* name) {
    if (has) given += (given.empty() ? "" : " and ") + std::string(name);
  };
  add(spec.video.has_value(), "video");
  add(spec.audio.has_value(), "audio");
  add(spec.text.has_value(), "text");
  return given.empty() ? "nothing" : "only " + given;
}

}  // namespace

bool sample_has_configured_input(const SampleSpec& spec, const Config& config) {
  return has_configured_input(spec, config.video.enabled, config.audio.enabled,
                              config.text.enabled);
}

PreparedSamplePtr SamplePreparer::operator()(const SampleSpec& spec,
                                             const SkippedMedia* skipped) const {
  const State& s = *state_;
  auto out = std::make_shared<PreparedSample>();
  out->seq = spec.seq;
  out->order = spec.order;
  out->id = spec.id;
  if (!has_configured_input(spec, s.video, s.audio, s.text)) {
    for (Modality m : kAllModalities) {
      const bool configured = m == Modality::kVideo   ? s.video
                              : m == Modality::kAudio ? s.audio
                                                      : s.text;
      if (!configured) continue;
      out->failures.push_back(failure(
          spec, m, FailureCategory::kNoInput,
          fmt::format("sample '{}' has no {} input (the line gives {}); add '{}' to the line, or "
                      "a section for what it has to the config",
                      spec.id, modality_name(m), given_inputs(spec), modality_name(m))));
    }
  }
  // A media modality's decode, or its record when the sample's media are skipped.
  const auto decode = [&](Modality m, auto&& fn) {
    if (skipped != nullptr) {
      out->failures.push_back(failure(spec, m, skipped->category, skipped->message));
    } else {
      prepare_one(spec, m, *out, fn);
    }
  };
  if (s.video && spec.video) {
    decode(Modality::kVideo, [&] { out->video = decode_video_on(*spec.video); });
    if (out->video) {
      const auto relaxed = std::memory_order_relaxed;
      if (out->video->nvdec) {
        stats_->video_nvdec_clips.fetch_add(1, relaxed);
        stats_->video_nvdec_decoded_frames.fetch_add(out->video->decoded_frames, relaxed);
      }
      stats_->video_clips.fetch_add(1, relaxed);
      stats_->video_decoded_frames.fetch_add(out->video->decoded_frames, relaxed);
      stats_->video_kept_frames.fetch_add(out->video->num_frames, relaxed);
      stats_->video_seeks.fetch_add(out->video->seeks, relaxed);
      stats_->video_seeks_undone.fetch_add(out->video->seeks_undone, relaxed);
    }
  }
  // A sample without its own audio file uses its video's audio track.
  const auto& audio_path = spec.audio ? spec.audio : spec.video;
  if (s.audio && audio_path) {
    decode(Modality::kAudio, [&] { out->audio = decode_audio(*audio_path, s.audio_options); });
  }
  if (s.text && spec.text) {
    prepare_one(spec, Modality::kText, *out, [&] {
      // Checked before tokenising: the tokenizer's work and memory grow with the caption.
      PC_MEDIA_CHECK(static_cast<int64_t>(spec.text->size()) <= s.max_text_bytes,
                     FailureCategory::kTooLarge, "sample '", spec.id, "': the caption is ",
                     spec.text->size(), " bytes, over the limit of ", s.max_text_bytes,
                     " bytes (text.max_text_bytes)");
      PC_MEDIA_CHECK(spec.text->find_first_not_of(" \t\r\n\v\f") != std::string::npos,
                     FailureCategory::kBadText, "sample '", spec.id,
                     "': the caption is empty; give it text or leave 'text' out");
      int64_t invalid_bytes = 0;
      auto tokens = s.tokenizer->encode(*spec.text, &invalid_bytes);
      if (invalid_bytes > 0) {
        stats_->invalid_utf8_texts.fetch_add(1, std::memory_order_relaxed);
        spdlog::debug("sample '{}': {} invalid UTF-8 byte(s) in the caption were replaced",
                      spec.id, invalid_bytes);
      }
      PC_MEDIA_CHECK(tokens.ids.size() > 2, FailureCategory::kBadText, "sample '", spec.id,
                     "': the caption has no tokens after clean-up (only control or invalid "
                     "characters)");
      const auto unknown = std::count(tokens.ids.begin() + 1, tokens.ids.end() - 1,
                                      s.tokenizer->unk_id());
      stats_->text_tokens.fetch_add(static_cast<int64_t>(tokens.ids.size()) - 2,
                                    std::memory_order_relaxed);
      stats_->text_unknown_tokens.fetch_add(unknown, std::memory_order_relaxed);
      out->text = std::move(tokens);
    });
  }
  stats_->prepared.fetch_add(1, std::memory_order_relaxed);
  return out;
}

}  // namespace precompute
