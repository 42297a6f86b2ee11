// GPU codecs against the CPU codecs (kernels/cpu/): byte-identical payloads from the same input
// and seed, GPU decode of CPU payloads equal to CPU decode (overwrite and accumulate), and
// malformed payloads refused with d_out untouched. Skips, saying why, without a CUDA device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gpu_codec.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern::cuda {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// Device buffers and a stream for one test; frees them at the end.
class DeviceScope {
 public:
  ~DeviceScope() {
    for (void* p : buffers_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream() {
    if (stream_ == nullptr) cudaStreamCreate(&stream_);
    return stream_;
  }
  template <typename T>
  T* Alloc(size_t count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, count * sizeof(T) + 1), cudaSuccess);
    buffers_.push_back(p);
    return static_cast<T*>(p);
  }
  float* Upload(const std::vector<float>& x) {
    float* d = Alloc<float>(x.size());
    cudaMemcpy(d, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
    return d;
  }
  std::vector<float> Download(const float* d, size_t n) {
    std::vector<float> x(n);
    cudaMemcpy(x.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return x;
  }

 private:
  std::vector<void*> buffers_;
  cudaStream_t stream_ = nullptr;
};

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    auto device = FirstDevice();                                 \
    if (!device.ok()) GTEST_SKIP() << device.status().message(); \
  } while (0)

EncodeOptions Seed(uint64_t seed) {
  EncodeOptions o;
  o.seed = seed;
  return o;
}

class GpuCodecs : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<CodecRegistry> cpu_ = NewBuiltinCodecRegistry();
  std::unique_ptr<GpuCodecRegistry> gpu_ = NewBuiltinGpuCodecRegistry();
};

std::vector<std::string> Specs() {
  return {"none",
          "fp16",
          "bf16",
          "int8",
          "int8:mode=minmax,round=stochastic,block=100",
          "int8:block=4096,round=stochastic",
          "sign",
          "sign:chunk=8",
          "sign:chunk=100000",
          "terngrad",
          "terngrad:pack=base3,clip=0",
          "terngrad:clip=0",
          "natural",
          "topk:ratio=0.01",
          "topk:ratio=0.3",
          "threshold:tau=1.5",
          "dgc:ratio=0.01",
          "dgc:ratio=0.001,sample=0.05",
          "randomk:ratio=0.1",
          "randomk:ratio=0.5,unbiased=1"};
}

// Sizes with every kind of tail: below one 16-lane group, odd, several 4096-blocks plus a tail.
const size_t kSizes[] = {1, 13, 1000, 4096, 10007, 1 << 20, (1 << 20) + 12345};

// EncodeOnDevice leaves the whole payload, header included, in the caller's scratch: two encodes
// enqueued into two scratch buffers, with no wait between, each copy out to the CPU's payload for
// its seed. Also from an input that starts off a 16-byte boundary (the kernels' scalar loads).
TEST_P(GpuCodecs, EncodesOnTheDeviceIntoTheCallersScratch) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpu_->Create(GetParam());
  auto gpu = gpu_->Create(GetParam());
  ASSERT_THAT(cpu, IsOk());
  ASSERT_THAT(gpu, IsOk());
  DeviceScope dev;
  for (const auto& [size, skip] :
       {std::pair<size_t, size_t>{10007, 0}, {10007, 1}, {1 << 20, 0}, {(1 << 20) + 7, 3}}) {
    const std::vector<float> whole = testing::Gaussian(size, 3 + size);
    const std::vector<float> x(whole.begin() + skip, whole.end());
    const size_t n = x.size();
    float* d_x = dev.Upload(whole) + skip;
    const size_t scratch = (*gpu)->EncodeScratchBytes(n);
    DeviceEncoded on_device[2];
    for (int i = 0; i < 2; ++i) {
      auto* d_scratch = dev.Alloc<uint8_t>(scratch);
      ASSERT_THAT((*gpu)->EncodeOnDevice(d_x, n, Seed(40 + i), d_scratch, scratch, dev.stream(),
                                         &on_device[i]),
                  IsOk());
      const auto* p = static_cast<const uint8_t*>(on_device[i].d_payload);
      EXPECT_TRUE(p >= d_scratch && p + on_device[i].payload_bytes <= d_scratch + scratch);
    }
    for (int i = 0; i < 2; ++i) {
      EncodedTensor want, got;
      ASSERT_THAT((*cpu)->Encode(x, Seed(40 + i), &want), IsOk());
      ASSERT_THAT(CopyToHost(on_device[i], dev.stream(), &got), IsOk());
      EXPECT_EQ(got.codec, want.codec);
      EXPECT_EQ(got.numel, want.numel);
      EXPECT_EQ(got.scales, want.scales) << "n " << n << ", seed " << 40 + i;
      EXPECT_TRUE(got.payload == want.payload) << "n " << n << ", seed " << 40 + i;
    }
  }
}

