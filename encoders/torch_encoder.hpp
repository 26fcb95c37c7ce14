#pragma once
// What the LibTorch encoders share: inference mode and the device guard around every batch,
// LibTorch errors turned into ModelError, the warm-up pass that learns the output width, and
// pinned host buffers for GPU devices. The derived class owns its model. Internal to encoders/.
// One thread at a time per instance.

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <mutex>
#include <optional>

#include "encoders/encoder.hpp"
#include "pipeline/core/dedicated_thread.hpp"

namespace precompute {

class TorchEncoder : public Encoder {
 public:
  const EncoderInfo& info() const override { return info_; }
  std::vector<SampleEmbedding> encode(const std::vector<PreparedSamplePtr>& batch) final;
  ParameterSummary parameters() const final;
  std::string input_dtype() const final;

 protected:
  // `model_sha256` identifies the model's files (stored with every shard).
  TorchEncoder(Modality modality, const EncoderSection& section, const std::string& device,
               std::string model_sha256);

  // Embeds a non-empty batch; called under inference mode with the device current.
  virtual std::vector<SampleEmbedding> run(const std::vector<PreparedSamplePtr>& batch) = 0;

  // The model's weights and the dtype it computes in.
  virtual std::vector<at::Tensor> weights() const = 0;
  virtual at::ScalarType compute_dtype() const = 0;

  // Runs `sample` through encode() once and records the output width; the derived class calls
  // it at the end of its constructor.
  void warm_up(PreparedSample sample);

  // Host tensor to fill and send to the model's device: pinned when the device is a GPU so that
  // the copy is asynchronous.
  at::Tensor host_buffer(at::IntArrayRef sizes, at::ScalarType type) const;

  // Waits until the calling thread's current stream has done its work (GPU; nothing on CPU).
  // Only for timing a batch's phases at debug level: the copy to the host waits anyway.
  void wait_for_device() const;

  c10::Device device_;
  EncoderInfo info_;

 private:
  // A batch on the calling thread, on `stream` where it is set.
  std::vector<SampleEmbedding> encode_on(const std::vector<PreparedSamplePtr>& batch,
                                         const std::optional<c10::Stream>& stream);

  // GPU: one CUDA stream per concurrent call, each call taking a free lane: a fixed stream and
  // the one thread that runs that stream's calls (Note [One thread per CUDA stream]). Fixed
  // streams, so that the caching allocator reuses each stream's blocks rather than caching for
  // many.
  struct Lane {
    explicit Lane(c10::Stream s) : stream(s) {}
    c10::Stream stream;
    DedicatedThread thread;
  };
  std::mutex lanes_mutex_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<Lane*> free_lanes_;
};

}  // namespace precompute
