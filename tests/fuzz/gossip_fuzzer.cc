// libFuzzer target for what a worker does with a peer's or a trainer's bundle: the bytes parse
// as a TensorBundle (or not), then go through RoundEngine::Deliver (a gossip message) and
// BundleToFlat / LayoutFromBundle (a gradient or a registration), and StateSliceFromBundle (the
// group's state a rejoining worker takes from a peer). Any input must give OK or an
// error; an accepted gossip message must have passed every check.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "worker/engine.h"
#include "worker/state_share.h"

namespace {

struct Fixture {
  tern::WorkerRegistries registries = tern::NewBuiltinWorkerRegistries();
  std::unique_ptr<tern::RoundEngine> engine, choco;
  std::vector<tern::ParamTensor> layout;
  Fixture() {
    tern::EngineOptions o;
    o.worker_id = 0;
    o.num_workers = 4;
    o.algorithm = "heavy-ball";  // two parts per message
    engine = *tern::RoundEngine::Create(o, &registries, nullptr);
    o.algorithm = "choco";  // "q", and "hat" when asked for
    choco = *tern::RoundEngine::Create(o, &registries, nullptr);
    tern::ParamTensor a{"a", {4, 8}, 0, 32}, b{"b", {32}, 32, 32};
    layout = {a, b};
    if (!engine->Init(layout, std::vector<float>(64, 0.5f)).ok()) std::abort();
    if (!choco->Init(layout, std::vector<float>(64, 0.5f)).ok()) std::abort();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  tern::v1::TensorBundle bundle;
  if (!bundle.ParseFromArray(data, static_cast<int>(size))) return 0;
  // Accepted messages stay in the inbox (later duplicates are refused): fine, both are answers.
  (void)f->engine->Deliver(bundle, size);
  (void)f->choco->Deliver(bundle, size);
  std::vector<float> out(64);
  (void)tern::BundleToFlat(bundle, f->layout, *f->registries.codecs, absl::MakeSpan(out));
  auto state = tern::StateSliceFromBundle(bundle, "tern", 64, 0, 1, *f->registries.codecs);
  if (state.ok() &&
      (state->theta.size() != 64 || (!state->momentum.empty() && state->momentum.size() != 64))) {
    std::abort();
  }
  // The same bytes as slice 2 of 3 (values 42..63), as a joiner taking slices reads them.
  auto slice = tern::StateSliceFromBundle(bundle, "tern", 64, 2, 3, *f->registries.codecs);
  if (slice.ok() &&
      (slice->theta.size() != 22 || (!slice->momentum.empty() && slice->momentum.size() != 22))) {
    std::abort();
  }
  auto layout = tern::LayoutFromBundle(bundle, 1 << 20);
  if (layout.ok()) {
    uint64_t total = 0;
    for (const auto& p : *layout) {
      if (p.offset != total) std::abort();
      total += p.numel;
    }
    if (total > (1 << 20)) std::abort();
  }
  return 0;
}
