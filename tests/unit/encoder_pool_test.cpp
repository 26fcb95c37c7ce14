#include "pipeline/stages/encode_stage.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace precompute {
namespace {

// An encoder that only says which device it is; the pool never calls encode() itself.
class DeviceOnly final : public Encoder {
 public:
  DeviceOnly(std::string device, int calls) {
    info_.device = std::move(device);
    info_.concurrent_calls = calls;
  }
  const EncoderInfo& info() const override { return info_; }
  std::vector<SampleEmbedding> encode(const std::vector<PreparedSamplePtr>&) override {
    return {};
  }
  ParameterSummary parameters() const override { return {}; }
  std::string input_dtype() const override { return "Float"; }

 private:
  EncoderInfo info_;
};

EncoderPool pool_of(const std::vector<std::pair<std::string, int>>& devices) {
  std::vector<std::unique_ptr<Encoder>> encoders;
  for (const auto& [device, calls] : devices) {
    encoders.push_back(std::make_unique<DeviceOnly>(device, calls));
  }
  return EncoderPool(std::move(encoders));
}

// Batches that come one at a time (the GPU is faster than the decoders) go round the devices.
TEST(EncoderPoolTest, BatchesOneAtATimeGoRoundTheDevices) {
  EncoderPool pool = pool_of({{"cuda:0", 2}, {"cuda:1", 2}});
  EXPECT_EQ(pool.size(), 4u);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    order.push_back(pool.with_encoder([](Encoder& e) { return e.info().device; }));
  }
  EXPECT_EQ(order, (std::vector<std::string>{"cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0",
                                             "cuda:1"}));
}

// Calls that overlap take different devices before a second call of the same one.
TEST(EncoderPoolTest, OverlappingCallsSpreadOverTheDevices) {
  EncoderPool pool = pool_of({{"cuda:0", 2}, {"cuda:1", 2}, {"cuda:2", 1}});
  std::map<std::string, int> busy;
  // Nested calls hold their encoders at once: three at a time.
  pool.with_encoder([&](Encoder& a) {
    return pool.with_encoder([&](Encoder& b) {
      return pool.with_encoder([&](Encoder& c) {
        ++busy[a.info().device];
        ++busy[b.info().device];
        ++busy[c.info().device];
        return 0;
      });
    });
  });
  EXPECT_EQ(busy, (std::map<std::string, int>{{"cuda:0", 1}, {"cuda:1", 1}, {"cuda:2", 1}}));
}

}  // namespace
}  // namespace precompute
