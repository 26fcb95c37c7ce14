#include "encoders/device_startup.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <set>

#include "encoders/encoder.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {

// Note [CUDA started beside the input's read]
// Before the graph runs, a text job of 1,000,000 captions on one H200 spent 1.8 s reading its
// manifest and then about 1.3 s starting CUDA and loading BERT, one after the other. The
// encoders cannot load earlier: an output that must be refused is refused before any model
// loads, and an invalid input writes nothing, so the loading waits for both checks (Note [Refuse
// before touching the output] in pipeline/runner.cpp). Starting CUDA itself (the driver, then a
// context and the caching allocator on each device the encoders will use) changes nothing a
// refusal protects, so it runs on a thread of its own from the start of the run, and the
// loading finds it done. The thread swallows every error: a missing device or driver is
// reported by load_encoder, with the message and exit code it always had.
DeviceStartup::DeviceStartup(const Config& config) {
  std::set<std::string> devices;
  for (Modality m : kAllModalities) {
    if (!config.enabled(m)) continue;
    for (const auto& device : config.devices_for(m)) devices.insert(device);
  }
  thread_ = std::thread([this, devices = std::move(devices)] {
    const auto started = std::chrono::steady_clock::now();
    std::string started_on;
    try {
      description_ = describe_devices();
      for (const auto& device : devices) {
        if (device == "cpu") continue;
        const auto resolved = resolve_device(device);
        // A one-element tensor makes LibTorch create the context and its allocator's state.
        (void)at::empty({1}, at::TensorOptions().device(at::Device(resolved)));
        started_on += started_on.empty() ? resolved : ", " + resolved;
      }
    } catch (...) {  // reported by the loading (see above)
    }
    if (!started_on.empty() && log_enabled(LogLevel::kDebug)) {
      log_message(LogLevel::kDebug,
                  "start-up: CUDA started on " + started_on + " in " +
                      std::to_string(std::chrono::duration<double>(
                                         std::chrono::steady_clock::now() - started)
                                         .count()) +
                      " s, beside the input's read");
    }
  });
}

DeviceStartup::~DeviceStartup() {
  if (thread_.joinable()) thread_.join();
}

const std::string& DeviceStartup::wait() {
  if (thread_.joinable()) thread_.join();
  if (description_.empty()) description_ = describe_devices();
  return description_;
}

}  // namespace precompute
