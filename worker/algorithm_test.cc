#include "worker/algorithm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/data.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

// n workers in one process, worker i minimising 0.5 |x - b_i|^2 (so the global optimum is the
// mean of the b_i), gossiping over `topology` with exact gradients.
struct Simulation {
  std::unique_ptr<CodecRegistry> codecs = NewBuiltinCodecRegistry();
  std::unique_ptr<AlgorithmRegistry> algorithms = NewBuiltinAlgorithmRegistry();
  std::vector<std::unique_ptr<Algorithm>> workers;
  std::vector<std::vector<float>> targets;
  std::vector<float> optimum;
  size_t bytes_sent = 0;
  // Optional: (receiver, sender) -> the message the receiver gets instead in round forge_round,
  // made from the sender's honest one.
  std::function<GossipMessage(int, int, const GossipMessage&)> forge;
  int64_t forge_round = -1;
  // Workers not running (not started yet, or down): they take no step, and their neighbours'
  // rows drop them, as the engine drops a silent neighbour.
  std::set<int> absent;

  // `customize` may register codecs of the test's own before the workers are made.
  Simulation(const std::string& name, const AlgorithmOptions& o, int n, size_t d,
             std::vector<TensorBlock> blocks = {},
             const std::function<void(CodecRegistry&)>& customize = nullptr) {
    if (customize) customize(*codecs);
    optimum.assign(d, 0.0f);
    for (int i = 0; i < n; ++i) {
      targets.push_back(testing::Gaussian(d, 100 + i));
      for (size_t k = 0; k < d; ++k) optimum[k] += targets[i][k] / n;
      auto a = algorithms->Create(name, o, codecs.get());
      EXPECT_THAT(a, IsOk());
      if (!a.ok()) return;
      EXPECT_THAT((*a)->Init(std::vector<float>(d, 0.0f), i, blocks), IsOk());
      workers.push_back(std::move(*a));
    }
  }

  // With `overlap`, as the engine's overlap mode orders things: step t's gradient is taken
  // before round t-1's messages are mixed in (they are mixed just before step t's Prepare). Steps
  // are numbered from `first`.
  void Run(const std::string& topology, int steps, float lr, bool overlap = false,
           int64_t first = 0) {
    auto topo = NewBuiltinTopologyRegistry()->Create(topology);
    ASSERT_THAT(topo, IsOk());
    const int n = static_cast<int>(workers.size());
    std::vector<GossipMessage> pending;
    int64_t pending_round = -1;
    for (int64_t t = first; t < first + steps; ++t) {
      std::vector<std::vector<float>> grads(n);
      for (int i = 0; i < n; ++i) {
        if (absent.contains(i)) continue;
        auto x = workers[i]->params();
        grads[i].resize(x.size());
        for (size_t k = 0; k < x.size(); ++k) grads[i][k] = x[k] - targets[i][k];
      }
      if (pending_round >= 0) {
        Mix(**topo, pending_round, pending);
        pending_round = -1;
      }
      std::vector<GossipMessage> msgs(n);
      bool talk = false;
      for (int i = 0; i < n; ++i) {
        if (absent.contains(i)) continue;
        auto m = workers[i]->Prepare(grads[i], lr, t);
        ASSERT_THAT(m, IsOk());
        msgs[i] = std::move(*m);
        talk = workers[i]->Communicates(t);
      }
      if (!talk) {
        for (auto& w : workers) w->Settle();
        continue;
      }
      // The engine mixes the last round without waiting for a next step.
      if (overlap && t + 1 < first + steps) {
        pending = std::move(msgs);
        pending_round = t;
      } else {
        Mix(**topo, t, msgs);
      }
      for (auto& w : workers) w->Settle();  // as the engine does at the end of every step
    }
  }

  void Mix(Topology& topo, int64_t round, const std::vector<GossipMessage>& msgs) {
    const int n = static_cast<int>(workers.size());
    auto rows = MixingWeights(*topo.GraphFor(n, round), WeightRule::kAuto);
    ASSERT_THAT(rows, IsOk());
    std::map<int, GossipMessage> forged;
    const std::vector<int> silent(absent.begin(), absent.end());
    for (int i = 0; i < n; ++i) {
      if (absent.contains(i)) continue;
      if (!silent.empty()) (*rows)[i] = DropNeighbours((*rows)[i], silent);
      std::map<int, const GossipMessage*> received;
      for (const auto& [j, w] : (*rows)[i].neighbours) {
        received[j] = &msgs[j];
        bytes_sent += msgs[j].PayloadBytes();
        if (forge && round == forge_round && i == 0 && j == 1) {
          received[j] = &(forged[j] = forge(i, j, msgs[j]));
        }
      }
      ASSERT_THAT(workers[i]->Combine((*rows)[i], received), IsOk());
    }
  }

  // |mean_i x_i - optimum| / |optimum|, and the consensus distance mean_i |x_i - mean|^2 relative
  // to the heterogeneity mean_i |b_i - optimum|^2 that drives the models apart.
  std::pair<double, double> Errors() const {
    const size_t d = optimum.size();
    std::vector<double> mean(d, 0.0);
    for (const auto& w : workers) {
      for (size_t k = 0; k < d; ++k) mean[k] += w->params()[k] / workers.size();
    }
    double err = 0, norm = 0, consensus = 0;
    for (size_t k = 0; k < d; ++k) {
      err += (mean[k] - optimum[k]) * (mean[k] - optimum[k]);
      norm += optimum[k] * optimum[k];
    }
    double spread = 0;
    for (size_t i = 0; i < workers.size(); ++i) {
      for (size_t k = 0; k < d; ++k) {
        consensus += std::pow(workers[i]->params()[k] - mean[k], 2);
        spread += std::pow(targets[i][k] - optimum[k], 2);
      }
    }
    return {std::sqrt(err / norm), consensus / spread};
  }
};

