#include "encoders/early_start.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <set>
#include <vector>

#include "encoders/encoder_model.hpp"
#include "pipeline/core/logging.hpp"

namespace precompute {

// Note [Started beside the input's read]
// A run may not load its encoders before it has read and checked its input and locked its
// output: an invalid input writes nothing, and an output that must be refused is refused before
// any model loads (Note [Refuse before touching the output] in pipeline/runner.cpp). But two
// parts of the loading change nothing that a refusal protects, and together they cost about as
// much as reading a 1,000,000-caption input:
//  - starting CUDA: the driver, a context and the caching allocator on each device, then cuBLAS
//    and the first kernels of a transformer layer, which the warm-up batch otherwise loads;
//  - the models' identities (model_sha256(), reading every byte of the model's folder), which
//    the loading otherwise waits for after its warm-up.
// So both start with the run, on threads of their own, and the loading finds them done or under
// way (docs/benchmarks.md, "What bounds it, and the start-up timeline"). A refused run stops the
// hashing at its next 1 MiB read and waits for CUDA's start, which is not interruptible (a
// fraction of a second). The CUDA thread swallows every error: a missing device or driver is
// reported by load_encoder, with its own message and exit code; a hash's error reaches the
// encoder that waits for it, as if the encoder had computed it.
namespace {

// Brings up CUDA on `device` for an encoder computing in `dtypes`: the context and the caching
// allocator's state, then cuBLAS(Lt) and the first kernels of a transformer's layer (a linear
// layer with its bias, GELU, a residual LayerNorm), whose loading is otherwise the warm-up's.
void start_device(const std::string& device, const std::set<at::ScalarType>& dtypes) {
  const auto on = at::TensorOptions().device(at::Device(device));
  (void)at::empty({1}, on);
  for (const auto dtype : dtypes) {
    const auto options = on.dtype(dtype);
    const auto x = at::ones({64, 256}, options);
    const auto weight = at::ones({256, 256}, options);
    const auto bias = at::zeros({256}, options);
    const auto y = at::gelu(at::linear(x, weight, bias));
    (void)at::layer_norm(x + y, {256}, weight[0], bias).sum().item<float>();
  }
}

}  // namespace

EarlyStart::EarlyStart(const Config& config) {
  std::map<std::string, std::set<at::ScalarType>> devices;  // CUDA device -> compute dtypes
  for (Modality m : kAllModalities) {
    if (!config.enabled(m)) continue;
    for (const auto& device : config.devices_for(m)) {
      if (device != "cpu") devices[device].insert(to_scalar_type(config.section(m).dtype));
    }
    // The config outlives this object, whose destructor waits for the hash.
    hashes_[modality_index(m)] = std::async(std::launch::async, [this, &config, m] {
                                   return model_sha256(config, m, &cancelled_);
                                 }).share();
  }
  cuda_ = std::thread([this, devices = std::move(devices)] {
    const auto started = std::chrono::steady_clock::now();
    std::string started_on;
    try {
      description_ = describe_devices();
      // A thread per device: each context is made in parallel with the others'.
      std::vector<std::future<std::string>> each;
      for (const auto& [device, dtypes] : devices) {
        each.push_back(std::async(std::launch::async, [&device, &dtypes] {
          const auto resolved = resolve_device(device);
          start_device(resolved, dtypes);
          return resolved;
        }));
      }
      for (auto& started_device : each) {
        const auto resolved = started_device.get();
        started_on += started_on.empty() ? resolved : ", " + resolved;
      }
    } catch (...) {  // reported by the loading (see above)
    }
    if (!started_on.empty() && log_enabled(LogLevel::kDebug)) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "start-up: CUDA started on %s (contexts, cuBLAS, first kernels) in %.3f s, "
                    "beside the input",
                    started_on.c_str(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                        .count());
      log_message(LogLevel::kDebug, line);
    }
  });
}

EarlyStart::~EarlyStart() {
  cancelled_ = true;
  if (cuda_.joinable()) cuda_.join();
  // The hashes' futures wait for their threads as they are destroyed, after this body.
}

const std::string& EarlyStart::devices() {
  if (cuda_.joinable()) cuda_.join();
  if (description_.empty()) description_ = describe_devices();
  return description_;
}

}  // namespace precompute
