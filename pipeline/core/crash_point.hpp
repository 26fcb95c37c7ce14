#pragma once
// Whitebox crash points for the crash-consistency tests (docs/reliability.md): when the
// environment variable PRECOMPUTE_CRASH_AT names a point, the process kills itself with SIGKILL
// there, exactly like a kill -9 or a power cut at that instant (minus the page cache). The value
// is "POINT" or "POINT@N" (the N-th time the point is reached, from 1). Points are named in the
// code that calls crash_point(); unset, a crash point costs one cached branch.

#include <string_view>

namespace precompute {

void crash_point(std::string_view point);

}  // namespace precompute
