#pragma once
// The three kinds of input precompute embeds. Their order is the order of groups in a shard and
// of columns in summaries.

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace precompute {

enum class Modality : uint8_t { kVideo = 0, kAudio = 1, kText = 2 };

inline constexpr std::array<Modality, 3> kAllModalities = {Modality::kVideo, Modality::kAudio,
                                                            Modality::kText};
inline constexpr int kNumModalities = 3;

constexpr int modality_index(Modality m) { return static_cast<int>(m); }

constexpr std::string_view modality_name(Modality m) {
  switch (m) {
    case Modality::kVideo:
      return "video";
    case Modality::kAudio:
      return "audio";
    case Modality::kText:
      return "text";
  }
  return "unknown";
}

constexpr std::optional<Modality> parse_modality(std::string_view name) {
  for (Modality m : kAllModalities) {
    if (modality_name(m) == name) return m;
  }
  return std::nullopt;
}

}  // namespace precompute
