#include "clients/c/tern_c.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/crc32.h"
#include "core/federated/secagg.h"
#include "core/model/bundle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {
namespace {

using ::testing::HasSubstr;

// Two tensors, 6 + 2 values.
std::vector<ParamTensor> TwoTensors() {
  ParamTensor w{"w", {2, 3}, 0, 6};
  ParamTensor b{"b", {2}, 6, 2};
  return {w, b};
}

std::string Serialized(const google::protobuf::Message& m) { return m.SerializeAsString(); }

std::string Bundle(absl::Span<const float> values) {
  return Serialized(*FlatToBundle(TwoTensors(), values));
}

v1::Task Train(uint32_t round, v1::Task::Payload payload) {
  v1::Task t;
  t.set_kind(v1::Task::TRAIN);
  t.set_round(round);
  t.set_payload(payload);
  return t;
}

// A model made from a bundle, freed at scope exit.
class Model {
 public:
  explicit Model(absl::Span<const float> initial) {
    const std::string b = Bundle(initial);
    char error[256] = "";
    EXPECT_EQ(tern_client_model_new(b.data(), b.size(), &m_, error, sizeof(error)), 0) << error;
  }
  ~Model() { tern_client_model_free(m_); }
  TernClientModel* get() const { return m_; }
  std::vector<float> values() const {
    const float* v = tern_client_model_values(m_);
    return std::vector<float>(v, v + tern_client_model_size(m_));
  }
  // tern_client_model_update's return code; `usable` its flag.
  int Update(const v1::Task& task, const std::string& payload, int* usable, std::string* error) {
    const std::string t = Serialized(task);
    char e[256] = "";
    const int rc = tern_client_model_update(m_, t.data(), t.size(), payload.data(), payload.size(),
                                            usable, e, sizeof(e));
    *error = e;
    return rc;
  }
  // The encoded update decoded back, or empty on an error (in *error).
  std::vector<float> EncodeDecoded(const v1::Task& task, absl::Span<const float> update,
                                   std::string* error = nullptr) {
    const std::string t = Serialized(task);
    void* out = nullptr;
    size_t size = 0;
    char e[256] = "";
    const int rc = tern_client_model_encode(m_, t.data(), t.size(), 3, 100, update.data(),
                                            update.size(), &out, &size, e, sizeof(e));
    if (error != nullptr) *error = e;
    if (rc != 0) return {};
    v1::TensorBundle b;
    EXPECT_TRUE(b.ParseFromArray(out, static_cast<int>(size)));
    tern_free(out);
    std::vector<float> x(8);
    EXPECT_TRUE(BundleToFlat(b, TwoTensors(), *NewBuiltinCodecRegistry(), absl::MakeSpan(x)).ok());
    return x;
  }