// Payload bytes dense D-PSGD (no momentum) sends in `steps` steps of the 8-worker, d = 1000 run.
size_t DenseDpsgdBytes(int steps) {
  AlgorithmOptions o;
  o.momentum = 0.0;
  Simulation dense("dpsgd", o, 8, 1000);
  dense.Run("ring", steps, 0.05f);
  return dense.bytes_sent;
}

// CHOCO without momentum, gamma_c 0.3, compressing with `codec`.
AlgorithmOptions ChocoWith(const std::string& codec) {
  AlgorithmOptions o;
  o.momentum = 0.0;
  o.codec = codec;
  o.consensus_step = 0.3;
  return o;
}

// The graph an algorithm is tested over: a ring for gossip, a random matching for SwarmSGD
// (asynchronous: it averages pairwise with one random partner per interaction), the complete
// graph for an algorithm whose state the whole group shares (which the engine insists on).
std::string GraphFor(const std::string& algorithm) {
  Simulation probe(algorithm, AlgorithmOptions(), 1, 1);
  if (probe.workers.size() != 1) return "";
  if (probe.workers[0]->Asynchronous()) return "random-matching";
  return probe.workers[0]->AllToAll() ? "complete" : "ring";
}

class EveryAlgorithm : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryAlgorithm, ConvergesToTheGlobalOptimum) {
  AlgorithmOptions o;
  o.momentum = 0.5;
  const std::string graph = GraphFor(GetParam());
  // The average model follows (momentum) SGD on the mean objective, so it reaches the optimum;
  // the models stay apart by a consensus distance that shrinks with the step size (O(lr^2) for
  // gossip with a fixed W). An all-to-all algorithm's models are one after its last round.
  Simulation sim(GetParam(), o, 8, 64);
  sim.Run(graph, 400, 0.05f);
  const auto [err, consensus] = sim.Errors();
  EXPECT_LT(err, 1e-3) << GetParam();
  EXPECT_LT(consensus, 0.1) << GetParam();
  Simulation small(GetParam(), o, 8, 64);
  small.Run(graph, 1600, 0.0125f);
  const auto [err_small, consensus_small] = small.Errors();
  EXPECT_LT(err_small, 1e-3) << GetParam();
  if (graph == "complete") {
    EXPECT_EQ(consensus, 0.0) << GetParam();
  } else {
    EXPECT_GT(consensus / consensus_small, 4.0) << GetParam();
  }
}

TEST(Choco, CompressedGossipConvergesWithOverlap) {
  Simulation sparse("choco", ChocoWith("topk:ratio=0.05"), 8, 1000);
  sparse.Run("ring", 600, 0.05f, /*overlap=*/true);
  const auto [err, consensus] = sparse.Errors();
  EXPECT_LT(err, 1e-3);
  EXPECT_LT(consensus, 0.1);
}