TEST_P(GpuCodecs, EncodesTheSameBytesAsTheCpuCodec) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpu_->Create(GetParam());
  auto gpu = gpu_->Create(GetParam());
  ASSERT_THAT(cpu, IsOk());
  ASSERT_THAT(gpu, IsOk());
  EXPECT_EQ((*gpu)->Name(), (*cpu)->Name());
  EXPECT_EQ((*gpu)->Spec(), (*cpu)->Spec());
  DeviceScope dev;
  for (size_t n : kSizes) {
    const std::vector<float> x = testing::Gaussian(n, 7 + n);
    float* d_x = dev.Upload(x);
    for (uint64_t seed : {uint64_t{1}, uint64_t{0xfeedbeef}}) {
      EncodedTensor want, got;
      ASSERT_THAT((*cpu)->Encode(x, Seed(seed), &want), IsOk());
      const size_t scratch = (*gpu)->EncodeScratchBytes(n);
      void* d_scratch = dev.Alloc<uint8_t>(scratch);
      ASSERT_THAT((*gpu)->Encode(d_x, n, Seed(seed), d_scratch, scratch, dev.stream(), &got),
                  IsOk())
          << n;
      EXPECT_EQ(got.codec, want.codec);
      EXPECT_EQ(got.params, want.params);
      EXPECT_EQ(got.numel, want.numel);
      ASSERT_EQ(got.scales.size(), want.scales.size()) << n;
      for (size_t i = 0; i < want.scales.size(); ++i) {
        EXPECT_EQ(got.scales[i], want.scales[i]) << "n " << n << " scale " << i;
      }
      ASSERT_EQ(got.payload.size(), want.payload.size()) << n;
      size_t first_diff = want.payload.size();
      for (size_t i = 0; i < want.payload.size(); ++i) {
        if (got.payload[i] != want.payload[i]) {
          first_diff = i;
          break;
        }
      }
      EXPECT_EQ(first_diff, want.payload.size()) << "n " << n << ": payloads differ at byte";
    }
  }
}

TEST_P(GpuCodecs, DecodesCpuPayloadsToTheCpuValuesAndAccumulates) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpu_->Create(GetParam());
  ASSERT_THAT(cpu, IsOk());
  auto decoder = gpu_->DecoderFor((*cpu)->Name());
  ASSERT_THAT(decoder, IsOk());
  DeviceScope dev;
  for (size_t n : kSizes) {
    const std::vector<float> x = testing::Gaussian(n, 11 + n);
    EncodedTensor enc;
    ASSERT_THAT((*cpu)->Encode(x, Seed(5), &enc), IsOk());
    const EncodedView view = EncodedView::Of(enc);
    std::vector<float> want(n);
    ASSERT_THAT((*cpu)->Decode(view, absl::MakeSpan(want)), IsOk());
    const size_t scratch = (*decoder)->DecodeScratchBytes(view);
    void* d_scratch = dev.Alloc<uint8_t>(scratch);
    float* d_out = dev.Upload(std::vector<float>(n, 123.0f));
    ASSERT_THAT((*decoder)->Decode(view, 1.0f, false, d_out, n, d_scratch, scratch, dev.stream()),
                IsOk());
    EXPECT_EQ(dev.Download(d_out, n), want) << n;
    // Accumulate onto a base, as the CPU does.
    const std::vector<float> base = testing::Gaussian(n, 3);
    std::vector<float> acc = base;
    ASSERT_THAT((*cpu)->DecodeAccumulate(view, 0.25f, absl::MakeSpan(acc)), IsOk());
    float* d_acc = dev.Upload(base);
    ASSERT_THAT((*decoder)->Decode(view, 0.25f, true, d_acc, n, d_scratch, scratch, dev.stream()),
                IsOk());
    EXPECT_EQ(dev.Download(d_acc, n), acc) << n;
  }
}