 private:
  TernClientModel* m_ = nullptr;
};

const std::vector<float> kInitial = {1, 2, 3, 4, 5, 6, 7, 8};

TEST(CApi, AModelStartsAsItsInitialBundleAtRoundZeroWithItsCrc) {
  EXPECT_EQ(tern_c_api_version(), TERN_C_API_VERSION);
  Model m(kInitial);
  EXPECT_EQ(m.values(), kInitial);
  EXPECT_EQ(tern_client_model_have_round(m.get()), 0);
  EXPECT_EQ(tern_client_model_have_crc32(m.get()), Crc32(kInitial.data(), 4 * kInitial.size()));
  EXPECT_EQ(tern_client_model_have_optimizer_state(m.get()), 0);
}

TEST(CApi, DeltasFromTheRoundItHasCatchUpExactlyAndOthersAskForTheModel) {
  Model m(kInitial);
  // Round 1's update, sent as the delta that brings round 0 to round 1 (task round 2).
  const std::vector<float> delta = {0.5f, 0, 0, 0, 0, 0, 0, -1};
  v1::TensorBundle d = *FlatToBundle(TwoTensors(), delta);
  for (v1::NamedTensor& nt : *d.mutable_tensors()) nt.set_name("1:" + nt.name());
  std::vector<float> want = kInitial;
  want[0] += 0.5f;
  want[7] -= 1;
  v1::Task task = Train(2, v1::Task::DELTAS);
  task.set_delta_from(0);
  task.set_model_crc32(Crc32(want.data(), 4 * want.size()));
  int usable = -1;
  std::string error;
  ASSERT_EQ(m.Update(task, Serialized(d), &usable, &error), 0) << error;
  EXPECT_EQ(usable, 1);
  EXPECT_EQ(m.values(), want);
  EXPECT_EQ(tern_client_model_have_round(m.get()), 1);
  // Deltas from a round this copy does not have: skip the round, ask for the model.
  task.set_round(4);
  task.set_delta_from(2);
  ASSERT_EQ(m.Update(task, Serialized(d), &usable, &error), 0) << error;
  EXPECT_EQ(usable, 0);
  EXPECT_THAT(tern_client_model_why_not(m.get()), HasSubstr("from round 2 for a copy of round 1"));
  EXPECT_EQ(tern_client_model_have_round(m.get()), -1);
  // The model itself mends it.
  const std::vector<float> model = {9, 9, 9, 9, 9, 9, 9, 9};
  v1::Task full = Train(4, v1::Task::MODEL);
  full.set_model_crc32(Crc32(model.data(), 4 * model.size()));
  ASSERT_EQ(m.Update(full, Bundle(model), &usable, &error), 0) << error;
  EXPECT_EQ(usable, 1);
  EXPECT_EQ(m.values(), model);
  EXPECT_EQ(tern_client_model_have_round(m.get()), 3);
}

TEST(CApi, AModelThatFailsItsCrcIsNotUsed) {
  Model m(kInitial);
  v1::Task full = Train(2, v1::Task::MODEL);
  full.set_model_crc32(Crc32(kInitial.data(), 4 * kInitial.size()) ^ 1);
  int usable = -1;
  std::string error;
  ASSERT_EQ(m.Update(full, Bundle(kInitial), &usable, &error), 0) << error;
  EXPECT_EQ(usable, 0);
  EXPECT_THAT(tern_client_model_why_not(m.get()), HasSubstr("CRC"));
  EXPECT_EQ(tern_client_model_have_round(m.get()), -1);
}

// Top-k of a quarter with error feedback: what a round leaves out goes in the next rounds, so
// four rounds (the last three with nothing new) deliver the update exactly.
TEST(CApi, ErrorFeedbackDeliversWhatTopKLeftOutInLaterRounds) {
  Model m(kInitial);
  v1::Task task = Train(1, v1::Task::MODEL);
  task.set_update_codec("topk:ratio=0.25");
  task.set_error_feedback(true);
  const std::vector<float> u = {8, -7, 6, -5, 4, -3, 2, -1};
  std::vector<float> sum(8, 0.0f);
  for (int round = 1; round <= 4; ++round) {
    task.set_round(round);
    std::vector<float> sent = m.EncodeDecoded(task, round == 1 ? u : std::vector<float>(8, 0));
    ASSERT_EQ(sent.size(), 8u);
    int nonzero = 0;
    for (size_t i = 0; i < 8; ++i) {
      nonzero += sent[i] != 0;
      sum[i] += sent[i];
    }
    EXPECT_LE(nonzero, 2 + 1) << "round " << round;  // a quarter of each tensor, rounded up
  }
  EXPECT_EQ(sum, u);
}

// SparseLoCo (--outer=sparseloco): the residual decays by the task's factor before the next
// update joins it, so what top-k left out comes back halved at 0.5.
TEST(CApi, AResidualDecayScalesWhatErrorFeedbackSendsLater) {
  Model m(kInitial);
  v1::Task task = Train(1, v1::Task::MODEL);
  task.set_update_codec("topk:ratio=0.25");
  task.set_error_feedback(true);
  task.set_residual_decay(0.5f);
  const std::vector<float> u = {8, -7, 6, -5, 4, -3, 2, -1};
  EXPECT_EQ(m.EncodeDecoded(task, u), (std::vector<float>{8, -7, 0, 0, 0, 0, 2, 0}));
  task.set_round(2);
  // w's residual (0, 0, 6, -5, 4, -3) and b's (0, -1), halved; top-2 of w, top-1 of b.
  EXPECT_EQ(m.EncodeDecoded(task, std::vector<float>(8, 0)),
            (std::vector<float>{0, 0, 3, -2.5f, 0, 0, 0, -0.5f}));
  task.set_residual_decay(1.5f);
  std::string error;
  EXPECT_TRUE(m.EncodeDecoded(task, u, &error).empty());
  EXPECT_THAT(error, HasSubstr("residual decay is 1.5"));
}

// DP-FedAvg (Task.dp_clip): an update over the clip norm leaves scaled to it, one within it as
// it is, whatever the client language (every one encodes through ClientModel).
TEST(CApi, ADpTaskClipsTheUpdateToItsNormBeforeItIsEncoded) {
  Model m(kInitial);
  v1::Task task = Train(1, v1::Task::MODEL);
  task.set_update_codec("none");
  task.set_dp_clip(5);
  // Norm 10: halved.
  EXPECT_EQ(m.EncodeDecoded(task, {6, 0, 0, 0, 8, 0, 0, 0}),
            (std::vector<float>{3, 0, 0, 0, 4, 0, 0, 0}));
  task.set_round(2);
  EXPECT_EQ(m.EncodeDecoded(task, {3, 0, 0, 0, 0, 0, 0, 0}),
            (std::vector<float>{3, 0, 0, 0, 0, 0, 0, 0}));
}

// Signum's memory (Task.memory "momentum:beta=B"): each round the client sends its momentum
// m = B m + (1 - B) u instead of u; an exact tensor goes as it is.
TEST(CApi, AMomentumMemorySendsTheMomentumOfTheUpdates) {
  Model m(kInitial);
  const uint8_t flags[] = {0, 1};  // "b" is exact
  char error[128] = "";
  ASSERT_EQ(tern_client_model_set_exact(m.get(), flags, 2, error, sizeof(error)), 0) << error;
  v1::Task task = Train(1, v1::Task::MODEL);
  task.set_update_codec("none");
  task.set_memory("momentum:beta=0.5");
  const std::vector<float> u = {8, -4, 2, 0, 6, -2, 4, 8};
  EXPECT_EQ(m.EncodeDecoded(task, u), (std::vector<float>{4, -2, 1, 0, 3, -1, 4, 8}));
  task.set_round(2);
  EXPECT_EQ(m.EncodeDecoded(task, std::vector<float>(8, 0)),
            (std::vector<float>{2, -1, 0.5f, 0, 1.5f, -0.5f, 0, 0}));
  // With the sign codec: the momentum's signs, where the round's update alone would flip them.
  task.set_round(3);
  task.set_update_codec("sign:chunk=8");
  const std::vector<float> sent = m.EncodeDecoded(task, {-1, 0.5f, -0.5f, 0, -1, 0.5f, 1, 1});
  ASSERT_EQ(sent.size(), 8u);
  EXPECT_GT(sent[0], 0);
  EXPECT_LT(sent[1], 0);
  task.set_memory("momentum:beta=2");
  std::string why;
  EXPECT_TRUE(m.EncodeDecoded(task, u, &why).empty());
  EXPECT_THAT(why, HasSubstr("beta"));
}

// A tensor marked exact (BatchNorm's running statistics) goes whole as fp32 every round, and
// error feedback keeps nothing of it; the others stay in the task's codec.
TEST(CApi, ExactTensorsGoWholeOutsideErrorFeedback) {
  Model m(kInitial);
  const uint8_t flags[] = {0, 1};  // "b" is exact
  char error[128] = "";
  ASSERT_EQ(tern_client_model_set_exact(m.get(), flags, 2, error, sizeof(error)), 0) << error;
  v1::Task task = Train(1, v1::Task::MODEL);
  task.set_update_codec("topk:ratio=0.25");
  task.set_error_feedback(true);
  const std::vector<float> u = {8, -7, 6, -5, 4, -3, 2, -1};
  std::vector<float> sent = m.EncodeDecoded(task, u);
  ASSERT_EQ(sent.size(), 8u);
  EXPECT_EQ(sent[6], 2);
  EXPECT_EQ(sent[7], -1);
  task.set_round(2);
  sent = m.EncodeDecoded(task, std::vector<float>(8, 0));
  EXPECT_EQ(sent[6], 0) << "the residual kept part of an exact tensor";
  EXPECT_EQ(sent[7], 0);
  EXPECT_EQ(sent[2], 6) << "w's residual was lost";
  EXPECT_EQ(tern_client_model_set_exact(m.get(), flags, 1, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("1 flags for a model of 2 tensors"));
}

// Secure aggregation through the C API: three clients' stages, against the server's side in
// process, unmask to the mean of their updates, the one over the task's DP clip clipped; a task
// without secure aggregation is refused.
TEST(CApi, ThreeClientsSecureStagesUnmaskToTheMeanOfTheirClippedUpdates) {
  v1::Task task = Train(1, v1::Task::MODEL);
  v1::SecAggParams* p = task.mutable_secagg();
  p->set_threshold(2);
  p->set_neighbours(2);
  p->set_modulus_bits(24);
  p->set_levels(1u << 16);
  p->set_clip_range(1.0f);
  task.set_dp_clip(1.0f);
  const std::string t = Serialized(task);
  char error[256] = "";
  TernSecAgg* clients[3] = {};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tern_secagg_new(t.data(), t.size(), i, &clients[i], error, sizeof(error)), 0)
        << error;
  }
  const auto take = [](void* out, size_t size) {
    std::string bytes(static_cast<const char*>(out), size);
    tern_free(out);
    return bytes;
  };
  void* out = nullptr;
  size_t size = 0;
  SecAggServerRound server(*p, task.round(), 8, 7);
  for (TernSecAgg* c : clients) {
    ASSERT_EQ(tern_secagg_keys(c, &out, &size, error, sizeof(error)), 0) << error;
    v1::SecAggKeys keys;
    ASSERT_TRUE(keys.ParseFromString(take(out, size)));
    ASSERT_TRUE(server.AddKeys(keys).ok());
  }
  ASSERT_TRUE(server.CloseKeys().ok());
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string nb = server.KeysFor(i)->SerializeAsString();
    ASSERT_EQ(
        tern_secagg_share(clients[i], nb.data(), nb.size(), &out, &size, error, sizeof(error)), 0)
        << error;
    v1::SecAggShares shares;
    ASSERT_TRUE(shares.ParseFromString(take(out, size)));
    ASSERT_TRUE(server.AddShares(shares).ok());
  }
  ASSERT_TRUE(server.CloseShares().ok());
  const std::vector<std::vector<float>> updates = {
      {0.1f, 0, 0, 0, 0, 0, 0, 0}, {-0.2f, 0.3f, 0, 0, 0, 0, 0, 0}, {3, 0, 0, 0, 4, 0, 0, 0}};
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string sh = server.SharesFor(i)->SerializeAsString();
    ASSERT_EQ(tern_secagg_mask(clients[i], sh.data(), sh.size(), updates[i].data(), 8, &out, &size,
                               error, sizeof(error)),
              0)
        << error;
    ASSERT_TRUE(server.AddMasked(i, task.round(), take(out, size)).ok());
  }
  ASSERT_TRUE(server.CloseMasked().ok());
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string ask = server.UnmaskRequestFor(i)->SerializeAsString();
    ASSERT_EQ(
        tern_secagg_reveal(clients[i], ask.data(), ask.size(), &out, &size, error, sizeof(error)),
        0)
        << error;
    v1::SecAggReveal reveal;
    ASSERT_TRUE(reveal.ParseFromString(take(out, size)));
    ASSERT_TRUE(server.AddReveal(reveal).ok());
  }
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  // Client 2's norm 5 clipped to 1: (0.6, 0.8) at positions 0 and 4.
  const std::vector<float> want = {(0.1f - 0.2f + 0.6f) / 3, 0.1f, 0, 0, 0.8f / 3, 0, 0, 0};
  for (int j = 0; j < 8; ++j) EXPECT_NEAR(result->mean[j], want[j], 1e-4) << j;
  for (TernSecAgg* c : clients) tern_secagg_free(c);

  TernSecAgg* none = nullptr;
  const std::string plain = Serialized(Train(1, v1::Task::MODEL));
  EXPECT_EQ(tern_secagg_new(plain.data(), plain.size(), 0, &none, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("Task.secagg"));
  EXPECT_EQ(none, nullptr);
}

