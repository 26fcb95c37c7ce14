#pragma once
// Exit codes a scheduler can act on (sysexits style; documented in the README).

namespace precompute {

inline constexpr int kExitOk = 0;                 // done; failures within the limit
inline constexpr int kExitVerifyIncomplete = 1;   // verify: sound, but not every sample is there
inline constexpr int kExitUsage = 2;              // bad flags, config or model: fix and rerun
inline constexpr int kExitTooManyFailures = 3;    // done, but failures exceed --max-failures,
                                                  // or a modality with inputs embedded none
inline constexpr int kExitInvalidInput = 65;      // the manifest or input folder is invalid, or
                                                  // feeds no sample to a configured modality
inline constexpr int kExitInternal = 70;          // a bug in precompute
inline constexpr int kExitOutputUnavailable = 73; // output folder cannot be created or written
inline constexpr int kExitIoError = 74;           // writing or reading the output failed, or
                                                  // inspect/verify found a damaged shard
inline constexpr int kExitOutputLocked = 69;      // another run is writing the output folder
inline constexpr int kExitRestart = 75;           // temporary failure: rerun the same command
// A run stopped by SIGINT or SIGTERM exits with 128 + the signal (130, 143), after committing
// its complete shards: rerun the same command to resume.

}  // namespace precompute
