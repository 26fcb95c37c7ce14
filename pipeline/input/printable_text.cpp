#include "pipeline/input/printable_text.hpp"

#include <utf8proc.h>

namespace precompute {

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  const auto escape = [&](unsigned char byte) {
    out += "\\x";
    out += kHex[byte >> 4];
    out += kHex[byte & 0xF];
  };
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t n =
        utf8proc_iterate(bytes + i, static_cast<utf8proc_ssize_t>(text.size() - i), &code_point);
    if (n <= 0) {
      escape(bytes[i++]);
    } else if (code_point < 0x20 || code_point == 0x7F) {
      escape(static_cast<unsigned char>(code_point));
      ++i;
    } else {
      out.append(text.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

}  // namespace precompute