TEST(CApi, BadBytesAndSizesAreInvalidArgumentsWithAMessage) {
  const std::string garbage = "\xff\xff\xff\x0f not a protobuf";
  TernClientModel* none = nullptr;
  char error[256] = "";
  EXPECT_EQ(tern_client_model_new(garbage.data(), garbage.size(), &none, error, sizeof(error)), 3);
  EXPECT_EQ(none, nullptr);
  EXPECT_THAT(error, HasSubstr("TensorBundle"));
  const std::string empty;
  EXPECT_EQ(tern_client_model_new(empty.data(), 0, &none, error, sizeof(error)), 3);
  EXPECT_THAT(error, HasSubstr("no tensors"));

  Model m(kInitial);
  int usable = -1;
  std::string e;
  const std::string good = Bundle(kInitial);
  // A truncated payload, a task that is not a task, a payload of another layout.
  EXPECT_EQ(m.Update(Train(2, v1::Task::MODEL), good.substr(0, good.size() / 2), &usable, &e), 3);
  EXPECT_THAT(e, HasSubstr("payload"));
  const std::string t = Serialized(Train(2, v1::Task::MODEL));
  EXPECT_EQ(tern_client_model_update(m.get(), garbage.data(), garbage.size(), good.data(),
                                     good.size(), &usable, error, sizeof(error)),
            3);
  EXPECT_THAT(error, HasSubstr("the task"));
  ParamTensor big{"w", {3, 3}, 0, 9};
  const std::vector<float> nine(9, 1.0f);
  EXPECT_EQ(
      m.Update(Train(2, v1::Task::MODEL), Serialized(*FlatToBundle({big}, nine)), &usable, &e), 3);
  EXPECT_EQ(m.values(), kInitial) << "a refused payload changed the model";
  EXPECT_EQ(tern_client_model_have_round(m.get()), -1) << "a failed update must ask for the model";
  // An update of the wrong size; an error that does not fit is cut and terminated.
  const std::vector<float> seven(7, 1.0f);
  EXPECT_TRUE(m.EncodeDecoded(Train(2, v1::Task::MODEL), seven, &e).empty());
  EXPECT_THAT(e, HasSubstr("7 values; the model has 8"));
  char tiny[5];
  std::memset(tiny, 'x', sizeof(tiny));
  void* out = nullptr;
  size_t size = 0;
  EXPECT_EQ(tern_client_model_encode(m.get(), t.data(), t.size(), 0, 1, seven.data(), seven.size(),
                                     &out, &size, tiny, sizeof(tiny)),
            3);
  EXPECT_EQ(std::strlen(tiny), 4u);
  EXPECT_EQ(out, nullptr);
  // A codec the registry does not know.
  v1::Task unknown = Train(2, v1::Task::MODEL);
  unknown.set_update_codec("zstd");
  EXPECT_TRUE(m.EncodeDecoded(unknown, kInitial, &e).empty());
  EXPECT_THAT(e, HasSubstr("zstd"));
}

}  // namespace
}  // namespace tern
