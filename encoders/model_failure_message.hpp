#pragma once
// The parts of the message a model's failure gets (Note [A model's failure in one line] in
// model_failure_message.cpp): the model's own message in one line, and what the model was given.
// Internal to encoders/: it includes LibTorch. Thread-safe (no state).

#include <ATen/core/ivalue.h>

#include <string>
#include <string_view>
#include <vector>

namespace precompute {

// The model's own message, on one line: for the TorchScript interpreter's errors, the exception
// that ends its traceback ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and
// 4x5)"); for any other text, all of it. Line breaks and runs of blanks become one space.
std::string model_message_line(std::string_view what);

// For a model's message (model_message_line) that says tensors of two dtypes met inside it
// (LibTorch's words on the CPU and on CUDA: "expected scalar type ...", "... to have the same
// dtype", "mixed dtype", "Input type (...) and weight type (...)"), a sentence with the likely
// cause and its fix for the section `modality` ("video", "audio", "text"); "" otherwise.
std::string dtype_mismatch_hint(std::string_view message, std::string_view modality);

// What a forward() call was given or gave back, for messages: "[4, 3, 224, 224] float32" per
// tensor, the kind of anything else ("int", "Tuple"), comma-separated.
std::string describe_values(const std::vector<c10::IValue>& values);
std::string describe_value(const c10::IValue& value);

// "float32", "int64", "uint8", ...: the names config files and numpy use.
std::string dtype_name(at::ScalarType type);

}  // namespace precompute
