#pragma once
// Counters the stages bump as samples move, read by the progress reporter and the final
// summary. Every field is an atomic or an OverlapClock: any thread may update or read at any
// time.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "pipeline/core/modality.hpp"
#include "pipeline/core/overlap_clock.hpp"

namespace precompute {

struct RunStats {
  std::atomic<int64_t> total{0};           // samples in the input
  std::atomic<int64_t> submitted{0};       // sent by the source into the graph
  std::atomic<int64_t> prepared{0};        // decoded and tokenised
  std::atomic<int64_t> routed{0};          // past the sequencer, in a batcher or beyond
  std::atomic<int64_t> completed{0};       // every modality embedded or failed
  std::atomic<int64_t> failed_samples{0};  // samples with at least one failure record
  std::atomic<int64_t> failure_records{0};
  std::atomic<int64_t> shards_written{0};
  std::atomic<int64_t> bytes_written{0};
  std::atomic<int64_t> invalid_utf8_texts{0};
  // Caption tokens ([CLS] and [SEP] aside), and those the vocabulary could not map ([UNK]): a
  // large share means a wrong vocabulary or case (Note [Unknown tokens] in
  // pipeline/stages/sample_preparer.cpp).
  std::atomic<int64_t> text_tokens{0};
  std::atomic<int64_t> text_unknown_tokens{0};
  std::atomic<int64_t> batch_retries{0};   // failed batches retried sample by sample
  std::atomic<int64_t> oom_splits{0};      // batches split in two after running out of memory
  // Video decoding work (Note [Seeking to what is sampled] in pipeline/media/video_decoder.cpp).
  std::atomic<int64_t> video_clips{0};           // clips decoded
  std::atomic<int64_t> video_decoded_frames{0};  // frames out of the decoders
  std::atomic<int64_t> video_kept_frames{0};     // frames sampled from them
  std::atomic<int64_t> video_seeks{0};
  std::atomic<int64_t> video_seeks_undone{0};
  std::atomic<int64_t> video_nvdec_clips{0};      // of video_clips, decoded on NVDEC
  std::atomic<int64_t> video_nvdec_fallbacks{0};  // given to NVDEC, decoded on the CPU instead
  std::atomic<int64_t> video_nvdec_handovers{0};  // started on the CPU, restarted on NVDEC
  std::atomic<int64_t> video_nvdec_decoded_frames{0};  // of video_decoded_frames, on NVDEC
  std::array<std::atomic<int64_t>, kNumModalities> embedded{};        // per modality
  std::array<std::atomic<int64_t>, kNumModalities> batches_queued{};  // sent to an encoder
  std::array<std::atomic<int64_t>, kNumModalities> batches_done{};
  std::array<std::atomic<int64_t>, 16> failures_by_category{};  // by FailureCategory value
  // The same records per modality (the summary and metrics files, pipeline/summary_file.hpp).
  std::array<std::array<std::atomic<int64_t>, 16>, kNumModalities> failures_by_modality{};
  // Time each serial or device-bound stage spent working, in nanoseconds (where a run waits).
  std::atomic<int64_t> route_ns{0};
  std::atomic<int64_t> assemble_ns{0};
  std::atomic<int64_t> build_ns{0};   // shard images (HDF5)
  std::atomic<int64_t> commit_ns{0};  // writing, fsyncing, hashing them; the index
  std::array<std::atomic<int64_t>, kNumModalities> encode_ns{};
  // The time at least one of a modality's encode calls ran (Note [An encoder's time in use] in
  // pipeline/core/overlap_clock.cpp), where encode_ns sums the calls in flight at once.
  std::array<OverlapClock, kNumModalities> encode_in_use{};
  // Time batches spent cut and waiting for an encoder (queued at the encode node): large when
  // the encoders are the bound, near 0 when they wait for batches.
  std::array<std::atomic<int64_t>, kNumModalities> encode_wait_ns{};
  // The graph's wall time, and the time video files spent in each kind of decoder, summed over
  // the threads (a file handed over counts on both): how busy the decoders kept, the bound of a
  // video job (Note [How busy the decoders were] in pipeline/runner.cpp).
  std::atomic<int64_t> graph_ns{0};
  std::atomic<int64_t> video_nvdec_ns{0};
  std::atomic<int64_t> video_cpu_decode_ns{0};
};

// Adds the time from its construction to its destruction to `total` (nanoseconds).
class StageTimer {
 public:
  explicit StageTimer(std::atomic<int64_t>& total)
      : total_(total), started_(std::chrono::steady_clock::now()) {}
  ~StageTimer() {
    total_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - started_)
                         .count(),
                     std::memory_order_relaxed);
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  std::atomic<int64_t>& total_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace precompute
