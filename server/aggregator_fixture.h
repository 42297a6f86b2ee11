// The fixture of the aggregator's tests (aggregator_test.cc, checkpoint_test.cc): a 9-value
// model of two tensors, clients that join, and their updates.
#ifndef TERN_SERVER_AGGREGATOR_FIXTURE_H_
#define TERN_SERVER_AGGREGATOR_FIXTURE_H_

#include <stdlib.h>

#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/model/bundle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "server/aggregator.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace testing_fixture {

using ::tern::testing::IsOk;

inline const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A two-tensor model: w [2, 3] and b [3].
inline std::vector<ParamTensor> Layout() {
  ParamTensor w{"w", {2, 3}, 0, 6}, b{"b", {3}, 6, 3};
  return {w, b};
}
inline const std::vector<float> kX0 = {1, 2, 3, 4, 5, 6, 7, 8, 9};

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline std::string TempPath(const std::string& name) {
  std::string t = absl::StrCat(::testing::TempDir(), "/tern-agg-XXXXXX");
  char* d = mkdtemp(t.data());
  return absl::StrCat(d, "/", name);
}

class AggregatorTest : public ::testing::Test {
 protected:
  AggregatorTest() : registries_(NewBuiltinServerRegistries()), codecs_(registries_.codecs.get()) {
    options_.run_id = std::string(1, 'r');  // not = "r": GCC 12 misreads that inlined (-Wrestrict)
    options_.total_rounds = 5;
    options_.policy.clients_per_round = 3;
    options_.policy.min_replies = 3;
    options_.policy.grace = absl::Seconds(1);
    options_.policy.deadline = absl::Seconds(10);
    options_.task.mutable_local()->set_local_epochs(1);
    options_.task.mutable_local()->set_batch(8);
    options_.task.mutable_local()->set_lr(0.1f);
    options_.task.set_update_codec("none");
  }

  // Creates the aggregator, joins `n` clients, gives it kX0 and opens round 1.
  std::unique_ptr<Aggregator> Start(int n, absl::Time now = kT0) {
    auto a = Aggregator::Create(options_, &registries_, now);
    EXPECT_THAT(a, IsOk());
    if (!a.ok()) return nullptr;
    for (int i = 0; i < n; ++i) {
      v1::JoinRequest j;
      j.set_run_id("r");
      j.set_name(absl::StrCat("c", i));
      j.set_num_samples(10);
      j.set_client_id(-1);
      absl::Status s;
      (*a)->Join(j, now, &s);
      EXPECT_THAT(s, IsOk());
    }
    if ((*a)->layout().empty()) {
      auto b = FlatToBundle(layout_, x0_);
      EXPECT_THAT(b, IsOk());
      if (b.ok()) {
        EXPECT_THAT((*a)->InitModel(0, *b), IsOk());
      }
    }
    EXPECT_THAT((*a)->Tick(now), IsOk());
    return *std::move(a);
  }

  v1::TensorBundle Update(const std::vector<float>& delta, int64_t round,
                          const std::string& codec = "none") {
    auto c = codecs_->Create(codec);
    EXPECT_THAT(c, IsOk());
    if (!c.ok()) return {};
    auto b = EncodeFlatToBundle(layout_, delta, **c, EncodeOptions(), nullptr);
    EXPECT_THAT(b, IsOk());
    if (!b.ok()) return {};
    b->set_run_id("r");
    b->set_round(static_cast<uint64_t>(round));
    return *b;
  }

  absl::StatusOr<v1::UpdateReply> Push(Aggregator& a, uint32_t client, int64_t round, double weight,
                                       const std::vector<float>& delta, absl::Time now = kT0) {
    v1::UpdateInfo info;
    info.set_client_id(client);
    info.set_round(static_cast<uint64_t>(round));
    info.set_weight(weight);
    info.set_loss(1.0f);
    return a.Push(info, Update(delta, round), 100, now);
  }

  // What NormalizeAggregatorOptions makes of the fixture's options after `change`.
  absl::Status Normalized(const std::function<void(AggregatorOptions&)>& change) const {
    AggregatorOptions o = options_;
    change(o);
    return NormalizeAggregatorOptions(std::move(o), *codecs_).status();
  }

  std::vector<float> ModelOf(const Aggregator& a, int64_t round = 0) {
    auto m = a.Model(round);
    EXPECT_THAT(m, IsOk());
    std::vector<float> x(x0_.size());
    if (!m.ok()) return x;
    EXPECT_THAT(BundleToFlat(*m->bundle, layout_, *codecs_, absl::MakeSpan(x)), IsOk());
    return x;
  }

  ServerRegistries registries_;
  const CodecRegistry* codecs_;
  AggregatorOptions options_;
  std::vector<ParamTensor> layout_ = Layout();
  std::vector<float> x0_ = kX0;
};

}  // namespace testing_fixture
}  // namespace tern

#endif  // TERN_SERVER_AGGREGATOR_FIXTURE_H_
