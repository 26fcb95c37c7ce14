// model_message_line and describe_values (encoders/model_failure_message.cpp) on the errors
// LibTorch itself raises: a TorchScript function compiled here fails inside the interpreter, as
// a saved module does, so the text parsed is LibTorch's own (Note [A model's failure in one
// line]).

#include "encoders/model_failure_message.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/jit.h>

#include <string>

namespace precompute {
namespace {

// What LibTorch says when `source`'s forward() fails on `input`.
std::string failure_of(const std::string& source, const at::Tensor& input) {
  const auto unit = torch::jit::compile(source);
  try {
    unit->run_method("forward", input);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  }
  ADD_FAILURE() << "forward() did not fail";
  return "";
}

// Note [Two dtypes inside a model]: LibTorch's own words for two dtypes meeting (a matrix
// product, a convolution, on the CPU; a convolution's on CUDA) get the fix; other failures none.
TEST(ModelFailureMessageTest, TwoDtypesInsideAModelGetTheFix) {
  const auto product = model_message_line(failure_of(R"JIT(
def forward(x: Tensor) -> Tensor:
    return torch.mm(x, x.half())
)JIT", at::ones({2, 2})));
  EXPECT_NE(dtype_mismatch_hint(product, "video").find("trace it in the dtype video.dtype sets"),
            std::string::npos)
      << product;
  const auto convolution = model_message_line(failure_of(R"JIT(
def forward(x: Tensor) -> Tensor:
    return torch.conv2d(x, torch.ones([4, 3, 3, 3]).half())
)JIT", at::ones({1, 3, 8, 8})));
  EXPECT_NE(dtype_mismatch_hint(convolution, "video").find("export it as a .pt2 package"),
            std::string::npos)
      << convolution;
  EXPECT_NE(dtype_mismatch_hint("RuntimeError: Input type (CUDAFloatType) and weight type "
                                "(CUDAHalfType) should be the same",
                                "audio")
                .find("audio.dtype"),
            std::string::npos);
  const auto shapes = model_message_line(failure_of(R"JIT(
def forward(x: Tensor) -> Tensor:
    return torch.mm(x, x)
)JIT", at::ones({2, 3})));
  EXPECT_EQ(dtype_mismatch_hint(shapes, "video"), "") << shapes;
}

TEST(ModelFailureMessageTest, AnOperatorsFailureIsTheExceptionAlone) {
  const auto what = failure_of(R"JIT(
def helper(x: Tensor) -> Tensor:
    return torch.mm(x, x)

def forward(x: Tensor) -> Tensor:
    return helper(x) + 1
)JIT", at::ones({2, 3}));
  ASSERT_NE(what.find("Traceback of TorchScript"), std::string::npos) << what;
  EXPECT_EQ(model_message_line(what),
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)")
      << what;
}

// A `raise` in a saved module (what LibTorch printed for one): Python's module of the exception
// is dropped, and a message of several lines is joined.
TEST(ModelFailureMessageTest, ARaisedMessageOfSeveralLinesIsJoined) {
  const std::string what =
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript, serialized code (most recent call last):\n"
      "  File \"code/__torch__.py\", line 10, in forward\n"
      "    _0 = \"expected windows of 400 samples,\\n  got another length\"\n"
      "      ops.prim.RaiseException(_0, \"builtins.ValueError\")\n"
      "      ~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE\n"
      "\n"
      "Traceback of TorchScript, original code (most recent call last):\n"
      "  File \"/work/export.py\", line 16, in forward\n"
      "            raise ValueError(\"expected windows of 400 samples,\\n  got another length\")\n"
      "            ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~ <--- HERE\n"
      "builtins.ValueError: expected windows of 400 samples,\n"
      "  got another length\n";
  EXPECT_EQ(model_message_line(what),
            "ValueError: expected windows of 400 samples, got another length");
}

// A traced module's original-code section lists Python frames at the start of lines, as
// "path(line): function"; none of them is taken for the exception.
TEST(ModelFailureMessageTest, TracedFramesAreNotTheException) {
  const std::string what =
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript, serialized code (most recent call last):\n"
      "  File \"code/__torch__/torch/nn/modules/container.py\", line 12, in forward\n"
      "    _0 = torch.linear(argument_1, weight, bias)\n"
      "         ~~~~~~~~~~~~ <--- HERE\n"
      "\n"
      "Traceback of TorchScript, original code (most recent call last):\n"
      "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py(134): forward\n"
      "export.py(20): <module>\n"
      "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x80 and 100x4)\n";
  EXPECT_EQ(model_message_line(what),
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x80 and 100x4)");
}

TEST(ModelFailureMessageTest, TextWithoutATracebackIsKeptWholeOnOneLine) {
  EXPECT_EQ(model_message_line("Expected all tensors to be on the same device,\n  but found "
                               "at least two devices\n"),
            "Expected all tensors to be on the same device, but found at least two devices");
  EXPECT_EQ(model_message_line(""), "");
}

TEST(ModelFailureMessageTest, ValuesAreDescribedByShapeAndDtype) {
  const std::vector<c10::IValue> values = {at::zeros({4, 3, 32, 32}),
                                           at::zeros({4}, at::kLong),
                                           at::zeros({}, at::kBFloat16), c10::IValue(7)};
  EXPECT_EQ(describe_values(values), "[4, 3, 32, 32] float32, [4] int64, [] bfloat16, Int");
}

}  // namespace
}  // namespace precompute
