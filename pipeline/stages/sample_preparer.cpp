#include "pipeline/stages/sample_preparer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "encoders/bert/text_settings.hpp"
#include "encoders/text/unigram_tokenizer.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/media/audio_decoder.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/stages/video_decoder_scheduler.hpp"

namespace precompute {

struct SamplePreparer::State {
  bool video = false;
  bool audio = false;
  bool text = false;
  // Which backend decodes each video file; null without video. Thread-safe.
  std::unique_ptr<VideoDecoderScheduler> video_decoders;
  AudioDecodeOptions audio_options;
  int64_t max_text_bytes = 0;
  std::shared_ptr<const TextTokenizer> tokenizer;
  std::string prefix;  // text.prefix, put before every caption (Note [Caption prefixes])
  size_t prefix_tokens = 0;  // the tokens of the prefix alone
  std::string tokenizer_settings;  // what decides its pieces, for messages
};

SamplePreparer::SamplePreparer(const Config& config, RunStats& stats) : stats_(&stats) {
  auto state = std::make_shared<State>();
  state->video = config.video.enabled;
  state->audio = config.audio.enabled;
  state->text = config.text.enabled;
  if (state->video) {
    state->video_decoders = std::make_unique<VideoDecoderScheduler>(
        config, video_decode_options(config.video, config.run), stats);
  }
  if (state->audio) state->audio_options = audio_decode_options(config.audio, config.run);
  if (state->text) {
    state->max_text_bytes = config.text.max_text_bytes;
    state->tokenizer = make_text_tokenizer(config.text);
    state->prefix = config.text.prefix;
    if (!state->prefix.empty()) {
      const TokenizedText alone = state->tokenizer->encode(state->prefix);
      state->prefix_tokens = alone.ids.size() - 2;
      const auto max_length = static_cast<size_t>(state->tokenizer->max_length());
      PC_CHECK(!alone.truncated && alone.ids.size() + 1 <= max_length, ConfigError, "config key 'text.prefix' takes ", state->prefix_tokens,
               " tokens, which leaves no room for the caption within text.tokenizer.max_length ",
               state->tokenizer->max_length());
    }
    if (dynamic_cast<const UnigramTokenizer*>(state->tokenizer.get()) != nullptr) {
      state->tokenizer_settings = fmt::format(
          "the SentencePiece vocabulary of {}; a multilingual model's vocabulary covers most "
          "scripts, so check that text.encoder.path is the model meant for these captions",
          config.text.encoder.path.string());
    } else {
      state->tokenizer_settings = fmt::format(
          "text.tokenizer.lower_case {}, text.tokenizer.vocab {}; check text.tokenizer.lower_case "
          "and text.tokenizer.vocab",
          tokenizer_options(config.text).lower_case,
          config.text.vocab.empty() ? "from the model folder " + config.text.encoder.path.string()
                                    : config.text.vocab.string());
    }
  }
  state_ = std::move(state);
}

int SamplePreparer::nvdec_sessions() const {
  const State& s = *state_;
  return s.video_decoders ? s.video_decoders->nvdec_sessions() : 0;
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
               "({}) (`precompute tokenize --config FILE TEXT` shows a caption's tokens)",
               100.0 * static_cast<double>(unknown) / static_cast<double>(tokens), unknown,
               tokens, state_->tokenizer_settings);
}

int SamplePreparer::decode_threads_beside_the_cpu() const {
  const State& s = *state_;
  return s.video_decoders ? s.video_decoders->decode_threads_beside_the_cpu() : 0;
}

std::string SamplePreparer::video_decoders() const {
  const State& s = *state_;
  return s.video_decoders ? s.video_decoders->describe() : std::string();
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
    decode(Modality::kVideo, [&] { out->video = s.video_decoders->decode(*spec.video); });
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
      auto tokens = s.prefix.empty() ? s.tokenizer->encode(*spec.text, &invalid_bytes)
                                     : s.tokenizer->encode(s.prefix + *spec.text, &invalid_bytes);
      if (invalid_bytes > 0) {
        stats_->invalid_utf8_texts.fetch_add(1, std::memory_order_relaxed);
        spdlog::debug("sample '{}': {} invalid UTF-8 byte(s) in the caption were replaced",
                      spec.id, invalid_bytes);
      }
      PC_MEDIA_CHECK(tokens.ids.size() > 2 + s.prefix_tokens, FailureCategory::kBadText,
                     "sample '", spec.id,
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
