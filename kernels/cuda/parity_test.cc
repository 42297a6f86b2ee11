// The CPU and GPU codec registries agree on everything decided on the host, checked without a
// device (these tests never skip): the same canonical Spec() and wire name for every spec, the
// same verdict on good and bad parameters, and the same verdict on every header, size and scale
// mutation of a CPU payload. Both sides read the wire format through kernels/format/, so a
// codec that stops doing so fails here, on any machine that builds the CUDA code.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cuda/gpu_codec.h"
#include "kernels/format/int8.h"
#include "kernels/format/randomk.h"
#include "kernels/format/sign.h"
#include "kernels/format/sparse.h"
#include "kernels/format/terngrad.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern::cuda {
namespace {

using ::tern::testing::IsOk;

// Good and bad specs of every GPU codec: defaults, each parameter set, out of range, unknown.
std::vector<std::string> ParameterSpecs() {
  return {"none",
          "none:x=1",
          "fp16",
          "bf16",
          "bf16:ratio=0.1",
          "int8",
          "int8:block=1,mode=minmax,round=stochastic",
          "int8:block=1048576",
          "int8:block=1048577",
          "int8:block=0",
          "int8:mode=max",
          "sign",
          "sign:chunk=8",
          "sign:chunk=12",
          "sign:chunk=4",
          "terngrad",
          "terngrad:clip=0,pack=base3",
          "terngrad:clip=-1",
          "terngrad:pack=3bit",
          "natural",
          "natural:levels=2",
          "topk",
          "topk:ratio=0.5",
          "topk:ratio=0",
          "topk:ratio=1.5",
          "threshold",
          "threshold:tau=0.25",
          "threshold:tau=-1",
          "dgc",
          "dgc:ratio=0.01,sample=0.1",
          "dgc:sample=0",
          "randomk",
          "randomk:ratio=0.25,unbiased=1",
          "randomk:unbiased=2",
          "randomk:ratoi=0.1"};
}

TEST(CpuGpuParity, EverySpecHasTheSameCanonicalSpecAndParameterVerdict) {
  auto cpu = NewBuiltinCodecRegistry();
  auto gpu = NewBuiltinGpuCodecRegistry();
  for (const std::string& spec : ParameterSpecs()) {
    auto c = cpu->Create(spec);
    auto g = gpu->Create(spec);
    ASSERT_EQ(c.ok(), g.ok()) << spec << ": CPU " << c.status() << ", GPU " << g.status();
    if (!c.ok()) continue;
    EXPECT_EQ((*c)->Spec(), (*g)->Spec()) << spec;
    EXPECT_EQ((*c)->Name(), (*g)->Name()) << spec;
    auto again = gpu->Create((*g)->Spec());
    ASSERT_THAT(again, IsOk()) << (*g)->Spec();
    EXPECT_EQ((*again)->Spec(), (*g)->Spec());
  }
  for (const std::string& name : gpu->Names()) {
    bool listed = false;
    for (const std::string& spec : ParameterSpecs())
      listed |= spec.substr(0, spec.find(':')) == name;
    EXPECT_TRUE(listed) << name << " has no parameter cases";
  }
}

// Header bytes of each wire format (kernels/format/): the bytes a flip may hit without touching
// the data the device validates.
size_t HeaderBytes(absl::string_view wire) {
  if (wire == format::kInt8Name) return format::kInt8HeaderBytes;
  if (wire == format::kSignName) return format::kSignHeaderBytes;
  if (wire == format::kTernGradName) return 1;  // u8 packing
  if (wire == format::kRandomKName) return format::kRandomKHeaderBytes;
  if (wire == format::kTopKName || wire == format::kThresholdName || wire == format::kDgcName) {
    return 4;  // u32 k
  }
  return 0;  // none, fp16, bf16, natural: no header
}

// Mutations of `enc` that change its header, sizes or scales, never its data bytes.
std::vector<EncodedTensor> Mutations(const EncodedTensor& enc) {
  std::vector<EncodedTensor> out = {enc};
  const size_t header = std::min(HeaderBytes(enc.codec), enc.payload.size());
  for (size_t len = 0; len < std::min<size_t>(enc.payload.size(), 16); ++len) {
    EncodedTensor t = enc;
    t.payload.resize(len);  // truncated
    out.push_back(t);
  }
  for (size_t extra : {1, 3, 4, 8}) {
    EncodedTensor t = enc;
    t.payload.append(extra, '\0');  // oversize
    out.push_back(t);
  }
  for (size_t byte = 0; byte < header; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      EncodedTensor t = enc;
      t.payload[byte] = static_cast<char>(t.payload[byte] ^ (1 << bit));
      out.push_back(t);
    }
  }
  EncodedTensor more = enc;
  more.scales.push_back(1.0f);
  out.push_back(more);
  if (!enc.scales.empty()) {
    EncodedTensor fewer = enc;
    fewer.scales.pop_back();
    out.push_back(fewer);
    for (float bad : {std::nanf(""), -1.0f, INFINITY}) {
      EncodedTensor t = enc;
      t.scales[0] = bad;
      out.push_back(t);
    }
  }
  return out;
}

