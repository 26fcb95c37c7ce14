#pragma once
// Starting CUDA while the run reads its input (Note [CUDA started beside the input's read] in
// encoders/device_startup.cpp). Free of LibTorch, like encoders/encoder.hpp.

#include <string>
#include <thread>

#include "pipeline/core/config.hpp"

namespace precompute {

// Starts, on a thread of its own, the CUDA driver and a context on each CUDA device that
// `config` runs an encoder on. Best effort: whatever fails is left for load_encoder to report,
// where and as it did before. The destructor waits for the thread.
class DeviceStartup {
 public:
  explicit DeviceStartup(const Config& config);
  ~DeviceStartup();
  DeviceStartup(const DeviceStartup&) = delete;
  DeviceStartup& operator=(const DeviceStartup&) = delete;

  // Waits for the thread and returns describe_devices()'s line, which it computed.
  const std::string& wait();

 private:
  std::string description_;
  std::thread thread_;
};

}  // namespace precompute
