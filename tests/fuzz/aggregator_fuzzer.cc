// libFuzzer target for what the aggregator does with bytes from outside: a client's update (the
// bytes parse as a TensorBundle, then Aggregator::Push checks and accumulates it) and a
// checkpoint file (Aggregator::Create resumes from it or refuses it). The first byte picks which.
// Any input must give OK or an error; the model must stay finite.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "server/aggregator.h"

namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

tern::AggregatorOptions Options() {
  tern::AggregatorOptions o;
  o.run_id = "f";
  o.total_rounds = 1000000;
  o.policy.clients_per_round = 2;
  o.policy.min_replies = 2;
  o.task.mutable_local()->set_local_epochs(1);
  o.task.mutable_local()->set_batch(8);
  o.task.mutable_local()->set_lr(0.1f);
  o.task.set_update_codec("none");
  o.rule = "median";  // keeps updates: exercises the pending path too
  o.max_params = 1 << 16;
  return o;
}

struct Fixture {
  tern::ServerRegistries registries = tern::NewBuiltinServerRegistries();
  const tern::CodecRegistry* codecs = registries.codecs.get();
  std::unique_ptr<tern::Aggregator> agg;
  std::string ckpt_path;
  Fixture() {
    agg = *tern::Aggregator::Create(Options(), &registries, kNow);
    for (int i = 0; i < 2; ++i) {
      tern::v1::JoinRequest j;
      j.set_run_id("f");
      j.set_client_id(-1);
      j.set_num_samples(1);
      absl::Status s;
      agg->Join(j, kNow, &s);
    }
    tern::ParamTensor a{"a", {4, 8}, 0, 32}, b{"b", {32}, 32, 32};
    auto model = tern::FlatToBundle({a, b}, std::vector<float>(64, 0.5f));
    if (!agg->InitModel(0, *model).ok() || !agg->Tick(kNow).ok()) std::abort();
    char tmpl[] = "/tmp/tern-fuzz-ckpt-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) std::abort();
    close(fd);
    ckpt_path = tmpl;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  if (size < 2) return 0;
  if (data[0] & 1) {  // a checkpoint file
    std::ofstream(f->ckpt_path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
    tern::AggregatorOptions o = Options();
    o.checkpoint_path = f->ckpt_path;
    auto a = tern::Aggregator::Create(o, &f->registries, kNow);
    if (a.ok()) (void)(*a)->Tick(kNow);
    return 0;
  }
  tern::v1::TensorBundle bundle;
  if (!bundle.ParseFromArray(data + 2, static_cast<int>(size - 2))) return 0;
  tern::v1::UpdateInfo info;
  info.set_client_id(data[1] & 3);
  info.set_round(bundle.round());
  info.set_weight(1.0 + (data[1] >> 2));
  (void)f->agg->Push(info, bundle, size, kNow);
  (void)f->agg->Tick(kNow);  // closes the round when both replied, then opens the next
  auto m = f->agg->Model(0);
  if (!m.ok()) std::abort();
  std::vector<float> x(64);
  if (!tern::BundleToFlat(*m->bundle, f->agg->layout(), *f->codecs, absl::MakeSpan(x)).ok()) {
    std::abort();
  }
  for (float v : x) {
    if (!std::isfinite(v)) std::abort();
  }
  return 0;
}
