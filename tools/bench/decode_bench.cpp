// decode_bench: how fast the video decoders alone go, without the graph, the encoders or
// LibTorch. N threads take files from a shared list (the files given, --repeat times over) and
// run decode_video on each, on the CPU or each on an NVDEC session of its own; one JSON line
// reports clips/s, decoded frames/s and where the clips were decoded. For issue 10's "decoded
// frames/s of each decoder alone", and to look at NVDEC without LibTorch in the process
// (tools/bench/run_gpu_video_bench.sh, stage "decode").
//
//   decode_bench --decoder cpu --threads 16 --num-frames 4 --repeat 20 bench-data/h264_720p/*.mp4
//   decode_bench --decoder nvdec --threads 4 --device 0 --fps 1 bench-data/h264_720p/*.mp4
//
// --mode picks what runs per file: `full` (default) is decode_video, precompute's path with
// seeking, frame dropping and the conversion to RGB; `plain` decodes every frame with the same
// decoder set-up and nothing else; `cuvid` (NVDEC only) decodes every frame with FFmpeg's
// *_cuvid decoders, NVIDIA's parser inside FFmpeg. plain and cuvid also report the seconds spent
// opening, decoding and closing, summed over the threads: where NVDEC's time goes. --no-keep
// gives every file a decoder of its own (Note [Keeping NVDEC decoders across files]);
// --own-contexts a CUDA context to every session, as before Note [One CUDA context for a GPU's
// sessions]; --primary-context the device's primary context for all of them, where LibTorch's
// encoders compute (video.nvdec_own_context: false). The in_*
// figures are the seconds inside FFmpeg's read, send, receive and seek calls and the conversion,
// summed over the threads (ffmpeg::DecodeTimes).

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

#include "pipeline/core/error.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/media/cpu_decoder_backend.hpp"
#include "pipeline/media/ffmpeg_common.hpp"
#include "pipeline/media/nvdec.hpp"
#include "pipeline/media/nvdec_decoder_backend.hpp"
#include "pipeline/media/video_decoder.hpp"
#include "tools/bench/bench_args.hpp"

namespace {

struct Args {
  std::string decoder = "cpu";
  std::string mode = "full";
  int threads = 1;
  int device = 0;
  double fps = 0.0;
  int num_frames = 0;
  int size = 224;
  int repeat = 1;
  bool seek = true;
  bool keep = true;
  bool own_contexts = false;
  bool primary_context = false;
  std::string drop_frames = "auto";
  std::vector<std::filesystem::path> files;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "decode_bench: %s\nusage: decode_bench [--decoder cpu|nvdec] [--threads N] "
               "[--device D] (--fps X | --num-frames N) [--size S] [--repeat R] [--no-seek] "
               "[--mode full|plain|cuvid] [--no-keep] [--own-contexts | --primary-context] "
               "[--drop-frames auto|on|off] "
               "FILE...\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (precompute::BenchArgs args(argc, argv, usage); args.next();) {
    if (args.is("--decoder")) {
      a.decoder = args.text();
    } else if (args.is("--mode")) {
      a.mode = args.text();
    } else if (args.is("--threads")) {
      a.threads = args.number<int>();
    } else if (args.is("--device")) {
      a.device = args.number<int>();
    } else if (args.is("--fps")) {
      a.fps = args.number<double>();
    } else if (args.is("--num-frames")) {
      a.num_frames = args.number<int>();
    } else if (args.is("--size")) {
      a.size = args.number<int>();
    } else if (args.is("--repeat")) {
      a.repeat = args.number<int>();
    } else if (args.is("--no-keep")) {
      a.keep = false;
    } else if (args.is("--no-seek")) {
      a.seek = false;
    } else if (args.is("--drop-frames")) {
      a.drop_frames = args.text();
    } else if (args.is("--own-contexts")) {
      a.own_contexts = true;
    } else if (args.is("--primary-context")) {
      a.primary_context = true;
    } else if (args.is_option()) {
      usage("unknown option " + args.arg());
    } else {
      a.files.emplace_back(args.arg());
    }
  }
  if (a.decoder != "cpu" && a.decoder != "nvdec") usage("--decoder is cpu or nvdec");
  if (a.mode != "full" && a.mode != "plain" && a.mode != "cuvid") {
    usage("--mode is full, plain or cuvid");
  }
  if (a.drop_frames != "auto" && a.drop_frames != "on" && a.drop_frames != "off") {
    usage("--drop-frames is auto, on or off");
  }
  if (a.mode == "cuvid" && a.decoder != "nvdec") usage("--mode cuvid needs --decoder nvdec");
  if ((a.fps > 0) == (a.num_frames > 0)) usage("give exactly one of --fps and --num-frames");
  // The config's bounds for video.sampling (pipeline/core/config.cpp); inf and NaN fail too.
  if (a.fps > 0 && !(a.fps >= 0.001 && a.fps <= 1000)) usage("--fps is 0.001 to 1000");
  if (a.num_frames > 100000) usage("--num-frames is 1 to 100000");
  if (a.threads < 1 || a.threads > 256) usage("--threads is 1 to 256");
  if (a.repeat < 1 || a.size < 8 || a.size > 4096 || a.device < 0) {
    usage("--repeat is at least 1, --size 8 to 4096, --device at least 0");
  }
  if (a.files.empty()) usage("no files");
  return a;
}

