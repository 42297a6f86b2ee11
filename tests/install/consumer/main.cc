// Compresses a gradient with a tern codec, ships it as a tern.v1 bundle in CRC-checked chunks,
// and reads it back: what a C++ trainer of its own does with the installed libraries.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/chunking.h"
#include "kernels/builtin.h"
#include "kernels/codec.h"
#include "kernels/wire.h"
#include "tern/v1/tensor.pb.h"

int main() {
  std::vector<float> grad(1000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = (i % 10 == 0) ? 1.0f + i : 0.001f;
  auto registry = tern::NewBuiltinCodecRegistry();
  auto codec = registry->Create("topk:ratio=0.1");
  if (!codec.ok()) return 1;
  tern::EncodedTensor enc;
  if (!(*codec)->Encode(grad, {.seed = 1}, &enc).ok()) return 2;

  tern::v1::TensorBundle bundle;
  bundle.set_run_id("consumer");
  tern::v1::NamedTensor* t = bundle.add_tensors();
  t->set_name("grad");
  const std::string codec_name = enc.codec;
  tern::ToProto(std::move(enc), t->mutable_tensor());
  auto chunks = tern::ChunkBundle(bundle, /*stream_id=*/1, /*max_chunk_bytes=*/64);
  if (!chunks.ok()) return 3;
  tern::BundleAssembler assembler(1 << 20);
  for (const auto& c : *chunks) {
    if (!assembler.Add(c).ok()) return 4;
  }
  auto back = assembler.Finish();
  if (!back.ok()) return 5;

  std::vector<float> decoded(grad.size(), 0.0f);
  auto view = tern::ViewOf(back->tensors(0).tensor());
  if (!view.ok() || !(*codec)->DecodeAccumulate(*view, 1.0f, absl::MakeSpan(decoded)).ok())
    return 6;
  int kept = 0;
  for (size_t i = 0; i < grad.size(); ++i) kept += decoded[i] == grad[i] ? 1 : 0;
  std::printf("%s: %zu chunks, %d of %zu values kept exactly (top 10 %%)\n", codec_name.c_str(),
              chunks->size(), kept, grad.size());
  return kept >= 100 ? 0 : 7;
}