// Every registered algorithm, by the registry's own list.
INSTANTIATE_TEST_SUITE_P(Builtin, EveryAlgorithm,
                         ::testing::ValuesIn(NewBuiltinAlgorithmRegistry()->Names()),
                         [](const auto& p) {
                           std::string s = p.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

// The algorithms with rounds (every one but the asynchronous), by the registry's own list.
std::vector<std::string> RoundAlgorithmNames() {
  std::vector<std::string> out;
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  for (const std::string& name : algorithms->Names()) {
    auto a = algorithms->Create(name, AlgorithmOptions(), codecs.get());
    if (a.ok() && !(*a)->Asynchronous()) out.push_back(name);
  }
  return out;
}

class RoundAlgorithm : public ::testing::TestWithParam<std::string> {};

// The engine's overlap mode (gradient taken before the previous round is mixed in): every
// round algorithm still reaches the optimum with its models close together.
TEST_P(RoundAlgorithm, ConvergesWithOverlap) {
  AlgorithmOptions o;
  o.momentum = 0.5;
  Simulation sim(GetParam(), o, 8, 64);
  sim.Run(GraphFor(GetParam()), 400, 0.05f, /*overlap=*/true);
  const auto [err, consensus] = sim.Errors();
  EXPECT_LT(err, 1e-3) << GetParam();
  EXPECT_LT(consensus, 0.1) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Builtin, RoundAlgorithm, ::testing::ValuesIn(RoundAlgorithmNames()),
                         [](const auto& p) {
                           std::string s = p.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

TEST(Choco, CompressedGossipConvergesAndSendsFarFewerBytes) {
  Simulation sparse("choco", ChocoWith("topk:ratio=0.05"), 8, 1000);
  sparse.Run("ring", 600, 0.05f);
  const auto [err, consensus] = sparse.Errors();
  EXPECT_LT(err, 1e-3);
  EXPECT_LT(consensus, 0.1);
  EXPECT_GT(static_cast<double>(DenseDpsgdBytes(600)) / sparse.bytes_sent, 8.0);
}

// `inner`'s encoding under a wire name of its own, without saying that it encodes from the top-k:
// CHOCO then stores x - x_hat whole and hands it to Encode, as it did before it selected in its
// local step.
class WholeInputCodec final : public Codec {
 public:
  explicit WholeInputCodec(std::unique_ptr<Codec> inner) : inner_(std::move(inner)) {}
  absl::string_view Name() const override { return "whole-input.v1"; }
  std::string Spec() const override { return "whole-input"; }
  absl::Status Encode(absl::Span<const float> x, const EncodeOptions& options,
                      EncodedTensor* out) override {
    TERN_RETURN_IF_ERROR(inner_->Encode(x, options, out));
    out->codec = std::string(Name());
    return absl::OkStatus();
  }

 protected:
  absl::Status DecodeImpl(const EncodedView& in, float weight, bool accumulate,
                          absl::Span<float> out, ThreadPool* pool) const override {
    EncodedView inner = in;
    inner.codec = inner_->Name();
    return accumulate ? inner_->DecodeAccumulate(inner, weight, out, pool)
                      : inner_->Decode(inner, out, pool);
  }

 private:
  const std::unique_ptr<Codec> inner_;
};

// CHOCO with a top-k codec selects within its local step (diff filtered block by block by the last
// round's k-th magnitude, or stored and selected whole when too few pass): the same messages and
// models, bit for bit, as encoding the stored diff, through the magnitudes' fall as the workers
// converge and a hundredfold cut of the learning rate.
TEST(Choco, SelectingInTheLocalStepSendsWhatEncodingTheDifferenceSends) {
  for (const std::string spec : {"stc:ratio=0.02", "topk:ratio=0.05"}) {
    const auto whole = [spec](CodecRegistry& r) {
      ASSERT_THAT(r.Register("whole-input",
                             [spec, &r](SpecParams&) -> absl::StatusOr<std::unique_ptr<Codec>> {
                               TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> inner, r.Create(spec));
                               return std::make_unique<WholeInputCodec>(std::move(inner));
                             }),
                  IsOk());
    };
    AlgorithmOptions o = ChocoWith(spec);
    o.momentum = 0.9;
    Simulation fused("choco", o, 6, 20000, {}, whole);
    o.codec = "whole-input";
    Simulation stored("choco", o, 6, 20000, {}, whole);
    for (float lr : {0.02f, 0.0002f}) {
      fused.Run("ring", 120, lr, /*overlap=*/true);
      stored.Run("ring", 120, lr, /*overlap=*/true);
      EXPECT_EQ(fused.bytes_sent, stored.bytes_sent) << spec;
      for (size_t i = 0; i < fused.workers.size(); ++i) {
        const absl::Span<const float> a = fused.workers[i]->params();
        const absl::Span<const float> b = stored.workers[i]->params();
        ASSERT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()))
            << spec << ", worker " << i << ", lr " << lr;
      }
    }
    const auto [err, consensus] = fused.Errors();
    EXPECT_LT(err, 0.05) << spec;
  }
}

// CHOCO keeps its consensus term incrementally and applies the neighbours' q's to their copies
// lazily; through rows that drop a neighbour, a neighbour first heard late and rebuilds every 64
// rounds, its model stays the one the textbook update gives (dense copies, rebuilt each round),
// with a copy that may have missed a q (a neighbour first heard after the first round, or one
// that was not heard in a round) left out of the mixing until its owner sends it whole, which the
// worker's messages ask for. It sends its own whole copy when asked, once per ask.
TEST(Choco, IncrementalStateMatchesTheTextbookUpdateThroughDroppedAndResynchronisedNeighbours) {
  constexpr size_t kD = 500;
  AlgorithmOptions o = ChocoWith("topk:ratio=0.1");
  o.momentum = 0.5;
  auto codecs = NewBuiltinCodecRegistry();
  auto algo = *NewBuiltinAlgorithmRegistry()->Create("choco", o, codecs.get());
  ASSERT_THAT(algo->Init(std::vector<float>(kD, 0.0f), 0, {}), IsOk());
  auto codec = *codecs->Create("topk:ratio=0.1");
  auto exact = *codecs->Create("none");
  // The reference: x, m and dense copies (each neighbour's own, which its messages move),
  // x += gc sum_j w_j (hat_j - hat_self) over the neighbours whose copy is in step.
  std::vector<float> x(kD, 0.0f), m(kD, 0.0f), hat_self(kD, 0.0f);
  std::map<int, std::vector<float>> hat = {{1, std::vector<float>(kD, 0.0f)},
                                           {2, std::vector<float>(kD, 0.0f)}};
  std::set<int> known, stale;
  std::vector<int> asked;  // the resync list of the algorithm's last message
  int hats_sent = 0;
  const float lr = 0.05f, beta = 0.5f, gc = static_cast<float>(o.consensus_step);
  for (int t = 0; t < 150; ++t) {
    const std::vector<float> g = testing::Gaussian(kD, 1000 + t);
    auto msg = algo->Prepare(g, lr, t);
    ASSERT_THAT(msg, IsOk());
    for (size_t i = 0; i < kD; ++i) {
      m[i] = beta * m[i] + g[i];
      x[i] -= lr * m[i];
    }
    ASSERT_THAT(
        codecs->DecodeAccumulate(EncodedView::Of(*msg->Find("q")), 1.0f, absl::MakeSpan(hat_self)),
        IsOk());
    EXPECT_EQ(msg->resync, std::vector<int>(stale.begin(), stale.end())) << "round " << t;
    // Worker 1 asked for our copy in round 30 (and again in 31, before it could have it) and
    // in 40: it comes in 31 and 41, whole and exact.
    const EncodedTensor* whole = msg->Find("hat");
    EXPECT_EQ(whole != nullptr, t == 31 || t == 41) << "round " << t;
    if (whole != nullptr) {
      ++hats_sent;
      std::vector<float> got(kD);
      ASSERT_THAT(codecs->Decode(EncodedView::Of(*whole), absl::MakeSpan(got)), IsOk());
      ASSERT_EQ(got, hat_self) << "round " << t;
    }
    // Worker 2 is silent for the first 10 rounds and drops out for rounds 70-79.
    const bool two = t >= 10 && (t < 70 || t >= 80);
    MixingRow row;
    row.self = two ? 1.0 / 3 : 2.0 / 3;
    row.neighbours = {{1, 1.0 / 3}};
    if (two) row.neighbours.push_back({2, 1.0 / 3});
    std::map<int, GossipMessage> theirs;
    std::map<int, const GossipMessage*> received;
    for (const auto& [j, w] : row.neighbours) {
      EncodedTensor q;
      EncodeOptions eo;
      eo.seed = static_cast<uint64_t>(t * 8 + j);
      const std::vector<float> v = testing::Gaussian(kD, 7000 + 10 * t + j, 0.1f);
      ASSERT_THAT(codec->Encode(v, eo, &q), IsOk());
      ASSERT_THAT(codecs->DecodeAccumulate(EncodedView::Of(q), 1.0f, absl::MakeSpan(hat[j])),
                  IsOk());
      theirs[j].parts.emplace_back("q", std::move(q));
      if (std::find(asked.begin(), asked.end(), j) != asked.end()) {
        EncodedTensor h;
        ASSERT_THAT(exact->Encode(hat[j], {}, &h), IsOk());
        theirs[j].parts.emplace_back("hat", std::move(h));
      }
      if (j == 1 && (t == 30 || t == 31 || t == 40)) theirs[j].resync = {0};
      received[j] = &theirs[j];
    }
    // Which copies are in step after this round, and mixed in it.
    for (int j : known) {
      if (!received.contains(j)) stale.insert(j);
    }
    std::vector<std::pair<int, double>> mixed;
    for (const auto& [j, w] : row.neighbours) {
      const bool in_step = known.contains(j) && !stale.contains(j);
      if (theirs[j].Find("hat") != nullptr && !in_step) {
        stale.erase(j);
      } else if (!in_step && !(t == 0 && !known.contains(j))) {
        stale.insert(j);
        continue;
      }
      known.insert(j);
      mixed.emplace_back(j, w);
    }
    ASSERT_THAT(algo->Combine(row, received), IsOk());
    algo->Settle();
    asked = msg->resync;
    for (size_t i = 0; i < kD; ++i) {
      double c = 0;
      for (const auto& [j, w] : mixed) c += w * (hat[j][i] - hat_self[i]);
      x[i] += gc * static_cast<float>(c);
    }
    const absl::Span<const float> got = algo->params();
    for (size_t i = 0; i < kD; ++i) {
      ASSERT_NEAR(got[i], x[i], 1e-4f * (1.0f + std::abs(x[i]))) << "round " << t << " i " << i;
    }
    // Worker 2, first heard in round 10, is asked for its copy in the next message and sends
    // it in the round after; dropped in round 70, it is asked from 71 on and sends it as it
    // comes back (80). Mixed again from then.
    if (t == 10 || t == 11 || (t >= 70 && t < 80)) {
      EXPECT_TRUE(stale.contains(2)) << "round " << t;
    }
    if (t == 12 || t == 80) {
      EXPECT_FALSE(stale.contains(2)) << "round " << t;
    }
  }
  EXPECT_EQ(hats_sent, 2);
  EXPECT_EQ(algo->copies_resynced(), 2u);  // worker 2's, in rounds 12 and 80
}

// A worker that joins a running CHOCO run (an elastic run's joiner) with a peer's model: its
// neighbours take its public copy whole from its first message, it asks for theirs, and the run
// converges as one without it would. Started with a peer's model alone (its copies of its
// neighbours at 0, theirs of it at 0), the consensus term would pull each side towards zero.
TEST(Choco, AJoinerTakesItsNeighboursCopiesWholeAndTheRunConverges) {
  for (const std::string codec : {"none", "topk:ratio=0.1"}) {
    AlgorithmOptions o = ChocoWith(codec);
    // Without SGD's noise the q's shrink to nothing, and the clipping radius with them: the
    // joiner's first rounds would be clipped away (its own bound, tested elsewhere).
    o.clip.factor = 0;
    Simulation sim("choco", o, 6, 200);
    sim.absent = {5};
    sim.Run("ring", 300, 0.05f);
    const absl::Span<const float> from = sim.workers[0]->params();
    ASSERT_THAT(sim.workers[5]->Init(std::vector<float>(from.begin(), from.end()), 5, {}), IsOk());
    sim.workers[5]->JoinedLate();
    sim.absent.clear();
    sim.Run("ring", 400, 0.05f, /*overlap=*/false, /*first=*/300);
    // (Without JoinedLate: 0.75 from the optimum, for good.)
    const auto [err, consensus] = sim.Errors();
    EXPECT_LT(err, 1e-3) << codec;
    EXPECT_LT(consensus, 0.1) << codec;
  }
}

// A joiner's momentum is a peer's (LocalMomentum, AdoptLocalMomentum): the next step moves as
// the peer's would. Algorithms without one have none to give; one of the wrong size is refused.
TEST(Algorithm, AMomentumTakenFromAPeerMovesTheNextStepAsItsWould) {
  auto codecs = NewBuiltinCodecRegistry();
  auto registry = NewBuiltinAlgorithmRegistry();
  AlgorithmOptions o;
  o.momentum = 0.5;
  auto peer = *registry->Create("dmsgd", o, codecs.get());
  auto joiner = *registry->Create("dmsgd", o, codecs.get());
  ASSERT_THAT(peer->Init(std::vector<float>(4, 1.0f), 0, {}), IsOk());
  EXPECT_TRUE(peer->LocalMomentum().empty());  // before its first step
  ASSERT_THAT(peer->Prepare(std::vector<float>(4, 2.0f), 0.1f, 0), IsOk());
  ASSERT_THAT(peer->Combine(MixingRow{}, {}), IsOk());
  EXPECT_EQ(peer->LocalMomentum(), std::vector<float>(4, 2.0f));
  ASSERT_THAT(joiner->Init(peer->params(), 1, {}), IsOk());
  ASSERT_THAT(joiner->AdoptLocalMomentum(peer->LocalMomentum()), IsOk());
  EXPECT_THAT(joiner->AdoptLocalMomentum(std::vector<float>(3, 0.0f)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto a = peer->Prepare(std::vector<float>(4, 0.0f), 0.1f, 1);
  auto b = joiner->Prepare(std::vector<float>(4, 0.0f), 0.1f, 1);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  std::vector<float> sa(4), sb(4);
  ASSERT_THAT(codecs->Decode(EncodedView::Of(*a->Find("x")), absl::MakeSpan(sa)), IsOk());
  ASSERT_THAT(codecs->Decode(EncodedView::Of(*b->Find("x")), absl::MakeSpan(sb)), IsOk());
  EXPECT_EQ(sa, sb);
  EXPECT_FLOAT_EQ(sb[0], 1.0f - 0.1f * 2.0f - 0.1f * 0.5f * 2.0f);  // x - lr g0, - lr beta m
  auto plain = *registry->Create("dpsgd", o, codecs.get());
  ASSERT_THAT(plain->Init(std::vector<float>(4, 1.0f), 0, {}), IsOk());
  ASSERT_THAT(plain->Prepare(std::vector<float>(4, 2.0f), 0.1f, 0), IsOk());
  EXPECT_TRUE(plain->LocalMomentum().empty());
}

// PowerSGD in gossip: CHOCO sends rank-2 factors of each tensor's x - x_hat (the layout reaches
// the codec as blocks) and still converges, for a fraction of the bytes.
TEST(Choco, PowerSgdGossipConvergesTensorByTensor) {
  const AlgorithmOptions o = ChocoWith("powersgd:rank=2");
  // A 40 x 24 weight and a 40-value bias.
  Simulation low_rank("choco", o, 8, 1000, {{960, 40}, {40, 40}});
  low_rank.Run("ring", 800, 0.05f);
  const auto [err, consensus] = low_rank.Errors();
  EXPECT_LT(err, 1e-3);
  EXPECT_LT(consensus, 0.1);
  EXPECT_GT(static_cast<double>(DenseDpsgdBytes(800)) / low_rank.bytes_sent, 4.0);
}

// What worker 1 sends with part `part` scaled by `scale` (decoded, scaled, re-encoded with
// `codec`): a faulty or malicious neighbour's message that passes every check on arrival.
GossipMessage Scaled(const GossipMessage& honest, const std::string& part, const std::string& codec,
                     float scale, size_t d) {
  auto codecs = NewBuiltinCodecRegistry();
  GossipMessage m = honest;
  for (auto& [name, t] : m.parts) {
    if (name != part) continue;
    std::vector<float> v(d, 0.0f);
    EXPECT_THAT(codecs->DecodeAccumulate(EncodedView::Of(t), scale, absl::MakeSpan(v)), IsOk());
    EXPECT_THAT((*codecs->Create(codec))->Encode(v, EncodeOptions{}, &t), IsOk());
  }
  return m;
}

// ClippedGossip: one neighbour's message at many times its honest size moves a worker about as
// far as an honest one would (the radius is a few honest distances), where unclipped it throws
// the worker off by the message's weight times its excess. Algorithms that mix models then forget
// it: the run ends at the optimum either way. CHOCO keeps what a q added to its copy of the
// sender's public model, clipped or not (docs/robustness.md); clipping bounds that.
TEST(Algorithm, OneOutsizedMessageMovesAWorkerNoFurtherThanTheClippingRadius) {
  constexpr size_t kD = 64;
  constexpr int kRound = 60;
  struct Case {
    std::string algorithm, part, codec;
    float scale;
  };
  for (const Case& c : std::vector<Case>{{"dpsgd", "x", "none", 9.0f},
                                         {"decentlam", "x", "fp16", 9.0f},
                                         {"heavy-ball", "x", "none", 20.0f},
                                         {"choco", "q", "topk:ratio=0.1", 20.0f}}) {
    SCOPED_TRACE(c.algorithm);
    const bool choco = c.algorithm == "choco";
    double moved[2];  // by the forged message, relative to the model: clipping off, on
    for (int on = 0; on < 2; ++on) {
      AlgorithmOptions o = choco ? ChocoWith(c.codec) : AlgorithmOptions{};
      o.momentum = choco ? 0.0 : 0.5;
      o.codec = c.codec;
      o.clip.factor = on ? 4 : 0;
      Simulation honest(c.algorithm, o, 4, kD), attacked(c.algorithm, o, 4, kD);
      attacked.forge = [&](int, int, const GossipMessage& m) {
        return Scaled(m, c.part, c.codec, c.scale, kD);
      };
      attacked.forge_round = kRound;
      honest.Run("ring", kRound + 1, 0.05f);
      attacked.Run("ring", kRound + 1, 0.05f);
      double d2 = 0, x2 = 0;
      for (size_t k = 0; k < kD; ++k) {
        d2 += std::pow(attacked.workers[0]->params()[k] - honest.workers[0]->params()[k], 2);
        x2 += std::pow(honest.workers[0]->params()[k], 2);
      }
      moved[on] = std::sqrt(d2 / x2);
      EXPECT_EQ(attacked.workers[0]->contributions_clipped(), on ? 1u : 0u);
      EXPECT_EQ(honest.workers[0]->contributions_clipped(), 0u) << "honest rounds are not clipped";
      if (!choco) {
        attacked.Run("ring", 400, 0.05f);
        EXPECT_LT(attacked.Errors().first, 1e-3);
      }
    }
    if (choco) {
      // 20x the q against a radius of 4x the lower median of the recent ones (which here are
      // larger than this round's: they fall as the workers converge): under half the jump.
      EXPECT_LT(moved[1], 0.5 * moved[0]);
    } else {
      EXPECT_GT(moved[0], 1.0) << "unclipped, the forged message throws the worker off";
      EXPECT_LT(moved[1], 0.1 * moved[0]);
    }
  }
}

TEST(Algorithm, WithoutNeighboursDpsgdIsPlainSgd) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  auto a = algorithms->Create("dpsgd", AlgorithmOptions{}, codecs.get());
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT((*a)->Init({1.0f, 2.0f}, 0, {}), IsOk());
  ASSERT_THAT((*a)->Prepare({0.5f, -1.0f}, 0.1f, 0), IsOk());
  ASSERT_THAT((*a)->Combine(MixingRow{}, {}), IsOk());
  EXPECT_THAT((*a)->params(), ::testing::ElementsAre(0.95f, 2.1f));
}

TEST(Algorithm, BoundParamsAreUpdatedInPlaceAndMoveBackWhenUnbound) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  for (const std::string name : {"dpsgd", "choco", "diloco"}) {
    AlgorithmOptions o;
    o.local_steps = 1;
    o.outer = "average";
    auto a = algorithms->Create(name, o, codecs.get());
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT((*a)->Init({1.0f, 2.0f}, 0, {}), IsOk());
    std::vector<float> storage(2, 0.0f), wrong(3);
    EXPECT_THAT((*a)->BindParams(absl::MakeSpan(wrong)),
                StatusIs(absl::StatusCode::kInvalidArgument));
    ASSERT_THAT((*a)->BindParams(absl::MakeSpan(storage)), IsOk());
    EXPECT_EQ(storage, (std::vector<float>{1.0f, 2.0f}));  // it got the current values
    EXPECT_EQ((*a)->params().data(), storage.data());
    ASSERT_THAT((*a)->Prepare({1.0f, 1.0f}, 0.5f, 0), IsOk());
    ASSERT_THAT((*a)->Combine(MixingRow{}, {}), IsOk());
    (*a)->Settle();
    EXPECT_EQ(storage, (std::vector<float>{0.5f, 1.5f})) << name;  // updated where it lives
    ASSERT_THAT((*a)->BindParams({}), IsOk());
    ASSERT_THAT((*a)->BindParams({}), IsOk());  // unbinding twice is harmless
    storage.assign(2, 9.0f);
    EXPECT_EQ(std::vector<float>((*a)->params().begin(), (*a)->params().end()),
              (std::vector<float>{0.5f, 1.5f}))
        << name;
  }
}

TEST(Algorithm, MalformedOrMissingMessagesFailAndLeaveTheModelUntouched) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  for (const std::string name : {"dpsgd", "decentlam", "heavy-ball", "choco"}) {
    std::vector<std::unique_ptr<Algorithm>> w;
    for (int i = 0; i < 2; ++i) {
      auto a = algorithms->Create(name, AlgorithmOptions{}, codecs.get());
      ASSERT_THAT(a, IsOk());
      ASSERT_THAT((*a)->Init(testing::Gaussian(10, 1), i, {}), IsOk());
      w.push_back(std::move(*a));
    }
    auto own = w[0]->Prepare(testing::Gaussian(10, 2), 0.1f, 0);
    auto peer = w[1]->Prepare(testing::Gaussian(10, 3), 0.1f, 0);
    ASSERT_THAT(own, IsOk());
    ASSERT_THAT(peer, IsOk());
    const std::vector<float> before(w[0]->params().begin(), w[0]->params().end());
    MixingRow row{0.5, {{1, 0.5}}};

    GossipMessage truncated = *peer;
    truncated.parts.back().second.payload.resize(3);
    EXPECT_THAT(w[0]->Combine(row, {{1, &truncated}}), StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    GossipMessage wrong_size = *peer;
    wrong_size.parts[0].second.numel = 11;
    EXPECT_THAT(w[0]->Combine(row, {{1, &wrong_size}}),
                StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    GossipMessage empty;
    EXPECT_THAT(w[0]->Combine(row, {{1, &empty}}), StatusIs(absl::StatusCode::kInvalidArgument))
        << name;
    EXPECT_THAT(w[0]->Combine(row, {}), StatusIs(absl::StatusCode::kInvalidArgument)) << name;
    w[0]->Settle();  // nothing left pending by a refused message either
    EXPECT_EQ(std::vector<float>(w[0]->params().begin(), w[0]->params().end()), before) << name;
    EXPECT_THAT(w[0]->Combine(row, {{1, &*peer}}), IsOk()) << name;
  }
}

TEST(Algorithm, CombineBeforePrepareIsAnErrorNotACrash) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  for (const std::string& name : algorithms->Names()) {
    if (name == "local-sgd" || name == "swarm") continue;  // Combine needs nothing staged
    auto a = algorithms->Create(name, AlgorithmOptions{}, codecs.get());
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT((*a)->Init({1.0f, 2.0f}, 0, {}), IsOk());
    EXPECT_THAT((*a)->Combine(MixingRow{}, {}), StatusIs(absl::StatusCode::kFailedPrecondition))
        << name;
  }
}

TEST(Algorithm, BadNamesAndOptionsAreRejected) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  EXPECT_THAT(algorithms->Create("gossip", AlgorithmOptions{}, codecs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  AlgorithmOptions o;
  o.momentum = 1.0;
  EXPECT_THAT(algorithms->Create("dmsgd", o, codecs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o = AlgorithmOptions{};
  o.codec = "topk:ratoi=0.1";
  EXPECT_THAT(algorithms->Create("choco", o, codecs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Algorithm, LossyCodecsOnlyWhereTheirErrorIsCompensated) {
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  AlgorithmOptions lossy;
  lossy.codec = "topk:ratio=0.01";
  EXPECT_THAT(algorithms->Create("choco", lossy, codecs.get()), IsOk());
  EXPECT_THAT(algorithms->Create("diloco", lossy, codecs.get()), IsOk());
  for (const std::string& name : algorithms->Names()) {
    if (name == "choco" || name == "diloco") continue;
    EXPECT_THAT(algorithms->Create(name, lossy, codecs.get()),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("choco")))
        << name;
    for (const char* exact : {"none", "fp16", "bf16", "int8"}) {
      AlgorithmOptions o;
      o.codec = exact;
      EXPECT_THAT(algorithms->Create(name, o, codecs.get()), IsOk()) << name << " " << exact;
    }
  }
}

// diloco's options: H, the outer optimizer and the codec.
AlgorithmOptions DilocoOptions(int h, const std::string& outer, const std::string& codec) {
  AlgorithmOptions o;
  o.local_steps = h;
  o.outer = outer;
  o.codec = codec;
  return o;
}

// diloco over one step with the plain average, fp32 and one worker per slot of a complete graph:
// synchronous averaging of the models after each worker's SGD step. So are the warm-up's steps
// (sync_steps) whatever H and the outer optimizer.
void ExpectSynchronousAveraging(const AlgorithmOptions& o) {
  constexpr int kWorkers = 4;
  constexpr size_t kDim = 32;
  Simulation sim("diloco", o, kWorkers, kDim);
  std::vector<float> expect(kDim, 0.0f);  // every worker starts from 0
  for (int t = 0; t < 5; ++t) {
    // The simulation's gradients: x - b_i, the same model on every worker.
    std::vector<float> next(kDim, 0.0f);
    for (int i = 0; i < kWorkers; ++i) {
      for (size_t k = 0; k < kDim; ++k) {
        next[k] += (expect[k] - 0.1f * (expect[k] - sim.targets[i][k])) / kWorkers;
      }
    }
    expect = next;
    sim.Run("complete", 1, 0.1f, /*overlap=*/false, /*first=*/t);
    for (int i = 0; i < kWorkers; ++i) {
      for (size_t k = 0; k < kDim; ++k) {
        ASSERT_NEAR(sim.workers[i]->params()[k], expect[k], 1e-5) << "step " << t << ", " << i;
      }
    }
  }
}

TEST(Diloco, OneStepWithThePlainAverageIsSynchronousAveraging) {
  ExpectSynchronousAveraging(DilocoOptions(1, "average", "none"));
}

TEST(Diloco, SyncStepsAreSynchronousAveragingWhateverHAndTheOuterOptimizer) {
  AlgorithmOptions o = DilocoOptions(10, "nesterov:lr=0.7,momentum=0.9", "none");
  o.sync_steps = 5;
  ExpectSynchronousAveraging(o);
}

// The outer step is the group's: with a lossy codec and Nesterov momentum every worker still
// holds the same bytes after each exchange, and the run reaches the optimum.
TEST(Diloco, EveryWorkerHoldsTheSameModelBitForBit) {
  AlgorithmOptions o;
  o.local_steps = 5;
  o.codec = "fp4";
  Simulation sim("diloco", o, 6, 3000);
  for (int round = 0; round < 60; ++round) {
    sim.Run("complete", 5, 0.05f);
    const absl::Span<const float> first = sim.workers[0]->params();
    for (size_t i = 1; i < sim.workers.size(); ++i) {
      const absl::Span<const float> other = sim.workers[i]->params();
      ASSERT_EQ(std::memcmp(first.data(), other.data(), first.size() * sizeof(float)), 0)
          << "round " << round << ", worker " << i;
    }
  }
  // The model still converges, to within fp4's jitter: each worker's update stays as large as
  // its own distance from the optimum (the workers' objectives differ), so its 4-bit rounding
  // moves θ every round; error feedback removes the bias, not that jitter (fp32: 2e-4 here).
  const auto [err, consensus] = sim.Errors();
  EXPECT_LT(err, 0.1);
}

// One diloco worker alone (its row: itself), started from zeros.
struct LoneDiloco {
  std::unique_ptr<CodecRegistry> codecs = NewBuiltinCodecRegistry();
  std::unique_ptr<Algorithm> a;

  LoneDiloco(const AlgorithmOptions& o, size_t dim) {
    auto made = NewBuiltinAlgorithmRegistry()->Create("diloco", o, codecs.get());
    EXPECT_THAT(made, IsOk());
    if (!made.ok()) return;
    a = std::move(*made);
    EXPECT_THAT(a->Init(std::vector<float>(dim, 0.0f), 0, {}), IsOk());
  }
};

// Error feedback: what top-k leaves out of one exchange goes in later ones, so once the
// gradients stop, the model reaches where fp32 would have taken it.
TEST(Diloco, ErrorFeedbackDeliversTheWholeUpdateOverRounds) {
  const AlgorithmOptions o = DilocoOptions(2, "average", "topk:ratio=0.1");
  constexpr size_t kDim = 100;
  LoneDiloco lone(o, kDim);
  ASSERT_NE(lone.a, nullptr);
  Algorithm& a = *lone.a;
  std::vector<float> sgd(kDim, 0.0f);  // where plain SGD goes with the same gradients
  int64_t step = 0;
  const auto run = [&](bool zero) {
    const std::vector<float> g =
        zero ? std::vector<float>(kDim, 0.0f) : testing::Gaussian(kDim, 50 + step);
    for (size_t k = 0; k < kDim; ++k) sgd[k] -= 0.1f * g[k];
    auto msg = a.Prepare(g, 0.1f, step);
    ASSERT_THAT(msg, IsOk());
    if (a.Communicates(step)) {
      ASSERT_THAT(a.Combine(MixingRow{}, {}), IsOk());
    }
    ++step;
  };
  for (int t = 0; t < 20; ++t) run(false);
  double apart = 0;
  for (size_t k = 0; k < kDim; ++k) {
    apart = std::max<double>(apart, std::abs(a.params()[k] - sgd[k]));
  }
  EXPECT_GT(apart, 0.01) << "top-k 10 % delivers part of each update";
  // Ten exchanges of zero updates empty a residual of 100 values, 10 a round.
  for (int t = 0; t < 20; ++t) run(true);
  for (size_t k = 0; k < kDim; ++k) EXPECT_NEAR(a.params()[k], sgd[k], 1e-5) << k;
}

// SparseLoCo: the residual decays by beta before each update joins it, so what top-k left out
// is partly forgotten (by hand: u = (4, 3, 2, 1), k = 1, beta = 0.5).
TEST(Diloco, SparseLocoDecaysTheResidual) {
  const AlgorithmOptions o = DilocoOptions(1, "sparseloco:lr=1,beta=0.5", "topk:ratio=0.25");
  LoneDiloco lone(o, 4);
  ASSERT_NE(lone.a, nullptr);
  Algorithm& a = *lone.a;
  ASSERT_THAT(a.Prepare({-4.0f, -3.0f, -2.0f, -1.0f}, 1.0f, 0), IsOk());
  ASSERT_THAT(a.Combine(MixingRow{}, {}), IsOk());
  EXPECT_THAT(a.params(), ::testing::ElementsAre(4.0f, 0.0f, 0.0f, 0.0f));
  // Residual (0, 3, 2, 1) decays to (0, 1.5, 1, 0.5); the largest goes.
  ASSERT_THAT(a.Prepare({0.0f, 0.0f, 0.0f, 0.0f}, 1.0f, 1), IsOk());
  ASSERT_THAT(a.Combine(MixingRow{}, {}), IsOk());
  EXPECT_THAT(a.params(), ::testing::ElementsAre(4.0f, 1.5f, 0.0f, 0.0f));
}

// A neighbour's bad message (malformed, of another size, missing, not finite) fails the
// exchange and leaves the model and the outer state as they were: the good one then gives what
// it gives a worker that never saw the bad ones.
TEST(Diloco, ABadMessageChangesNothing) {
  AlgorithmOptions o;
  o.local_steps = 1;
  o.codec = "none";
  auto codecs = NewBuiltinCodecRegistry();
  auto algorithms = NewBuiltinAlgorithmRegistry();
  std::vector<std::unique_ptr<Algorithm>> w;
  for (int i = 0; i < 3; ++i) {
    auto a = algorithms->Create("diloco", o, codecs.get());
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT((*a)->Init(std::vector<float>(10, 1.0f), i % 2, {}), IsOk());
    w.push_back(std::move(*a));
  }
  // w[0] and w[2] are both worker 0 with the same gradient; w[1] is its neighbour.
  auto own = w[0]->Prepare(testing::Gaussian(10, 2), 0.1f, 0);
  auto twin = w[2]->Prepare(testing::Gaussian(10, 2), 0.1f, 0);
  auto peer = w[1]->Prepare(testing::Gaussian(10, 3), 0.1f, 0);
  ASSERT_THAT(own, IsOk());
  ASSERT_THAT(twin, IsOk());
  ASSERT_THAT(peer, IsOk());
  const MixingRow row{0.5, {{1, 0.5}}};
  GossipMessage truncated = *peer;
  truncated.parts[0].second.payload.resize(3);
  GossipMessage wrong_size = *peer;
  wrong_size.parts[0].second.numel = 11;
  GossipMessage not_finite = *peer;
  std::vector<float> nan(10, std::nanf(""));
  EncodedTensor t;
  ASSERT_THAT((*codecs->Create("none"))->Encode(nan, {}, &t), IsOk());
  not_finite.parts[0].second = t;
  GossipMessage empty;
  for (const GossipMessage* bad : {&truncated, &wrong_size, &not_finite, &empty}) {
    EXPECT_THAT(w[0]->Combine(row, {{1, bad}}), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(w[0]->Combine(row, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(w[0]->Combine(row, {{1, &*peer}}), IsOk());
  ASSERT_THAT(w[2]->Combine(row, {{1, &*peer}}), IsOk());
  EXPECT_EQ(std::vector<float>(w[0]->params().begin(), w[0]->params().end()),
            std::vector<float>(w[2]->params().begin(), w[2]->params().end()));
  // And the next exchange too: the outer momentum was not touched by the refused ones.
  for (int i : {0, 2}) ASSERT_THAT(w[i]->Prepare(testing::Gaussian(10, 4), 0.1f, 1), IsOk());
  auto peer2 = w[1]->Prepare(testing::Gaussian(10, 5), 0.1f, 1);
  ASSERT_THAT(peer2, IsOk());
  ASSERT_THAT(w[0]->Combine(row, {{1, &*peer2}}), IsOk());
  ASSERT_THAT(w[2]->Combine(row, {{1, &*peer2}}), IsOk());
  EXPECT_EQ(std::vector<float>(w[0]->params().begin(), w[0]->params().end()),
            std::vector<float>(w[2]->params().begin(), w[2]->params().end()));
}

TEST(Diloco, AnUnknownOuterOptimizerIsRefusedAtCreation) {
  auto codecs = NewBuiltinCodecRegistry();
  AlgorithmOptions o;
  o.outer = "adam";
  EXPECT_THAT(NewBuiltinAlgorithmRegistry()->Create("diloco", o, codecs.get()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("outer")));
}

}  // namespace
}  // namespace tern