using Clock = std::chrono::steady_clock;
using precompute::seconds_since;

// Seconds of one file's phases, for plain and cuvid.
struct Phases {
  double open = 0.0;
  double decode = 0.0;
  double close = 0.0;
};

// Every frame of `file`, decoded and dropped: `plain` through precompute's decoder set-up
// (ffmpeg::open_decoder, NVDEC as FFmpeg's hwaccel when `hw_device` is given), `cuvid` through
// FFmpeg's *_cuvid decoder. Returns the frames decoded.
int64_t decode_every_frame(const std::filesystem::path& file, const std::string& mode,
                           AVBufferRef* hw_device, Phases& phases) {
  namespace ff = precompute::ffmpeg;
  auto t = Clock::now();
  const ff::Deadline deadline(600.0);
  ff::InputFile input = ff::open_input(file, ff::InputLimits{int64_t{1} << 40, int64_t{1} << 26},
                                       deadline);
  const AVStream* stream = ff::find_stream(input.format(), AVMEDIA_TYPE_VIDEO, file);
  ff::CodecContextPtr codec;
  if (mode == "plain") {
    codec = ff::open_decoder(stream, 1, int64_t{1} << 26, file, hw_device);
  } else {
    const std::string name = std::string(avcodec_get_name(stream->codecpar->codec_id)) + "_cuvid";
    const AVCodec* decoder = avcodec_find_decoder_by_name(name.c_str());
    if (decoder == nullptr) throw std::runtime_error("this FFmpeg has no " + name);
    codec.reset(avcodec_alloc_context3(decoder));
    if (!codec) throw std::bad_alloc();
    if (avcodec_parameters_to_context(codec.get(), stream->codecpar) < 0 ||
        (codec->hw_device_ctx = av_buffer_ref(hw_device)) == nullptr) {
      throw std::runtime_error("cannot set up " + name);
    }
    codec->pkt_timebase = stream->time_base;
    const int opened = avcodec_open2(codec.get(), decoder, nullptr);
    if (opened < 0) throw std::runtime_error(name + ": " + ff::error_text(opened));
  }
  phases.open += seconds_since(t);
  t = Clock::now();
  const int64_t frames = ff::decode_stream(input.format(), stream, codec.get(),
                                           [](AVFrame*) { return true; }, deadline, file);
  phases.decode += seconds_since(t);
  t = Clock::now();
  codec.reset();
  phases.close += seconds_since(t);
  return frames;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  precompute::VideoDecodeOptions options;
  options.fps = args.fps;
  options.num_frames = args.num_frames;
  options.height = args.size;
  options.width = args.size;
  options.seek = args.seek;
  using Dropping = precompute::VideoDecodeOptions::FrameDropping;
  options.drop_frames = args.drop_frames == "on"    ? Dropping::kOn
                        : args.drop_frames == "off" ? Dropping::kOff
                                                    : Dropping::kAuto;

  // Sessions first, outside the clock, as precompute makes them at start-up: in one context,
  // as precompute's (one made for them, or with --primary-context the device's primary one), or
  // each in its own with --own-contexts (as before Note [One CUDA context for a GPU's
  // sessions]); the seconds that took go in the line as open_sessions_s.
  std::vector<std::unique_ptr<precompute::NvdecSession>> sessions;
  double open_sessions_s = 0.0;
  if (args.decoder == "nvdec") {
    const auto opening = Clock::now();
    AVBufferRef* shared = nullptr;
    try {
      if (!args.own_contexts) {
        shared = precompute::open_nvdec_context(args.device,
                                                args.primary_context
                                                    ? precompute::NvdecContext::kPrimary
                                                    : precompute::NvdecContext::kOwn);
      }
      for (int t = 0; t < args.threads; ++t) {
        sessions.push_back(
            std::make_unique<precompute::NvdecSession>(args.device, args.keep, shared));
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "decode_bench: %s\n", e.what());
      av_buffer_unref(&shared);
      return 1;
    }
    av_buffer_unref(&shared);  // the sessions hold it
    open_sessions_s = precompute::seconds_since(opening);
  }

  const int64_t total = static_cast<int64_t>(args.files.size()) * args.repeat;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> decoded{0};
  std::atomic<int64_t> kept{0};
  std::atomic<int64_t> on_nvdec{0};
  std::atomic<int64_t> failed{0};
  std::vector<Phases> phases(static_cast<size_t>(args.threads));
  std::vector<precompute::ffmpeg::DecodeTimes> times(static_cast<size_t>(args.threads));
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < args.threads; ++t) {
    threads.emplace_back([&, t] {
      precompute::NvdecSession* session =
          sessions.empty() ? nullptr : sessions[static_cast<size_t>(t)].get();
      for (int64_t i = next++; i < total; i = next++) {
        const auto& file =
            args.files[static_cast<size_t>(i % static_cast<int64_t>(args.files.size()))];
        try {
          if (args.mode != "full") {
            decoded += decode_every_frame(file, args.mode,
                                          session != nullptr ? session->hw_device() : nullptr,
                                          phases[static_cast<size_t>(t)]);
            continue;
          }
          // A backend per file, as the run's scheduler makes them (the session keeps its
          // decoder across files).
          precompute::CpuDecoderBackend cpu;
          precompute::NvdecDecoderBackend nvdec(session, nullptr);
          precompute::VideoDecoderBackend& backend =
              session != nullptr ? static_cast<precompute::VideoDecoderBackend&>(nvdec) : cpu;
          const precompute::VideoFrames frames = precompute::decode_video(file, options, backend);
          decoded += frames.decoded_frames;
          kept += frames.num_frames;
          if (frames.nvdec) ++on_nvdec;
        } catch (const std::exception& e) {
          if (failed++ == 0) std::fprintf(stderr, "decode_bench: %s\n", e.what());
        }
      }
      times[static_cast<size_t>(t)] = precompute::ffmpeg::thread_decode_times();
    });
  }
  for (auto& thread : threads) thread.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  Phases sum;
  for (const Phases& p : phases) {
    sum.open += p.open;
    sum.decode += p.decode;
    sum.close += p.close;
  }
  precompute::ffmpeg::DecodeTimes in;
  for (const auto& t : times) {
    in.read += t.read;
    in.send += t.send;
    in.receive += t.receive;
    in.seek += t.seek;
    in.convert += t.convert;
  }
  std::printf(
      "{\"mode\": \"%s\", \"open_s\": %.3f, \"decode_s\": %.3f, \"close_s\": %.3f, "
      "\"in_read_s\": %.3f, \"in_send_s\": %.3f, \"in_receive_s\": %.3f, \"in_seek_s\": %.3f, "
      "\"in_convert_s\": %.3f, "
      "\"decoder\": \"%s\", \"threads\": %d, \"seek\": %s, \"clips\": %lld, \"failed\": %lld, "
      "\"on_nvdec\": %lld, \"seconds\": %.3f, \"clips_per_s\": %.2f, \"decoded_frames\": %lld, "
      "\"decoded_frames_per_s\": %.0f, \"kept_frames\": %lld, \"own_contexts\": %s, "
      "\"primary_context\": %s, \"open_sessions_s\": %.3f, \"drop_frames\": \"%s\"}\n",
      args.mode.c_str(), sum.open, sum.decode, sum.close, in.read, in.send, in.receive, in.seek,
      in.convert, args.decoder.c_str(), args.threads,
      args.seek ? "true" : "false",
      static_cast<long long>(total), static_cast<long long>(failed.load()),
      static_cast<long long>(on_nvdec.load()), seconds, static_cast<double>(total) / seconds,
      static_cast<long long>(decoded.load()), static_cast<double>(decoded.load()) / seconds,
      static_cast<long long>(kept.load()), args.own_contexts ? "true" : "false",
      args.primary_context ? "true" : "false", open_sessions_s,
      args.drop_frames.c_str());
  return failed.load() > 0 ? 1 : 0;
}
