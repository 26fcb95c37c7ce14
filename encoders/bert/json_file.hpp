#pragma once
// Reading the JSON files of a model folder, with errors that name the file. Free functions,
// thread-safe.

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

namespace precompute {

// Whether `file` exists and is a regular file (errors count as no).
bool is_regular_file_quietly(const std::filesystem::path& file);

// Parses `file`; throws ModelError naming it when it cannot be read or is not valid JSON.
nlohmann::json read_json_file(const std::filesystem::path& file);

// The same, or std::nullopt when the file does not exist.
std::optional<nlohmann::json> read_json_file_if_present(const std::filesystem::path& file);

}  // namespace precompute
