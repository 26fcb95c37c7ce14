#pragma once
// Text from an input (ids, paths, column names) as a message can show it.

#include <string>
#include <string_view>

namespace precompute {

// `text` with its valid characters as they are, and control characters and bytes that are not
// UTF-8 as \xHH, so that a terminal shows exactly which bytes are wrong.
std::string printable(std::string_view text);

}  // namespace precompute