TEST_P(GpuCodecs, RefusesTruncatedCorruptAndOversizePayloadsLeavingTheOutputAlone) {
  SKIP_WITHOUT_GPU();
  auto cpu = cpu_->Create(GetParam());
  ASSERT_THAT(cpu, IsOk());
  auto decoder = gpu_->DecoderFor((*cpu)->Name());
  ASSERT_THAT(decoder, IsOk());
  DeviceScope dev;
  const size_t n = 10007;
  EncodedTensor enc;
  ASSERT_THAT((*cpu)->Encode(testing::Gaussian(n, 1), Seed(2), &enc), IsOk());
  const std::vector<float> sentinel(n, 42.0f);
  float* d_out = dev.Upload(sentinel);
  auto try_decode = [&](const EncodedTensor& t) {
    const EncodedView v = EncodedView::Of(t);
    const size_t scratch = (*decoder)->DecodeScratchBytes(v);
    void* d_scratch = dev.Alloc<uint8_t>(scratch);
    return (*decoder)->Decode(v, 1.0f, true, d_out, n, d_scratch, scratch, dev.stream());
  };
  // Truncated and oversize by one byte, and every header byte corrupted in turn: refused (or,
  // where a corruption still makes a valid payload, equal to what the CPU decodes).
  EncodedTensor bad = enc;
  bad.payload.pop_back();
  EXPECT_THAT(try_decode(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = enc;
  bad.payload.push_back('\0');
  EXPECT_THAT(try_decode(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = enc;
  bad.numel = n + 1;
  EXPECT_THAT(try_decode(bad), StatusIs(absl::StatusCode::kInvalidArgument));
  for (size_t i = 0; i < std::min<size_t>(enc.payload.size(), 64); ++i) {
    bad = enc;
    bad.payload[i] = static_cast<char>(bad.payload[i] ^ 0xff);
    std::vector<float> cpu_out(n, 42.0f);
    const absl::Status cpu_status =
        (*cpu)->DecodeAccumulate(EncodedView::Of(bad), 1.0f, absl::MakeSpan(cpu_out));
    float* d_try = dev.Upload(sentinel);
    const EncodedView v = EncodedView::Of(bad);
    const size_t scratch = (*decoder)->DecodeScratchBytes(v);
    void* d_scratch = dev.Alloc<uint8_t>(scratch);
    const absl::Status gpu_status =
        (*decoder)->Decode(v, 1.0f, true, d_try, n, d_scratch, scratch, dev.stream());
    EXPECT_EQ(gpu_status.ok(), cpu_status.ok()) << "byte " << i << ": " << gpu_status;
    if (gpu_status.ok() && cpu_status.ok()) {
      EXPECT_EQ(dev.Download(d_try, n), cpu_out) << "byte " << i;
    }
    if (!gpu_status.ok()) {
      EXPECT_EQ(dev.Download(d_try, n), sentinel) << "byte " << i;
    }
  }
  EXPECT_EQ(dev.Download(d_out, n), sentinel);
}

INSTANTIATE_TEST_SUITE_P(Builtin, GpuCodecs, ::testing::ValuesIn(Specs()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s;
                           for (char c : p.param) s += std::isalnum(c) ? c : '_';
                           return s;
                         });

TEST(GpuCodecRegistry, HasAGpuCodecForEachCpuCodecItNamesAndRefusesUnknownOnes) {
  auto gpu = NewBuiltinGpuCodecRegistry();
  auto cpu = NewBuiltinCodecRegistry();
  for (const std::string& name : gpu->Names()) {
    auto codec = gpu->Create(name);
    ASSERT_THAT(codec, IsOk()) << name;
    auto cpu_codec = cpu->Create(name);
    ASSERT_THAT(cpu_codec, IsOk()) << name;
    EXPECT_EQ((*codec)->Name(), (*cpu_codec)->Name());
  }
  EXPECT_THAT(gpu->Create("nope"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(gpu->Create("topk:ratio=2"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(gpu->Create("fp16:bogus=1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GpuCodecScratch, TooSmallAScratchIsAnErrorNotAnOverrun) {
  SKIP_WITHOUT_GPU();
  auto gpu = NewBuiltinGpuCodecRegistry();
  auto codec = gpu->Create("fp16");
  ASSERT_THAT(codec, IsOk());
  DeviceScope dev;
  float* d_x = dev.Upload(std::vector<float>(1000, 1.0f));
  void* d_scratch = dev.Alloc<uint8_t>(16);
  EncodedTensor out;
  EXPECT_THAT((*codec)->Encode(d_x, 1000, {}, d_scratch, 16, dev.stream(), &out),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tern::cuda
