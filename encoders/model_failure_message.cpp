#include "encoders/model_failure_message.hpp"

#include <c10/util/ArrayRef.h>

#include <cctype>
#include <sstream>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// Note [A model's failure in one line]
// LibTorch reports a failure inside a TorchScript module as a traceback: "The following operation
// failed in the TorchScript interpreter.", one or two "Traceback of TorchScript ..." sections
// (indented code lines, or for a traced module "path(line): function" lines), then the exception
// with its message, which may span lines ("builtins.RuntimeError: ..."). In a log or a failure
// record the cause was buried after dozens of lines, and a reader who saw the first line saw no
// cause at all. The failure message keeps the exception alone, on one line; the whole traceback
// goes to the log at debug level (TorchScriptModel::forward). The exception's line is the first
// line after the last section header that starts with a dotted name and ": " (no traceback line
// does: code is indented, a traced frame starts with its path or "<").
constexpr std::string_view kTracebackHeader = "Traceback of TorchScript";

bool starts_an_exception(std::string_view line) {
  if (line.empty() || !(std::isalpha(static_cast<unsigned char>(line[0])) || line[0] == '_')) {
    return false;
  }
  size_t i = 0;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) ||
                             line[i] == '_' || line[i] == '.')) {
    ++i;
  }
  return line.substr(i, 2) == ": ";
}

// `text` with every run of whitespace (line breaks included) made one space, trimmed.
std::string one_line(std::string_view text) {
  std::string out;
  bool blank = false;
  for (const char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      blank = !out.empty();
      continue;
    }
    if (blank) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

}  // namespace

std::string model_message_line(std::string_view what) {
  const size_t header = what.rfind(kTracebackHeader);
  if (header == std::string_view::npos) return one_line(what);
  size_t start = what.find('\n', header);
  while (start != std::string_view::npos) {
    const size_t line_start = start + 1;
    const size_t line_end = what.find('\n', line_start);
    const auto line = what.substr(line_start, line_end == std::string_view::npos
                                                  ? std::string_view::npos
                                                  : line_end - line_start);
    if (starts_an_exception(line)) {
      std::string message = one_line(what.substr(line_start));
      // A `raise` inside TorchScript names Python's module of the exception.
      constexpr std::string_view kBuiltins = "builtins.";
      if (std::string_view(message).substr(0, kBuiltins.size()) == kBuiltins) {
        message.erase(0, kBuiltins.size());
      }
      return message;
    }
    start = line_end;
  }
  return one_line(what);
}

// Note [Two dtypes inside a model]
// The commonest way to meet LibTorch's dtype errors is a module traced in float32 and run in
// float16 or bfloat16: a trace records as constants the dtypes its code computed from the
// weights (transformers' vision towers cast their input to the weights' dtype), so the cast
// module turns its input back into float32 and a convolution or a matrix product meets both.
// The model's own words do not say so; the hint names the fix.
std::string dtype_mismatch_hint(std::string_view message, std::string_view modality) {
  std::string lower(message);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto has = [&](std::string_view text) { return lower.find(text) != std::string::npos; };
  const bool mixed = has("expected scalar type") || has("to have the same dtype") ||
                     has("mixed dtype") ||
                     (has("input type (") && (has("weight type (") || has("bias type (")));
  if (!mixed) return {};
  return detail::concat(
      " Tensors of two dtypes met inside the model: a TorchScript module traced in float32 keeps "
      "casts to float32 that its trace recorded, so trace it in the dtype ", modality,
      ".dtype sets, or export it as a .pt2 package, which declares its dtype (docs/encoders.md, "
      "\"Encoder contracts\").");
}

std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kDouble:
      return "float64";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(type);
  }
}

std::string describe_value(const c10::IValue& value) {
  if (!value.isTensor()) return value.tagKind();
  const auto& t = value.toTensor();
  if (!t.defined()) return "an undefined tensor";
  std::ostringstream out;
  out << t.sizes() << " " << dtype_name(t.scalar_type());
  return out.str();
}

std::string describe_values(const std::vector<c10::IValue>& values) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : ", ") + describe_value(v);
  return out;
}

}  // namespace precompute