// The refusals that depend on the data bytes, which a GPU decoder checks on the device.
bool IsDataCheck(const absl::Status& s) {
  for (const char* what : {"invalid 2-bit code", ">= 3^5", "value -128", "exponent code 255",
                           "is out of range", "is not ascending"}) {
    if (absl::StrContains(s.message(), what)) return true;
  }
  return false;
}

class CpuGpuHeaders : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuGpuHeaders, EveryHeaderSizeAndScaleMutationGetsTheSameVerdict) {
  auto cpu = NewBuiltinCodecRegistry();
  auto gpu = NewBuiltinGpuCodecRegistry();
  auto encoder = cpu->Create(GetParam());
  auto g = gpu->Create(GetParam());
  ASSERT_THAT(encoder, IsOk());
  ASSERT_THAT(g, IsOk());
  auto c = cpu->DecoderFor((*encoder)->Name());
  ASSERT_THAT(c, IsOk());
  for (size_t n : {0u, 1u, 7u, 9u, 40u, 1001u}) {
    const std::vector<float> x = testing::Gaussian(n, 11 + n);
    EncodedTensor enc;
    EncodeOptions o;
    o.seed = 5;
    ASSERT_THAT((*encoder)->Encode(x, o, &enc), IsOk());
    int refused = 0;
    for (const EncodedTensor& t : Mutations(enc)) {
      std::vector<float> y(n);
      const absl::Status on_cpu = (*c)->Decode(EncodedView::Of(t), absl::MakeSpan(y));
      const absl::Status on_gpu = (*g)->CheckPayload(EncodedView::Of(t));
      // The host checks are the same; what only the CPU refuses must be a check of the data
      // that the GPU decoder runs on the device (a flipped packing can make valid codes
      // invalid).
      const bool same = on_cpu.ok() == on_gpu.ok() || (on_gpu.ok() && IsDataCheck(on_cpu));
      ASSERT_TRUE(same) << GetParam() << " n=" << n << " payload " << t.payload.size() << " bytes, "
                        << t.scales.size() << " scales: CPU " << on_cpu << ", GPU " << on_gpu;
      refused += !on_cpu.ok();
    }
    EXPECT_GT(refused, 0) << GetParam() << " n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Builtin, CpuGpuHeaders,
                         ::testing::Values("none", "fp16", "bf16", "int8",
                                           "int8:mode=minmax,block=4", "sign:chunk=8", "terngrad",
                                           "terngrad:pack=base3", "natural", "topk:ratio=0.1",
                                           "threshold:tau=0.5", "dgc:ratio=0.1",
                                           "randomk:ratio=0.2"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s;
                           for (char c : p.param) s += std::isalnum(c) ? c : '_';
                           return s;
                         });

}  // namespace
}  // namespace tern::cuda
