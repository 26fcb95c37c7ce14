#pragma once
// The video and audio settings a model package declares (python/precompute/export.py writes
// them: input size, mean and std, layout, frames per clip, sample rate, window), filled into the
// keys the config file leaves out, so that a user does not restate a model's preprocessing by
// hand. Free of LibTorch in its interface; thread-safe (no shared state).

#include "pipeline/core/config.hpp"

namespace precompute {

// For each of the video and audio sections whose encoder is a .pt2 package: every setting the
// package declares and the config file does not set takes the package's value; one the file sets
// to another value keeps the file's, with a warning naming both. Fills each section's `origins`
// with the settings a package may decide, their effective values and sources. A package that
// cannot be read is left to the model's loader to report.
void resolve_package_settings(Config& config);

}  // namespace precompute
