// What tern export writes: NPY headers numpy reads, the built-in MLP told apart from a PyTorch
// layout, weights transposed exactly, and a state_dict pickle of the opcodes torch.save uses.
// (tests/export/export_test.py loads real files with numpy and torch.)
#include "core/model/export.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tern {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

NamedArray Array(std::string name, std::vector<int64_t> shape) {
  NamedArray a{std::move(name), std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  for (int64_t i = 0; i < n; ++i) a.values.push_back(static_cast<float>(i) + 0.5f);
  return a;
}

TEST(Npy, HeadersArePaddedTo64BytesAndNameTheShape) {
  for (const auto& [shape, text] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{3}, "'shape': (3,), }"}, {{2, 3}, "'shape': (2, 3), }"}, {{}, "'shape': (), }"}}) {
    const std::string npy = NpyBytes(Array("t", shape));
    ASSERT_THAT(npy, StartsWith(std::string("\x93NUMPY\x01\x00", 8)));
    const size_t header = static_cast<uint8_t>(npy[8]) | static_cast<uint8_t>(npy[9]) << 8;
    EXPECT_EQ((10 + header) % 64, 0u);
    EXPECT_EQ(npy[10 + header - 1], '\n');
    EXPECT_THAT(npy.substr(10, header), HasSubstr("'descr': '<f4', 'fortran_order': False"));
    EXPECT_THAT(npy.substr(10, header), HasSubstr(text));
    const size_t n = shape.empty() ? 1 : static_cast<size_t>(shape.size() == 1 ? 3 : 6);
    EXPECT_EQ(npy.size(), 10 + header + 4 * n);
  }
}

TEST(ExportLayout, TheBuiltinMlpIsToldApartFromTorchsAndTransposedExactly) {
  std::vector<NamedArray> builtin = {Array("fc1.weight", {4, 3}), Array("fc1.bias", {3}),
                                     Array("fc2.weight", {3, 2}), Array("fc2.bias", {2})};
  EXPECT_TRUE(IsBuiltinMlpLayout(builtin));
  EXPECT_TRUE(IsBuiltinMlpLayout({Array("linear.weight", {4, 2}), Array("linear.bias", {2})}));
  std::vector<NamedArray> torch = builtin;
  TransposeWeights(&torch);
  EXPECT_FALSE(IsBuiltinMlpLayout(torch)) << "torch.nn.Linear's [out, in]";
  EXPECT_EQ(torch[0].shape, (std::vector<int64_t>{3, 4}));
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(torch[0].values[c * 4 + r], builtin[0].values[r * 3 + c]);
  }
  EXPECT_EQ(torch[1].values, builtin[1].values) << "biases stay";
  EXPECT_FALSE(IsBuiltinMlpLayout({Array("fc1.weight", {3, 3}), Array("fc1.bias", {3})}))
      << "square everywhere: undecidable, left as is";
  EXPECT_FALSE(IsBuiltinMlpLayout({Array("conv.weight", {4, 3}), Array("conv.bias", {3})}));
}

TEST(TorchPickle, AStateDictOfRebuiltTensorsOverNumberedStorages) {
  const std::string p =
      TorchStateDictPickle({Array("fc1.weight", {2, 3}), Array("fc1.bias", {70000})});
  EXPECT_THAT(p, StartsWith("\x80\x02}("));
  EXPECT_EQ(p.back(), '.');
  EXPECT_EQ(p[p.size() - 2], 'u');  // SETITEMS
  EXPECT_THAT(p, HasSubstr("ctorch._utils\n_rebuild_tensor_v2\n"));
  EXPECT_THAT(p, HasSubstr("ctorch\nFloatStorage\n"));
  EXPECT_THAT(p, HasSubstr(std::string("X\x01\x00\x00\x00"
                                       "1",
                                       6)));  // storage key "1"
  EXPECT_THAT(p, HasSubstr("J\x70\x11\x01\x00")) << "70000 as BININT";
}

}  // namespace
}  // namespace tern
