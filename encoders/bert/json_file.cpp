#include "encoders/bert/json_file.hpp"

#include <fstream>

#include "pipeline/core/error.hpp"

namespace precompute {

bool is_regular_file_quietly(const std::filesystem::path& file) {
  std::error_code ignored;
  return std::filesystem::is_regular_file(file, ignored);
}

nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.is_open(), ModelError, "cannot read ", file);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    PC_THROW(ModelError, file, " is not valid JSON: ", e.what());
  }
}

std::optional<nlohmann::json> read_json_file_if_present(const std::filesystem::path& file) {
  if (!is_regular_file_quietly(file)) return std::nullopt;
  return read_json_file(file);
}

}  // namespace precompute
