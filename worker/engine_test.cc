#include "worker/engine.h"

#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/chunking.h"
#include "core/model/bundle.h"
#include "core/model/layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"
#include "worker/gossip_bundle.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

// Delivers pushes straight into the receiving engine, on a fresh thread like gRPC would, after
// `latency`; peers marked dead answer Unavailable, pushes to peers behind a partition (cut) hang
// to their deadline. As gRPC's channels do, it backs off reconnecting to a peer found dead: until
// Reconnect, a push made once (kOnce) is refused Unavailable even after the peer is back, while
// one that retries or waits for a connection gets through once the backoff runs out. A retried
// push is made again while the receiver answers Unavailable, as GrpcTransport's is.
class MemoryTransport final : public PeerTransport {
 public:
  std::vector<RoundEngine*> engines;
  std::vector<bool> dead;
  std::vector<bool> cut;
  absl::Mutex mu;
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);
  std::map<int, int> sends ABSL_GUARDED_BY(mu);
  std::set<int> backing_off ABSL_GUARDED_BY(mu);
  void Reconnect(int to) override {
    absl::MutexLock lock(&mu);
    backing_off.erase(to);
  }
  absl::Duration latency;
  // A push `lose` returns true for is acknowledged and never delivered (a message that came
  // before its receiver could take it).
  std::function<bool(int to, const v1::TensorBundle& bundle)> lose;
  ~MemoryTransport() override { Join(); }
  void Join() {
    std::vector<std::thread> ts;
    {
      absl::MutexLock lock(&mu);
      ts.swap(threads);
    }
    for (auto& t : ts) t.join();
  }
  void Send(int to, Chunks chunks, absl::Time deadline, Reach reach,
            std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu);  // engines send from their own threads
    ++sends[to];
    threads.emplace_back([this, to, chunks, deadline, reach, done = std::move(done)] {
      absl::SleepFor(latency);
      if (!cut.empty() && cut[to]) {
        absl::SleepFor(deadline - absl::Now());
        done(absl::DeadlineExceededError("deadline exceeded"));
        return;
      }
      bool refused = dead[to];
      {
        absl::MutexLock held(&mu);
        if (refused) backing_off.insert(to);
        refused = refused || (backing_off.count(to) > 0 && reach == Reach::kOnce);
      }
      if (refused) {
        done(absl::UnavailableError("connection refused"));
        return;
      }
      absl::Status s;
      do {
        BundleAssembler a(uint64_t{1} << 30);
        uint64_t wire = 0;
        for (const auto& c : *chunks) {
          wire += c.ByteSizeLong();
          ASSERT_THAT(a.Add(c), IsOk());
        }
        auto b = a.Finish();
        ASSERT_THAT(b, IsOk());
        if (lose && lose(to, *b)) break;
        s = engines[to]->Deliver(*std::move(b), wire);
      } while (absl::IsUnavailable(s) && !IsSitOut(s) && reach == Reach::kRetryUnavailable &&
               absl::Now() + absl::Milliseconds(20) < deadline &&
               (absl::SleepFor(absl::Milliseconds(20)), true));
      done(s);
    });
  }
  // A rejoining worker's questions; `asker` is the worker asking (one rejoins at a time here).
  int asker = -1;
  // Called as each question is asked, before it reaches `to` (a test's pause).
  std::function<void(int to)> on_ask;
  // Called when `to` has no state to hand over yet, before it is asked once more: the daemon's
  // Gossip.State has the round loop publish one between steps (PublishWanted).
  std::function<void(int to)> on_state_not_yet;
  absl::StatusOr<Position> AskPosition(int to, const std::string&, int64_t back_from,
                                       absl::Time) override {
    if (on_ask) on_ask(to);
    // Engines made one after another: the later ones are not listening yet.
    if (static_cast<size_t>(to) >= engines.size() || dead[to]) {
      return absl::UnavailableError("connection refused");
    }
    engines[to]->PeerListening(asker);
    if (back_from > 0) {
      if (absl::Status s = engines[to]->PeerBack(asker, back_from); !s.ok()) return s;
    }
    return Position{.next_step = engines[to]->next_step(),
                    .rounds_mixed = engines[to]->rounds_mixed()};
  }
  absl::StatusOr<v1::TensorBundle> FetchState(int to, const std::string& run_id, int64_t min_step,
                                              uint32_t slice, uint32_t slices,
                                              absl::Time) override {
    if (dead[to]) return absl::UnavailableError("connection refused");
    absl::StatusOr<std::shared_ptr<const PublishedState>> state =
        engines[to]->SharedState(min_step);
    if (StateNotYet(state.status()) && on_state_not_yet) {
      on_state_not_yet(to);
      state = engines[to]->SharedState(min_step);
    }
    if (!state.ok()) return state.status();
    return GroupStateToBundle(**state, run_id, to, slice, slices);
  }
  absl::StatusOr<v1::TensorBundle> Swap(int to, Chunks chunks, absl::Time) override {
    if (dead[to]) return absl::UnavailableError("connection refused");
    BundleAssembler a(uint64_t{1} << 30);
    for (const auto& c : *chunks) {
      if (absl::Status s = a.Add(c); !s.ok()) return s;
    }
    auto b = a.Finish();
    if (!b.ok()) return b.status();
    return engines[to]->HandleSwap(*std::move(b), 0);
  }
};

std::vector<ParamTensor> Layout(size_t n) {
  ParamTensor p;
  p.name = "w";
  p.shape = {static_cast<int64_t>(n)};
  p.numel = n;
  return {p};
}

// n engines over `transport`, worker i configured by `configure` and started from x0(i).
std::vector<std::unique_ptr<RoundEngine>> MakeEngines(
    int n, const WorkerRegistries& registries, MemoryTransport& transport,
    const std::function<void(EngineOptions&)>& configure, const std::vector<ParamTensor>& layout,
    const std::function<std::vector<float>(int)>& x0) {
  std::vector<std::unique_ptr<RoundEngine>> engines;
  transport.dead.assign(n, false);
  for (int i = 0; i < n; ++i) {
    EngineOptions o;
    o.worker_id = i;
    o.num_workers = n;
    configure(o);
    auto e = RoundEngine::Create(o, &registries, &transport);
    EXPECT_THAT(e, IsOk());
    EXPECT_THAT((*e)->Init(layout, x0(i)), IsOk());
    transport.engines.push_back(e->get());
    engines.push_back(std::move(*e));
  }
  return engines;
}

// One step (a zero gradient, lr 0.1) on every live worker, each on its own thread (a round needs
// them concurrently); then every push is done.
std::vector<absl::StatusOr<StepOutcome>> StepLive(
    const std::vector<std::unique_ptr<RoundEngine>>& engines, MemoryTransport& transport,
    int64_t step, const std::vector<bool>& live) {
  const int n = static_cast<int>(engines.size());
  std::vector<absl::StatusOr<StepOutcome>> out(n, absl::UnknownError("not run"));
  std::vector<std::thread> ts;
  std::vector<float> zero(engines[0]->params().size(), 0.0f);
  for (int i = 0; i < n; ++i) {
    if (!live[i]) continue;
    ts.emplace_back([&, i] {
      StepInput in;
      in.step = step;
      in.lr = 0.1f;
      in.grad = zero;
      out[i] = engines[i]->Step(in);
    });
  }
  for (auto& t : ts) t.join();
  transport.Join();
  return out;
}

struct Cluster {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  const CodecRegistry* codecs = registries.codecs.get();
  MemoryTransport transport;
  std::vector<std::unique_ptr<RoundEngine>> engines;

  Cluster(int n, const std::string& algorithm, size_t dim, absl::Duration timeout,
          int local_steps = 4, bool overlap = false) {
    engines = MakeEngines(
        n, registries, transport,
        [&](EngineOptions& o) {
          o.algorithm = algorithm;
          o.round_timeout = timeout;
          o.snapshot_every = 1;
          o.algorithm_options.local_steps = local_steps;
          o.overlap = overlap;
        },
        Layout(dim),
        // Different starts: mixing shows.
        [dim](int i) { return std::vector<float>(dim, static_cast<float>(i)); });
  }

  std::vector<absl::StatusOr<StepOutcome>> Step(int64_t step, const std::vector<bool>& live) {
    return StepLive(engines, transport, step, live);
  }
};

TEST(RoundEngine, DpsgdRoundsAverageNeighboursLikeTheMixingMatrix) {
  Cluster c(4, "dpsgd", 8, absl::Seconds(10));
  auto out = c.Step(0, {true, true, true, true});
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(out[i], IsOk());
    EXPECT_EQ(out[i]->mixed.size(), 2u);
    EXPECT_TRUE(out[i]->dropped.empty());
    // This step's counters: one round, the model to two neighbours.
    EXPECT_EQ(out[i]->delta.steps(), 1u);
    EXPECT_EQ(out[i]->delta.payload_bytes_sent(), 2u * 8 * 4);
    // Ring of 4, uniform 1/3: worker i averages itself with i-1 and i+1 (zero gradient).
    const float expect = (i + (i + 1) % 4 + (i + 3) % 4) / 3.0f;
    EXPECT_FLOAT_EQ(c.engines[i]->params()[0], expect);
  }
  // The mean is preserved (W is doubly stochastic).
  double sum = 0;
  for (auto& e : c.engines) sum += e->params()[0];
  EXPECT_NEAR(sum, 0 + 1 + 2 + 3, 1e-5);
  auto stats = c.engines[0]->Stats();
  EXPECT_EQ(stats.rounds(), 1u);
  EXPECT_EQ(stats.payload_bytes_sent(), 2u * 8 * 4);
  EXPECT_GT(stats.wire_bytes_sent(), stats.payload_bytes_sent());
  EXPECT_EQ(stats.payload_bytes_received(), 2u * 8 * 4);
  // Decoding the two messages is timed apart from mixing them.
  EXPECT_GT(stats.decode_seconds(), 0.0);
  EXPECT_GE(stats.combine_seconds(), 0.0);
  // The next step's delta starts from where this one ended.
  auto out2 = c.Step(1, {true, true, true, true});
  ASSERT_THAT(out2[0], IsOk());
  EXPECT_EQ(out2[0]->delta.steps(), 1u);
  EXPECT_EQ(out2[0]->delta.payload_bytes_sent(), 2u * 8 * 4);
  EXPECT_EQ(c.engines[0]->Stats().payload_bytes_sent(), 4u * 8 * 4);
}

TEST(RoundEngine, OverlapMixesEachRoundAtTheNextStep) {
  Cluster c(4, "dpsgd", 8, absl::Seconds(10), 4, /*overlap=*/true);
  auto out = c.Step(0, {true, true, true, true});
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(out[i], IsOk());
    EXPECT_TRUE(out[i]->mixed.empty());  // round 0 is still on the wire
    EXPECT_FLOAT_EQ(c.engines[i]->params()[0], static_cast<float>(i));
  }
  auto out1 = c.Step(1, {true, true, true, true});
  for (int i = 0; i < 4; ++i) {
    ASSERT_THAT(out1[i], IsOk());
    EXPECT_EQ(out1[i]->mixed.size(), 2u);
    // Round 0's average, as a blocking engine has it after step 0.
    EXPECT_FLOAT_EQ(c.engines[i]->params()[0], (i + (i + 1) % 4 + (i + 3) % 4) / 3.0f);
    EXPECT_EQ(out1[i]->delta.payload_bytes_sent(), 2u * 8 * 4);
  }
}

TEST(RoundEngine, OverlapAndBucketsAreRefusedForAnAlgorithmWithoutRounds) {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  EngineOptions o;
  o.num_workers = 2;
  o.algorithm = "swarm";
  o.overlap = true;
  EXPECT_THAT(RoundEngine::Create(o, &registries, &transport),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o.overlap = false;
  o.bucket_values = 1000;
  EXPECT_THAT(RoundEngine::Create(o, &registries, &transport),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--bucket_mb")));
}

// A model of three tensors (24, 16, 8 values): with buckets of 20 values it is cut into
// {w0}, {w1, w2} (from the last tensor back).
std::vector<ParamTensor> ThreeTensors() {
  std::vector<ParamTensor> layout;
  uint64_t offset = 0;
  for (uint64_t n : {24, 16, 8}) {
    ParamTensor p;
    p.name = absl::StrCat("w", layout.size());
    p.shape = {static_cast<int64_t>(n)};
    p.offset = offset;
    p.numel = n;
    offset += n;
    layout.push_back(p);
  }
  return layout;
}

struct BucketedCluster {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  std::vector<std::unique_ptr<RoundEngine>> engines;

  BucketedCluster(int n, const std::string& algorithm, const std::string& codec,
                  uint64_t bucket_values, bool overlap) {
    engines = MakeEngines(
        n, registries, transport,
        [&](EngineOptions& o) {
          o.algorithm = algorithm;
          o.algorithm_options.codec = codec;
          o.overlap = overlap;
          o.bucket_values = bucket_values;
          o.final_step = 6;
          // Each bucket has its own clipping radius, so once anything is clipped the cut run
          // differs from the whole one; these workers start far apart, where it clips.
          o.algorithm_options.clip.factor = 0;
        },
        ThreeTensors(),
        [](int i) {
          std::vector<float> x0(48);
          for (size_t k = 0; k < x0.size(); ++k) x0[k] = static_cast<float>(i * 7 + k % 5);
          return x0;
        });
  }

  // Step `step` on every worker with gradient g(i, k), handed over as a backward pass does:
  // the last tensor first (GradReadyFrom at each tensor's offset), then FinishStep.
  // `pushed_early` gets the pushes made before FinishStep was called.
  void Step(int64_t step, int* pushed_early = nullptr) {
    const int n = static_cast<int>(engines.size());
    std::vector<std::vector<float>> grads(n, std::vector<float>(48));
    std::vector<std::thread> ts;
    absl::Mutex mu;
    int early = 0;
    for (int i = 0; i < n; ++i) {
      ts.emplace_back([&, i] {
        std::vector<float>& g = grads[i];
        StepInput in;
        in.step = step;
        in.lr = 0.05f;
        in.grad = g;
        ASSERT_THAT(engines[i]->BeginStep(in), IsOk());
        for (uint64_t from : {40, 24, 0}) {
          for (uint64_t k = from; k < 48; ++k) g[k] = std::sin(0.3f * k + i + 0.7f * step);
          ASSERT_THAT(engines[i]->GradReadyFrom(from), IsOk());
        }
        {
          absl::MutexLock lock(&transport.mu);
          absl::MutexLock l(&mu);
          for (const auto& [to, count] : transport.sends) early += count;
        }
        ASSERT_THAT(engines[i]->FinishStep(in), IsOk());
      });
    }
    for (auto& t : ts) t.join();
    transport.Join();
    if (pushed_early != nullptr) *pushed_early = early;
  }
};

// Every round algorithm is separable over coordinate ranges: with a deterministic codec, a model
// cut into buckets ends exactly where the whole model does, with and without overlap.
TEST(RoundEngine, BucketedStepsEndWhereWholeModelStepsDo) {
  for (const auto& [algorithm, codec] : std::vector<std::pair<std::string, std::string>>{
           {"dpsgd", "none"}, {"decentlam", "fp16"}, {"choco", "none"}, {"local-sgd", "none"}}) {
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(absl::StrCat(algorithm, overlap ? " overlap" : ""));
      BucketedCluster whole(4, algorithm, codec, 0, overlap);
      BucketedCluster cut(4, algorithm, codec, 20, overlap);
      EXPECT_THAT(whole.engines[0]->BucketOffsets(), ::testing::ElementsAre(0u));
      EXPECT_THAT(cut.engines[0]->BucketOffsets(), ::testing::ElementsAre(0u, 24u));
      for (int64_t step = 0; step < 6; ++step) {
        whole.Step(step);
        cut.Step(step);
      }
      for (int i = 0; i < 4; ++i) {
        const absl::Span<const float> a = whole.engines[i]->params(), b = cut.engines[i]->params();
        ASSERT_EQ(a.size(), b.size());
        for (size_t k = 0; k < a.size(); ++k) EXPECT_FLOAT_EQ(a[k], b[k]) << "worker " << i;
        EXPECT_EQ(whole.engines[i]->Stats().payload_bytes_sent(),
                  cut.engines[i]->Stats().payload_bytes_sent());
      }
    }
  }
}

TEST(RoundEngine, ABucketIsPushedAsSoonAsItsGradientIsReady) {
  BucketedCluster cut(4, "dpsgd", "none", 20, false);
  int early = 0;
  cut.Step(0, &early);
  // Each worker pushed both buckets to both neighbours before calling FinishStep: the second
  // bucket at GradReadyFrom(24), where it starts, the first at GradReadyFrom(0).
  EXPECT_GE(early, 2 * 2);
  int whole_early = 0;
  BucketedCluster whole(4, "dpsgd", "none", 0, false);
  // One bucket starts at 0: GradReadyFrom(0) pushes it, also before FinishStep.
  whole.Step(0, &whole_early);
  EXPECT_GE(whole_early, 2);
}

TEST(RoundEngine, BucketedStepRefusesANonFiniteBucketAndMessagesOfAnotherCut) {
  BucketedCluster cut(2, "dpsgd", "none", 20, false);
  std::vector<float> g(48, 0.0f);
  g[30] = std::numeric_limits<float>::quiet_NaN();
  StepInput in;
  in.grad = g;
  ASSERT_THAT(cut.engines[0]->BeginStep(in), IsOk());
  EXPECT_THAT(cut.engines[0]->GradReadyFrom(24),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket 1")));
  EXPECT_THAT(cut.engines[0]->FinishStep(in), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A whole-model step with the same gradient changes nothing.
  EXPECT_THAT(cut.engines[0]->Step(in), StatusIs(absl::StatusCode::kInvalidArgument));

  GossipMessage m;
  EncodedTensor t;
  std::vector<float> x(24, 1.0f);
  ASSERT_THAT((*cut.registries.codecs->Create("none"))->Encode(x, {}, &t), IsOk());
  m.parts.emplace_back("x", std::move(t));
  v1::TensorBundle whole = GossipToBundle(std::move(m), "tern", 0, 1);
  EXPECT_THAT(cut.engines[0]->Deliver(whole, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--bucket_mb")));
  v1::TensorBundle out_of_range = whole;
  out_of_range.set_bucket(2);
  out_of_range.set_buckets(2);
  EXPECT_THAT(cut.engines[0]->Deliver(out_of_range, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bucket 2 of 2")));
  // Both buckets hold 24 values (w0; w1 and w2): each is taken once, apart.
  for (uint32_t bucket : {0u, 1u}) {
    v1::TensorBundle b = whole;
    b.set_bucket(bucket);
    b.set_buckets(2);
    EXPECT_THAT(cut.engines[0]->Deliver(b, 0), IsOk());
    EXPECT_THAT(cut.engines[0]->Deliver(b, 0), StatusIs(absl::StatusCode::kAlreadyExists));
  }
  v1::TensorBundle short_one = whole;
  short_one.set_bucket(1);
  short_one.set_buckets(2);
  short_one.set_round(1);
  short_one.mutable_tensors(0)->mutable_tensor()->set_numel(20);
  EXPECT_THAT(cut.engines[0]->Deliver(short_one, 0), StatusIs(absl::StatusCode::kInvalidArgument));

  // Where a bucket was already sent, the worker cannot go on, and says so.
  g[30] = 0;
  g[5] = std::numeric_limits<float>::infinity();
  ASSERT_THAT(cut.engines[1]->BeginStep(in), IsOk());
  EXPECT_THAT(cut.engines[1]->GradReadyFrom(24), IsOk());
  EXPECT_THAT(cut.engines[1]->GradReadyFrom(0), StatusIs(absl::StatusCode::kInvalidArgument));
  g[5] = 0;
  EXPECT_THAT(cut.engines[1]->Step(in),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restart")));
  cut.transport.Join();
}

TEST(RoundEngine, DeadNeighbourIsDroppedWithoutWaitingForTheDeadline) {
  Cluster c(4, "dpsgd", 8, absl::Seconds(30));
  c.transport.dead[2] = true;
  const absl::Time t0 = absl::Now();
  auto out = c.Step(0, {true, true, false, true});
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));  // not the 30 s deadline
  ASSERT_THAT(out[1], IsOk());
  EXPECT_EQ(out[1]->dropped, std::vector<int>{2});
  // Worker 1 mixes with 0 only; 2's weight went to itself: (1 + 1 + 0) / 3.
  EXPECT_FLOAT_EQ(c.engines[1]->params()[0], (1.0f + 1.0f + 0.0f) / 3.0f);
  // Next round: 2 is no longer waited for at all.
  auto out2 = c.Step(1, {true, true, false, true});
  ASSERT_THAT(out2[3], IsOk());
  EXPECT_EQ(out2[3]->dropped, std::vector<int>{2});
}

// Behind a partition a push is not refused, it hangs to its deadline. Once the neighbour is
// known down, rounds go on at full speed with one probe push to it at a time, not a round
// deadline each (the partitioned halves keep training and meet again when it heals).
TEST(RoundEngine, APartitionedNeighbourCostsOneDeadlineThenOneProbeAtATime) {
  Cluster c(2, "dpsgd", 8, absl::Seconds(1));
  c.transport.cut = {false, true};
  const absl::Time t0 = absl::Now();
  auto first = c.Step(0, {true, false});  // waits for 1's message, then its deadline
  ASSERT_THAT(first[0], IsOk());
  EXPECT_EQ(first[0]->dropped, std::vector<int>{1});
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(900));
  const absl::Time t1 = absl::Now();
  StepInput in;
  in.lr = 0.1f;
  std::vector<float> zero(8, 0.0f);
  in.grad = zero;
  for (int64_t step = 1; step <= 20; ++step) {
    in.step = step;
    auto out = c.engines[0]->Step(in);
    ASSERT_THAT(out, IsOk());
    EXPECT_EQ(out->dropped, std::vector<int>{1});
  }
  EXPECT_LT(absl::Now() - t1, absl::Milliseconds(900));  // not 20 deadlines
  {
    absl::MutexLock lock(&c.transport.mu);
    EXPECT_EQ(c.transport.sends[1], 2);  // round 0's push, then one probe still under way
  }
  c.transport.Join();
}

// A worker that has run its last round (EngineOptions::final_step) answers a late message as
// gone, not as a round it closed: a peer behind it would otherwise keep it awaited, a round
// deadline in each of its own rounds, for messages that never come.
TEST(RoundEngine, AWorkerThatFinishedItsTrainingIsNotAwaitedByOneBehind) {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  auto engines = MakeEngines(
      2, registries, transport,
      [](EngineOptions& o) {
        o.algorithm = "dpsgd";
        o.round_timeout = absl::Seconds(30);
        o.final_step = 3;
      },
      Layout(8), [](int i) { return std::vector<float>(8, static_cast<float>(i)); });
  std::vector<float> zero(8, 0.0f);
  StepInput in;
  in.lr = 0.1f;
  in.grad = zero;
  // Worker 0 runs the whole run while 1 is down.
  transport.dead[1] = true;
  for (in.step = 0; in.step < 3; ++in.step) ASSERT_THAT(engines[0]->Step(in), IsOk());
  transport.Join();
  transport.dead[1] = false;
  const absl::Time t0 = absl::Now();
  in.step = 0;
  auto late = engines[1]->Step(in);
  ASSERT_THAT(late, IsOk());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << "worker 1 waited for worker 0's message";
  EXPECT_EQ(late->dropped, std::vector<int>{0});
  const absl::Status refused = [&] {
    GossipMessage m;
    EncodedTensor t;
    EXPECT_THAT((*registries.codecs->Create("none"))->Encode(zero, {}, &t), IsOk());
    m.parts.emplace_back("w", std::move(t));
    return engines[0]->Deliver(GossipToBundle(std::move(m), "tern", 1, 1), 0);
  }();
  EXPECT_THAT(refused, StatusIs(absl::StatusCode::kCancelled, HasSubstr("finished its training")));
  transport.Join();
}

// A gossip worker joining an elastic run says from which round it sends (as a rejoining diloco
// worker does), and its peers wait for it from there. Peers with no other neighbour to wait for
// run rounds faster than the question goes round: the round it names moves further each time
// one of them got past it, and the joiner and its peers then mix every round.
TEST(RoundEngine, AGossipJoinerIsWaitedForFromTheRoundItNamesEvenByPeersRunningAhead) {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  transport.dead = {false, false, true};
  transport.asker = 2;
  const auto configure = [](EngineOptions& o, int id, int64_t from) {
    o.worker_id = id;
    o.num_workers = 3;
    o.algorithm = "dpsgd";
    o.round_timeout = absl::Seconds(30);
    o.rejoin_timeout = absl::Seconds(5);
    o.member_from = [from] { return std::optional<int64_t>(from); };
  };
  std::vector<std::unique_ptr<RoundEngine>> engines;
  for (int i = 0; i < 3; ++i) {
    EngineOptions o;
    configure(o, i, i < 2 ? 0 : 4);
    auto e = RoundEngine::Create(o, &registries, &transport);
    ASSERT_THAT(e, IsOk());
    engines.push_back(*std::move(e));
  }
  for (const auto& e : engines) transport.engines.push_back(e.get());
  for (int i = 0; i < 2; ++i) {
    ASSERT_THAT(engines[i]->Init(Layout(8), std::vector<float>(8, static_cast<float>(i))), IsOk());
  }
  // Workers 0 and 1 run on at full speed, worker 2 down; each step's outcome kept.
  std::atomic<int64_t> stop_at{std::numeric_limits<int64_t>::max()};
  std::map<int64_t, std::vector<int>> mixed_by_0;
  std::thread racer([&] {
    for (int64_t step = 0; step < stop_at.load(); ++step) {
      const std::vector<absl::StatusOr<StepOutcome>> out =
          StepLive(engines, transport, step, {true, true, false});
      ASSERT_THAT(out[0], IsOk());
      ASSERT_THAT(out[1], IsOk());
      mixed_by_0[step] = out[0]->mixed;
    }
  });
  while (engines[0]->next_step() < 8) absl::SleepFor(absl::Milliseconds(1));
  // Each question takes three of their rounds to go round (or 200 ms, once they wait for 2).
  transport.on_ask = [&](int) {
    const int64_t seen = engines[0]->next_step();
    const absl::Time until = absl::Now() + absl::Milliseconds(200);
    while (engines[0]->next_step() < seen + 3 && absl::Now() < until) {
      absl::SleepFor(absl::Microseconds(200));
    }
  };
  transport.dead[2] = false;
  if (absl::Status init = engines[2]->Init(Layout(8), std::vector<float>(8, 2.0f)); !init.ok()) {
    stop_at = 0;
    racer.join();
    FAIL() << init;
  }
  const int64_t from = engines[2]->next_step();
  stop_at = from + 4;
  std::vector<float> zero(8, 0.0f);
  const absl::Time t0 = absl::Now();
  for (int64_t step = from; step < from + 4; ++step) {
    StepInput in;
    in.step = step;
    in.lr = 0.1f;
    in.grad = zero;
    auto out = engines[2]->Step(in);
    ASSERT_THAT(out, IsOk());
    EXPECT_EQ(out->mixed, (std::vector<int>{0, 1})) << step;
  }
  racer.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << "a side waited a round deadline";
  EXPECT_GT(from, 10);
  for (int64_t step = from; step < from + 4; ++step) {
    EXPECT_EQ(mixed_by_0[step], (std::vector<int>{1, 2})) << step;
  }
  transport.Join();
}

// A worker of `algorithm` joins an elastic run of two: it takes their models (a slice of each)
// and momentum, and for CHOCO its public copies too: its first message carries its own whole,
// and it asks its neighbours for theirs (which come with their next message), through the
// engine's messages as through the algorithm's. Mixing with zero gradients then brings the
// three models to one value between theirs; with CHOCO's copies out of step (its neighbours' at
// zero) the consensus term pulled every model towards zero for good (-67 against 10-12).
void ExpectAJoinerToMeetItsPeers(const std::string& algorithm, bool overlap) {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  transport.dead = {false, false, true};
  transport.asker = 2;
  std::vector<std::unique_ptr<RoundEngine>> engines;
  for (int i = 0; i < 3; ++i) {
    EngineOptions o;
    o.worker_id = i;
    o.num_workers = 3;
    o.algorithm = algorithm;
    o.overlap = overlap;
    if (algorithm == "choco") o.algorithm_options.codec = "topk:ratio=0.5";
    // No SGD noise here: q's shrink to nothing, and a clipping radius with them.
    o.algorithm_options.clip.factor = 0;
    o.round_timeout = absl::Seconds(10);
    o.rejoin_timeout = absl::Seconds(10);
    const int64_t from = i < 2 ? 0 : 20;
    o.member_from = [from] { return std::optional<int64_t>(from); };
    auto e = RoundEngine::Create(o, &registries, &transport);
    ASSERT_THAT(e, IsOk());
    engines.push_back(*std::move(e));
  }
  for (const auto& e : engines) transport.engines.push_back(e.get());
  for (int i = 0; i < 2; ++i) {
    ASSERT_THAT(engines[i]->Init(Layout(8), std::vector<float>(8, 10.0f + 2.0f * i)), IsOk());
  }
  // Workers 0 and 1 run on (and hand their state over at a step's end), worker 2 down.
  std::atomic<int64_t> stop_at{std::numeric_limits<int64_t>::max()};
  std::thread peers([&] {
    for (int64_t step = 0; step < stop_at.load(); ++step) {
      const auto out = StepLive(engines, transport, step, {true, true, false});
      ASSERT_THAT(out[0], IsOk());
      ASSERT_THAT(out[1], IsOk());
    }
  });
  while (engines[0]->next_step() < 20) absl::SleepFor(absl::Milliseconds(1));
  transport.dead[2] = false;
  if (absl::Status init = engines[2]->Init(Layout(8), std::vector<float>(8, 0.0f)); !init.ok()) {
    stop_at = 0;
    peers.join();
    FAIL() << init;
  }
  const int64_t from = engines[2]->next_step();
  stop_at = from + 60;
  // What it took: its peers' models and their own momentum, where they keep one.
  absl::StatusOr<std::shared_ptr<const PublishedState>> given = engines[0]->SharedState(0);
  ASSERT_THAT(given, IsOk());
  EXPECT_EQ((*given)->state.momentum.size(), algorithm == "dpsgd" ? 0u : 8u) << algorithm;
  // Worker 2 starts from its peers' models (a mosaic of their slices), not its own zeros.
  EXPECT_GT(engines[2]->params()[0], 9.0f);
  for (int64_t step = from; step < from + 60; ++step) {
    StepInput in;
    in.step = step;
    in.lr = 0.1f;
    std::vector<float> zero(8, 0.0f);
    in.grad = zero;
    ASSERT_THAT(engines[2]->Step(in), IsOk()) << step;
  }
  peers.join();
  transport.Join();
  float lo = 1e9f, hi = -1e9f;
  for (const auto& e : engines) {
    for (float v : e->params()) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  EXPECT_LT(hi - lo, 1e-3f) << algorithm;
  EXPECT_GT(lo, 10.0f) << algorithm;
  EXPECT_LT(hi, 12.0f) << algorithm;
  // CHOCO: the joiner took both its neighbours' copies whole, each of them the joiner's, once.
  const uint64_t resynced = algorithm == "choco" ? 1 : 0;
  EXPECT_EQ(engines[2]->Stats().public_copies_resynced(), 2 * resynced) << algorithm;
  EXPECT_EQ(engines[0]->Stats().public_copies_resynced(), resynced) << algorithm;
  EXPECT_EQ(engines[1]->Stats().public_copies_resynced(), resynced) << algorithm;
}

TEST(RoundEngine, AChocoJoinerTakesItsNeighboursCopiesAndTheModelsMeet) {
  ExpectAJoinerToMeetItsPeers("choco", /*overlap=*/false);
}

// With --overlap a round is always in flight: a gossip worker hands its model over all the same
// (before, it never did, and the joiner gave up after --rejoin_timeout), with its momentum.
TEST(RoundEngine, AGossipJoinerOfAnOverlappedRunTakesItsPeersModelsAndMomentum) {
  for (const std::string algorithm : {"dmsgd", "heavy-ball", "choco", "dpsgd"}) {
    ExpectAJoinerToMeetItsPeers(algorithm, /*overlap=*/true);
  }
}

TEST(RoundEngine, RefusesBadMessagesAndKeepsServing) {
  Cluster c(4, "dpsgd", 8, absl::Seconds(10));
  RoundEngine& e = *c.engines[0];
  auto make = [&](const std::string& run, int64_t round, int sender) {
    GossipMessage m;
    EncodedTensor t;
    std::vector<float> x(8, 1.0f);
    EXPECT_THAT((*c.codecs->Create("none"))->Encode(x, {}, &t), IsOk());
    m.parts.emplace_back("x", std::move(t));
    return GossipToBundle(std::move(m), run, round, sender);
  };
  EXPECT_THAT(e.Deliver(make("other-run", 0, 1), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("run")));
  EXPECT_THAT(e.Deliver(make("tern", 0, 2), 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a neighbour")));
  EXPECT_THAT(e.Deliver(make("tern", 0, 0), 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e.Deliver(make("tern", 1000, 1), 0),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("ahead")));
  v1::TensorBundle bad = make("tern", 0, 1);
  bad.mutable_tensors(0)->mutable_tensor()->mutable_payload()->resize(5);
  EXPECT_THAT(e.Deliver(bad, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::TensorBundle renamed = make("tern", 0, 1);
  renamed.mutable_tensors(0)->set_name("m");
  EXPECT_THAT(e.Deliver(renamed, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(e.Stats().messages_refused(), 6u);
  // A good one is accepted once; the round after it is closed refuses late copies.
  EXPECT_THAT(e.Deliver(make("tern", 0, 1), 0), IsOk());
  EXPECT_THAT(e.Deliver(make("tern", 0, 1), 0), StatusIs(absl::StatusCode::kAlreadyExists));
  // Training goes on: all four workers complete two rounds.
  for (int64_t s = 0; s < 2; ++s) {
    auto out = c.Step(s, {true, true, true, true});
    for (auto& o : out) ASSERT_THAT(o, IsOk());
  }
  EXPECT_THAT(e.Deliver(make("tern", 0, 1), 0),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("closed")));
  EXPECT_THAT(e.GetSnapshot(2), IsOk());
  EXPECT_THAT(e.GetSnapshot(50), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(RoundEngine, SwarmAveragesPairwiseWithoutRoundsAndConservesTheMean) {
  Cluster c(2, "swarm", 8, absl::Seconds(10), /*local_steps=*/1);
  // Worker 0 steps alone: it swaps with 1 (its only neighbour) without 1 taking part.
  auto out = c.Step(0, {true, false});
  ASSERT_THAT(out[0], IsOk());
  EXPECT_EQ(out[0]->mixed, std::vector<int>{1});
  EXPECT_FLOAT_EQ(c.engines[0]->params()[0], 0.5f);
  EXPECT_FLOAT_EQ(c.engines[1]->params()[0], 1.0f);  // averaged in at its next step
  auto out1 = c.Step(0, {false, true});
  ASSERT_THAT(out1[1], IsOk());
  EXPECT_FLOAT_EQ(c.engines[1]->params()[0], 0.5f);
  EXPECT_FLOAT_EQ(c.engines[0]->params()[0] + c.engines[1]->params()[0], 1.0f);
  // Round-based pushes are refused: swarm has no rounds.
  GossipMessage m;
  EncodedTensor t;
  ASSERT_THAT((*c.codecs->Create("none"))->Encode(std::vector<float>(8), {}, &t), IsOk());
  m.parts.emplace_back("x", std::move(t));
  EXPECT_THAT(c.engines[0]->Deliver(GossipToBundle(std::move(m), "tern", 1, 1), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A swap with a malformed model is refused and nothing is queued.
  v1::TensorBundle bad;
  bad.set_run_id("tern");
  bad.set_sender("1");
  EXPECT_THAT(c.engines[0]->HandleSwap(bad, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  auto out2 = c.Step(1, {true, false});
  ASSERT_THAT(out2[0], IsOk());
}

TEST(RoundEngine, SwarmSkipsADeadPartner) {
  Cluster c(2, "swarm", 8, absl::Seconds(10), /*local_steps=*/1);
  c.transport.dead[1] = true;
  auto out = c.Step(0, {true, false});
  ASSERT_THAT(out[0], IsOk());
  EXPECT_EQ(out[0]->dropped, std::vector<int>{1});
  EXPECT_FLOAT_EQ(c.engines[0]->params()[0], 0.0f);
}

TEST(RoundEngine, StepsMustComeInOrderAfterRegistration) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport t;
  EngineOptions o;
  auto e = RoundEngine::Create(o, &registries, &t);
  ASSERT_THAT(e, IsOk());
  std::vector<float> g(4);
  StepInput in;
  in.grad = g;
  EXPECT_THAT((*e)->Step(in), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT((*e)->Init(Layout(4), std::vector<float>(4, 1.0f)), IsOk());
  EXPECT_THAT((*e)->Init(Layout(5), std::vector<float>(5, 1.0f)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  in.step = 3;
  EXPECT_THAT((*e)->Step(in), StatusIs(absl::StatusCode::kFailedPrecondition));
  in.step = 0;
  std::vector<float> wrong(3);
  in.grad = wrong;
  EXPECT_THAT((*e)->Step(in), StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<float> poisoned = {0, std::nanf(""), 0, 0};
  in.grad = poisoned;
  EXPECT_THAT((*e)->Step(in), StatusIs(absl::StatusCode::kInvalidArgument));
  poisoned[1] = std::numeric_limits<float>::infinity();
  EXPECT_THAT((*e)->Step(in), StatusIs(absl::StatusCode::kInvalidArgument));
  in.grad = g;
  EXPECT_THAT((*e)->Step(in), IsOk());                // one worker: no neighbours, no waiting
  for (float v : (*e)->params()) EXPECT_EQ(v, 1.0f);  // zero gradient: the refused steps left none
}

// Four diloco workers on threads (the complete graph, fp32, the plain average, H = 2), all
// starting from 0, over `layout`, the model cut into `fragments`; `more` changes the options
// after that.
struct DilocoGroup {
  static constexpr int kWorkers = 4;
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  MemoryTransport transport;
  std::vector<std::unique_ptr<RoundEngine>> engines;

  static void Configure(EngineOptions& o, int fragments) {
    o.algorithm = "diloco";
    o.topology = "complete";
    o.algorithm_options.codec = "none";
    o.algorithm_options.outer = "average";
    o.algorithm_options.local_steps = 2;
    o.fragments = fragments;
    o.round_timeout = absl::Seconds(10);
  }

  // Every worker starts from zeros, or from `x0(i)` when given.
  DilocoGroup(const std::vector<ParamTensor>& layout, int fragments,
              const std::function<void(EngineOptions&)>& more = nullptr,
              std::function<std::vector<float>(int)> x0 = nullptr) {
    const size_t dim = LayoutNumel(layout);
    if (x0 == nullptr) x0 = [dim](int) { return std::vector<float>(dim, 0.0f); };
    engines = MakeEngines(
        kWorkers, registries, transport,
        [&](EngineOptions& o) {
          Configure(o, fragments);
          if (more) more(o);
        },
        layout, x0);
  }

  // A new engine for worker `id`, as its restarted process makes one (configured as the group's,
  // then by `more`), in the transport's place of the old one and the one asking its questions.
  absl::StatusOr<std::unique_ptr<RoundEngine>> Restart(
      int id, const std::function<void(EngineOptions&)>& more = nullptr) {
    EngineOptions o;
    Configure(o, /*fragments=*/0);
    if (more) more(o);
    o.worker_id = id;
    o.num_workers = kWorkers;
    absl::StatusOr<std::unique_ptr<RoundEngine>> e =
        RoundEngine::Create(o, &registries, &transport);
    if (!e.ok()) return e.status();
    transport.Join();
    transport.engines[static_cast<size_t>(id)] = e->get();
    transport.dead[static_cast<size_t>(id)] = false;
    transport.asker = id;
    return e;
  }

  // Worker 3 killed after step 3, the others on through step 5 (an exchange of three), then
  // worker 3 started again (configured as the group's, then by `more`) from its own stale start
  // over `layout`: once it knows where the group is, the others end step 6, whose state its
  // source hands over. It steps from 7.
  absl::Status KillAndRejoinWorker3(const std::vector<ParamTensor>& layout,
                                    const std::function<void(EngineOptions&)>& more = nullptr) {
    for (int64_t step = 0; step < 4; ++step) Step(step);
    transport.dead[3] = true;
    const std::vector<bool> live = {true, true, true, false};
    Step(4, live);
    Step(5, live);
    absl::StatusOr<std::unique_ptr<RoundEngine>> restarted = Restart(3, more);
    if (!restarted.ok()) return restarted.status();
    if (absl::Status s = Rejoin(**restarted, layout, /*at=*/6, live); !s.ok()) return s;
    engines[3] = *std::move(restarted);
    return absl::OkStatus();
  }

  // Worker 3's restarted engine `joiner` registers its model (Init, on a thread of its own, as
  // the daemon's registration runs; `started` runs here once it is under way) and rejoins at step
  // `at`: once it knows where the group is, the others (`live`) end step `at`, whose state they
  // hand over. Its ask for the state may come only after that step ended (its thread slow to be
  // scheduled): then, between steps, each publishes one, as the daemon's round loop does for a
  // Gossip.State it cannot answer yet. Before the others are done with the step, its end
  // publishes it. Without that, a late ask waits out --rejoin_timeout.
  absl::Status Rejoin(RoundEngine& joiner, const std::vector<ParamTensor>& layout, int64_t at,
                      const std::vector<bool>& live,
                      const std::function<void()>& started = nullptr) {
    std::atomic<bool> between_steps{false};
    std::array<absl::Mutex, kWorkers> loop;
    transport.on_state_not_yet = [&](int to) {
      absl::MutexLock lock(&loop[static_cast<size_t>(to)]);
      if (between_steps.load()) engines[static_cast<size_t>(to)]->PublishWanted();
    };
    absl::Status init;
    std::atomic<bool> done{false};
    std::thread t([&] {
      init = joiner.Init(layout, std::vector<float>(LayoutNumel(layout), 0.0f));
      done = true;
    });
    if (started) started();
    // An Init that fails before it knows where the group is ends the wait too.
    while (joiner.next_step() != at && !done.load()) absl::SleepFor(absl::Milliseconds(1));
    Step(at, live);
    between_steps = true;
    t.join();
    transport.on_state_not_yet = nullptr;
    return init;
  }

  // Every scenario here keeps the group's model the same bytes on every worker, as each
  // message's CRC of it says, but the one that starts a worker elsewhere on purpose.
  ~DilocoGroup() {
    if (!agree) return;
    for (size_t i = 0; i < engines.size(); ++i) {
      if (engines[i] == nullptr) continue;
      EXPECT_EQ(engines[i]->Stats().group_model_mismatches(), 0u) << "worker " << i;
    }
  }
  bool agree = true;

  // One step on every worker (of those `live`, when given), worker i with gradient -(i + 1)
  // everywhere (so lr 0.1 moves it 0.1 (i + 1)); each one's payload bytes sent.
  std::vector<uint64_t> Step(int64_t step, const std::vector<bool>& live = {},
                             bool mix_now = false) {
    std::vector<absl::StatusOr<StepOutcome>> out(kWorkers, StepOutcome());
    std::vector<std::thread> ts;
    for (int i = 0; i < kWorkers; ++i) {
      if (!live.empty() && !live[static_cast<size_t>(i)]) continue;
      ts.emplace_back([&, i] {
        const std::vector<float> grad(engines[i]->params().size(), -static_cast<float>(i + 1));
        StepInput in;
        in.step = step;
        in.lr = 0.1f;
        in.grad = grad;
        in.mix_now = mix_now;
        out[i] = engines[i]->Step(in);
      });
    }
    for (auto& t : ts) t.join();
    transport.Join();
    std::vector<uint64_t> sent;
    for (int i = 0; i < kWorkers; ++i) {
      EXPECT_THAT(out[i], IsOk()) << "step " << step << ", worker " << i;
      sent.push_back(out[i].ok() ? out[i]->delta.payload_bytes_sent() : 0);
    }
    return sent;
  }
};

// diloco through real engines and threads: every worker ends each exchange on the group's mean
// model, having sent its update to the three others; a graph other than the complete one is
// refused at creation.
TEST(RoundEngine, DilocoEndsEveryExchangeOnTheGroupsMean) {
  constexpr size_t kDim = 8;
  DilocoGroup g(Layout(kDim), /*fragments=*/0);
  ASSERT_EQ(g.engines.size(), static_cast<size_t>(DilocoGroup::kWorkers));
  // Step 0 is local; step 1 exchanges with all three others.
  EXPECT_THAT(g.Step(0), ::testing::Each(0u));
  EXPECT_THAT(g.Step(1), ::testing::Each(3u * kDim * 4));
  // Worker i moved 0.2 (i + 1); the mean of 0.2, 0.4, 0.6, 0.8.
  for (const auto& e : g.engines) {
    for (float v : e->params()) EXPECT_FLOAT_EQ(v, 0.5f);
  }
  EngineOptions ring;
  DilocoGroup::Configure(ring, 0);
  ring.topology = "ring";
  ring.num_workers = DilocoGroup::kWorkers;
  EXPECT_THAT(RoundEngine::Create(ring, &g.registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("complete")));
}

// With snapshot_group a snapshot keeps the group's model θ: mid-period, each worker's parameters
// are its own (θ moved by its own step), its snapshot the same θ on every worker; a snapshot
// of the group's model is refused where there is none.
TEST(RoundEngine, DilocoSnapshotsOfTheGroupsModelAreTheSameOnEveryWorker) {
  constexpr size_t kDim = 8;
  DilocoGroup g(Layout(kDim), /*fragments=*/0, [](EngineOptions& o) {
    o.snapshot_every = 1;
    o.snapshot_group = true;
  });
  g.Step(0);
  g.Step(1);  // the exchange: θ = 0.5
  g.Step(2);  // worker i's own step: 0.5 + 0.1 (i + 1)
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    const RoundEngine& e = *g.engines[static_cast<size_t>(i)];
    EXPECT_FLOAT_EQ(e.params()[0], 0.5f + 0.1f * static_cast<float>(i + 1)) << i;
    absl::StatusOr<std::vector<float>> before = e.GetSnapshot(1);
    absl::StatusOr<std::vector<float>> after = e.GetSnapshot(3);
    ASSERT_THAT(before, IsOk());
    ASSERT_THAT(after, IsOk());
    EXPECT_THAT(*before, ::testing::Each(0.0f)) << i;  // θ before the exchange: x0
    EXPECT_THAT(*after, ::testing::Each(0.5f)) << i;
  }
  EngineOptions gossip;
  gossip.algorithm = "dpsgd";
  gossip.num_workers = 2;
  gossip.snapshot_group = true;
  EXPECT_THAT(RoundEngine::Create(gossip, &g.registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--snapshot_model=own")));
}

// With an offset the kept steps are those s with s mod snapshot_every = offset (here 1, 3, ...),
// the others refused as not kept; an offset outside [0, snapshot_every) is refused at start.
TEST(RoundEngine, SnapshotsWithAnOffsetKeepOnlyTheStepsOfThatRemainder) {
  constexpr size_t kDim = 8;
  DilocoGroup g(Layout(kDim), /*fragments=*/0, [](EngineOptions& o) {
    o.snapshot_every = 2;
    o.snapshot_offset = 1;
    o.snapshot_group = true;
  });
  for (int64_t s = 0; s < 4; ++s) g.Step(s);
  const RoundEngine& e = *g.engines[0];
  EXPECT_THAT(e.GetSnapshot(1), IsOk());
  EXPECT_THAT(e.GetSnapshot(3), IsOk());
  EXPECT_THAT(e.GetSnapshot(2).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("kept every 2 steps from step 1")));
  EXPECT_THAT(e.GetSnapshot(4).status(), StatusIs(absl::StatusCode::kNotFound));
  for (const int64_t offset : {int64_t{-1}, int64_t{2}}) {
    EngineOptions bad;
    bad.snapshot_every = 2;
    bad.snapshot_offset = offset;
    EXPECT_THAT(RoundEngine::Create(bad, &g.registries, nullptr).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("snapshot offset")))
        << offset;
  }
}

// A worker that dies leaves the others on one model: each survivor averages the three updates it
// heard (a third each), where the gossip rule (the dead one's weight to the receiver's own
// update) would give each survivor another mean, and θ would split.
TEST(RoundEngine, DilocoSurvivorsOfADeadWorkerStayOnOneModel) {
  DilocoGroup g(Layout(4), /*fragments=*/0);
  g.transport.dead[3] = true;  // its pushes refused at once, as a dead host's connection is
  const std::vector<bool> live = {true, true, true, false};
  g.Step(0, live);
  g.Step(1, live);  // the exchange: workers 0-2 moved 0.2, 0.4 and 0.6
  for (int i = 0; i < 3; ++i) {
    for (float v : g.engines[i]->params()) EXPECT_FLOAT_EQ(v, 0.4f) << i;
    EXPECT_TRUE(std::equal(g.engines[i]->params().begin(), g.engines[i]->params().end(),
                           g.engines[0]->params().begin()))
        << i;
  }
}

// A worker killed and started again takes the group's state from a live peer: it asks where the
// group is (step 6), takes θ and the outer momentum as they stand after step 6 (the first step
// its source ends with no exchange in flight) and goes on from step 7. It sits the exchanges out
// (sends nothing, mixes the others' updates) until round 11, two periods past the furthest peer,
// from which they wait for it; after every exchange it holds the others' model bit for bit: the
// Nesterov momentum came over too.
TEST(RoundEngine, DilocoARestartedWorkerRejoinsWithTheGroupsState) {
  const auto nesterov = [](EngineOptions& o) { o.algorithm_options.outer = "nesterov"; };
  DilocoGroup g(Layout(8), /*fragments=*/0, nesterov);
  ASSERT_THAT(g.KillAndRejoinWorker3(Layout(8), nesterov), IsOk());
  EXPECT_EQ(g.engines[3]->next_step(), 7);
  for (int64_t step = 7; step < 14; ++step) {
    const std::vector<uint64_t> sent = g.Step(step);
    if (step % 2 == 0) continue;
    // Sat out at 7 and 9; an update like everyone's from 11 on.
    EXPECT_EQ(sent[3], step < 11 ? 0u : sent[0]) << step;
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_TRUE(std::equal(g.engines[i]->params().begin(), g.engines[i]->params().end(),
                             g.engines[0]->params().begin()))
          << "worker " << i << ", step " << step;
    }
  }
  EXPECT_EQ(g.engines[1]->Stats().messages_refused(), 0u);
}

// A rejoined worker that misses a peer's update in an exchange it sits out (the peer pushed it
// before the worker could take it) would mix the others' without it and hold another θ than
// theirs, a split its first exchange shows rounds later. It takes the state again from the
// peers it heard at that step's end, and holds their θ, bit for bit, from that exchange on.
TEST(RoundEngine, DilocoARejoinerThatMissesAnUpdateItSitsOutTakesTheStateAgain) {
  DilocoGroup g(Layout(8), /*fragments=*/0);
  // Its wait for the missed update ends at its round deadline: a short one here.
  ASSERT_THAT(g.KillAndRejoinWorker3(Layout(8),
                                     [](EngineOptions& o) { o.round_timeout = absl::Seconds(1); }),
              IsOk());
  // Worker 0's update of the exchange at step 7 never reaches worker 3.
  g.transport.lose = [](int to, const v1::TensorBundle& b) {
    return to == 3 && b.sender() == "0" && b.round() == 7;
  };
  // Each worker's round loop: a step, or a state published between steps for a peer that asks.
  absl::Mutex loop[DilocoGroup::kWorkers];
  g.transport.on_state_not_yet = [&](int to) {
    if (!loop[to].TryLock()) return;  // stepping: it publishes at the step's end
    g.engines[to]->PublishWanted();
    loop[to].Unlock();
  };
  std::vector<std::thread> steps;
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    steps.emplace_back([&g, &loop, i] {
      const std::vector<float> grad(8, -static_cast<float>(i + 1));
      StepInput in;
      in.step = 7;
      in.lr = 0.1f;
      in.grad = grad;
      absl::MutexLock lock(&loop[i]);
      EXPECT_THAT(g.engines[i]->Step(in), IsOk()) << "worker " << i;
    });
  }
  for (std::thread& t : steps) t.join();
  g.transport.Join();
  g.transport.lose = nullptr;
  g.transport.on_state_not_yet = nullptr;
  EXPECT_EQ(g.engines[3]->Stats().group_model_repairs(), 1u);
  for (int64_t step = 7; step < 14; ++step) {
    if (step > 7) g.Step(step);
    if (step % 2 == 0) continue;
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_TRUE(std::equal(g.engines[i]->params().begin(), g.engines[i]->params().end(),
                             g.engines[0]->params().begin()))
          << "worker " << i << ", step " << step;
    }
  }
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_EQ(g.engines[i]->Stats().group_model_mismatches(), 0u) << "worker " << i;
  }
}

// A diloco run with --overlap does not take a worker back (its first update would span the steps
// since the state, not H: some peers' norm guards refused it, others mixed it, and θ split):
// the restarted worker is told so at once, not after --rejoin_timeout.
TEST(RoundEngine, DilocoWithOverlapRefusesARejoinAtOnce) {
  const auto overlap = [](EngineOptions& o) {
    o.overlap = true;
    o.rejoin_timeout = absl::Minutes(5);
  };
  DilocoGroup g(Layout(8), /*fragments=*/0, overlap);
  for (int64_t step = 0; step < 4; ++step) g.Step(step);
  g.transport.dead[3] = true;
  g.Step(4, {true, true, true, false});
  auto restarted = g.Restart(3, overlap);
  ASSERT_THAT(restarted, IsOk());
  const absl::Time t0 = absl::Now();
  EXPECT_THAT((*restarted)->Init(Layout(8), std::vector<float>(8, 0.0f)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("--overlap cannot take a worker back")));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

// A worker shut down while it waits for the group's state (its peers not at the step yet) stops
// waiting: Init ends CANCELLED at once, not at the rejoin's deadline, so the daemon's shutdown,
// which waits for the registration, is not held up for minutes.
TEST(RoundEngine, ARejoinWaitingForTheStateEndsWhenTheWorkerShutsDown) {
  DilocoGroup g(Layout(8), /*fragments=*/0);
  for (int64_t step = 0; step < 4; ++step) g.Step(step);
  g.transport.dead[3] = true;
  g.Step(4, {true, true, true, false});
  g.Step(5, {true, true, true, false});
  auto restarted = g.Restart(3, [](EngineOptions& o) { o.rejoin_timeout = absl::Minutes(5); });
  ASSERT_THAT(restarted, IsOk());
  absl::Status init;
  std::atomic<bool> done{false};
  std::thread joiner([&] {
    init = (*restarted)->Init(Layout(8), std::vector<float>(8, 0.0f));
    done = true;
  });
  while ((*restarted)->next_step() != 6 && !done.load()) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(100));  // asking for the state after step 5, not there yet
  const absl::Time t0 = absl::Now();
  (*restarted)->Shutdown();
  joiner.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  EXPECT_THAT(init, StatusIs(absl::StatusCode::kCancelled, HasSubstr("shutting down")));
  g.engines[3] = nullptr;
}

// A push that reaches a restarted worker after its model is registered but before it knows where
// the group is (its first question still out) is not taken: it is answered "sits round r out", so
// its senders, which never saw it down, do not wait a round deadline for a message a rejoining
// worker never sends, and the state it then takes covers that round. After it rejoins every
// worker holds the same model.
TEST(RoundEngine, DilocoAPushToAWorkerStillAskingWhereTheGroupIsIsNotAwaited) {
  // Worker 3's first update after sitting rounds out carries the ones it withheld, at 4x worker
  // 0's gradient: past the norm guard's 10x of the median, which is not what this tests.
  const auto configure = [](EngineOptions& o) {
    o.norm_guard.factor = 0;
    o.round_timeout = absl::Seconds(30);
  };
  DilocoGroup g(Layout(8), /*fragments=*/0, configure);
  for (int64_t step = 0; step < 4; ++step) g.Step(step);
  // Killed and started again between two steps of its peers: none of them saw it down.
  auto restarted = g.Restart(3, configure);
  ASSERT_THAT(restarted, IsOk());
  absl::Notification asking, go_on;
  std::atomic<bool> first{true};
  g.transport.on_ask = [&](int) {
    if (!first.exchange(false)) return;
    asking.Notify();
    go_on.WaitForNotification();
  };
  const std::vector<bool> live = {true, true, true, false};
  const auto pushes_to_3 = [&] {
    absl::MutexLock lock(&g.transport.mu);
    return g.transport.sends[3];
  };
  // Its source hands over the state after step 6.
  ASSERT_THAT(g.Rejoin(**restarted, Layout(8), /*at=*/6, live,
                       [&] {
                         asking.WaitForNotification();
                         g.Step(4, live);
                         const int before = pushes_to_3();
                         const absl::Time t0 = absl::Now();
                         g.Step(5, live);  // an exchange: each peer pushes to worker 3 too
                         EXPECT_EQ(pushes_to_3() - before, 3);
                         EXPECT_LT(absl::Now() - t0, absl::Seconds(15))
                             << "the peers waited for worker 3's message";
                         go_on.Notify();
                       }),
              IsOk());
  EXPECT_EQ((*restarted)->next_step(), 7);
  g.engines[3] = *std::move(restarted);
  for (int64_t step = 7; step < 16; ++step) {
    g.Step(step);
    if (step % 2 == 0) continue;
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_TRUE(std::equal(g.engines[i]->params().begin(), g.engines[i]->params().end(),
                             g.engines[0]->params().begin()))
          << "worker " << i << ", step " << step;
    }
  }
  EXPECT_EQ(g.engines[1]->Stats().messages_refused(), 0u);
}

// The bit-identical check: each message carries the CRC of its sender's group model θ, and a
// receiver counts (and logs) a neighbour whose θ is not its own. A group that agrees counts
// nothing, over whole and fragmented exchanges.
TEST(RoundEngine, DilocoCountsANeighbourWhoseGroupModelIsNotItsOwn) {
  for (int fragments : {0, 2}) {
    DilocoGroup agree(Layout(8), fragments);
    for (int64_t step = 0; step < 4; ++step) agree.Step(step);
    for (const auto& e : agree.engines) {
      EXPECT_EQ(e->Stats().group_model_mismatches(), 0u) << fragments << " fragments";
      EXPECT_EQ(e->Stats().group_model_repairs(), 0u);
      EXPECT_GT(e->Stats().rounds(), 0u);
    }
  }
}

// A split mended: worker 3 started elsewhere, so its θ is not the group's. At the first exchange
// every worker counts the split (the three others worker 3, worker 3 each of them), and worker
// 3, whose θ is held by one of the four against three, takes the state again from the peers
// that hold theirs (after that step or their next, which exchanges nothing). From the next
// exchange on the four hold one θ, byte for byte, and count nothing more.
TEST(RoundEngine, DilocoAWorkerWhoseGroupModelIsNotTheMajoritysTakesItFromAPeer) {
  DilocoGroup split(Layout(8), /*fragments=*/0, nullptr,
                    [](int i) { return std::vector<float>(8, i == 3 ? 0.5f : 0.0f); });
  split.agree = false;
  // Each worker's round loop: a step, or a state published between steps for a peer that asks
  // (as the daemon's is).
  absl::Mutex loop[DilocoGroup::kWorkers];
  split.transport.on_state_not_yet = [&](int to) {
    if (!loop[to].TryLock()) return;  // stepping: it publishes at the step's end
    split.engines[to]->PublishWanted();
    loop[to].Unlock();
  };
  const auto step_on = [&](int i, int64_t step) {
    return std::thread([&split, &loop, i, step] {
      const std::vector<float> grad(8, -static_cast<float>(i + 1));
      StepInput in;
      in.step = step;
      in.lr = 0.1f;
      in.grad = grad;
      absl::MutexLock lock(&loop[i]);
      EXPECT_THAT(split.engines[i]->Step(in), IsOk()) << "worker " << i << ", step " << step;
    });
  };
  split.Step(0);
  std::vector<std::thread> first;
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) first.push_back(step_on(i, 1));  // exchange
  for (int i = 0; i < 3; ++i) first[static_cast<size_t>(i)].join();
  // Worker 3 waits for the state; the others go on a step, at whose end they hand it over.
  std::vector<std::thread> second;
  for (int i = 0; i < 3; ++i) second.push_back(step_on(i, 2));
  for (std::thread& t : second) t.join();
  first[3].join();
  split.transport.Join();
  step_on(3, 2).join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(split.engines[i]->Stats().group_model_mismatches(), 1u) << "worker " << i;
    EXPECT_EQ(split.engines[i]->Stats().group_model_repairs(), 0u) << "worker " << i;
  }
  EXPECT_EQ(split.engines[3]->Stats().group_model_mismatches(), 3u);
  EXPECT_EQ(split.engines[3]->Stats().group_model_repairs(), 1u);
  split.transport.on_state_not_yet = nullptr;
  for (int64_t step = 3; step < 6; ++step) split.Step(step);  // exchanges at 3 and 5
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_TRUE(std::equal(split.engines[i]->params().begin(), split.engines[i]->params().end(),
                           split.engines[0]->params().begin()))
        << "worker " << i;
    EXPECT_EQ(split.engines[i]->Stats().group_model_mismatches(), i < 3 ? 1u : 3u)
        << "worker " << i;
  }
}

// Without a peer that has mixed an exchange (a run starting) a worker starts from its own x0; a
// state is only handed over by an algorithm that keeps one, or in an elastic run (a joiner takes
// a gossip peer's model), and one far past the worker's step is refused, not waited for.
TEST(RoundEngine, SharedStateIsDilocosOrAnElasticRunsAndNotFarAhead) {
  DilocoGroup g(Layout(4), /*fragments=*/0);
  for (const auto& e : g.engines) EXPECT_EQ(e->next_step(), 0);
  EXPECT_THAT(g.engines[0]->SharedState(0).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ask again")));
  EXPECT_THAT(g.engines[0]->SharedState(int64_t{1} << 40).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("steps ahead of it")));
  g.Step(0);  // asked for: published at this step's end
  auto state = g.engines[0]->SharedState(0);
  ASSERT_THAT(state, IsOk());
  EXPECT_EQ((*state)->state.step, 0);
  EXPECT_EQ((*state)->crc, GroupStateCrc((*state)->state));
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions dpsgd;
  dpsgd.num_workers = 2;
  auto e = RoundEngine::Create(dpsgd, &registries, nullptr);
  ASSERT_THAT(e, IsOk());
  EXPECT_THAT((*e)->SharedState(0).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  dpsgd.member_from = [] { return std::optional<int64_t>(0); };
  auto elastic = RoundEngine::Create(dpsgd, &registries, nullptr);
  ASSERT_THAT(elastic, IsOk());
  ASSERT_THAT((*elastic)->Init(Layout(4), std::vector<float>(4, 0.5f)), IsOk());
  EXPECT_THAT((*elastic)->SharedState(0).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ask again")));
}

// A worker that has run its last step publishes no later state: a joiner whose first step lies
// past the run's end is told so at once instead of waiting its --rejoin_timeout; the state after
// the last step is still handed over.
TEST(RoundEngine, AStatePastTheRunsEndIsRefusedByAWorkerThatFinished) {
  DilocoGroup g(Layout(4), /*fragments=*/0, [](EngineOptions& o) { o.final_step = 2; });
  g.Step(0);
  EXPECT_THAT(g.engines[0]->SharedState(5).status(), StatusIs(absl::StatusCode::kUnavailable));
  g.Step(1);
  EXPECT_THAT(g.engines[0]->SharedState(5).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("has finished the run (2 steps)")));
  EXPECT_THAT(g.engines[0]->SharedState(1).status(), StatusIs(absl::StatusCode::kUnavailable));
  g.engines[0]->PublishWanted();  // as the daemon's round loop does, between steps
  auto last = g.engines[0]->SharedState(1);
  ASSERT_THAT(last, IsOk());
  EXPECT_EQ((*last)->state.step, 1);
}

// Streaming: with two fragments and H = 2 each step exchanges one of them (the last tensor's
// first), so every fragment is exchanged once per H steps and an exchange carries half the model.
TEST(RoundEngine, DilocoFragmentsTakeTurns) {
  constexpr size_t kHalf = 8;
  std::vector<ParamTensor> layout(2);
  layout[0] = {.name = "a", .shape = {kHalf}, .offset = 0, .numel = kHalf};
  layout[1] = {.name = "b", .shape = {kHalf}, .offset = kHalf, .numel = kHalf};
  DilocoGroup g(layout, /*fragments=*/2);
  ASSERT_EQ(g.engines.size(), static_cast<size_t>(DilocoGroup::kWorkers));
  const auto& engines = g.engines;
  // The group's mean move is 0.25 a step.
  EXPECT_THAT(g.Step(0), ::testing::Each(3u * kHalf * 4));  // b exchanged, a local
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_FLOAT_EQ(engines[i]->params()[0], 0.1f * (i + 1));
    EXPECT_FLOAT_EQ(engines[i]->params()[kHalf], 0.25f);
  }
  EXPECT_THAT(g.Step(1), ::testing::Each(3u * kHalf * 4));  // a exchanged, b local
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_FLOAT_EQ(engines[i]->params()[0], 0.5f);
    EXPECT_FLOAT_EQ(engines[i]->params()[kHalf], 0.25f + 0.1f * (i + 1));
  }
  g.Step(2);  // b again: its two steps since its last exchange
  for (const auto& e : engines) EXPECT_FLOAT_EQ(e->params()[kHalf], 0.75f);
  EngineOptions dpsgd;
  dpsgd.num_workers = DilocoGroup::kWorkers;
  dpsgd.fragments = 2;
  EXPECT_THAT(RoundEngine::Create(dpsgd, &g.registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("diloco")));
}

// Strided fragments: four layers in two fragments, layers 0 and 2 in one, 1 and 3 in the other,
// each exchanged once per H = 2 steps (the second first), an exchange carrying half the model;
// their values gathered and put back in place, in the engine's buffer and in one bound later.
TEST(RoundEngine, DilocoStridedFragmentsExchangeEveryOtherLayerTogether) {
  constexpr size_t kLayer = 4;
  std::vector<ParamTensor> layout;
  for (size_t l = 0; l < 4; ++l) {
    layout.push_back({.name = absl::StrCat("blocks.", l, ".w"),
                      .shape = {kLayer},
                      .offset = l * kLayer,
                      .numel = kLayer});
  }
  DilocoGroup g(layout, /*fragments=*/2,
                [](EngineOptions& o) { o.fragment_cut = FragmentCut::kStrided; });
  ASSERT_EQ(g.engines.size(), static_cast<size_t>(DilocoGroup::kWorkers));
  EXPECT_EQ(g.engines[0]->BucketOffsets(), (std::vector<uint64_t>{0, kLayer}));
  // The value of layer l on worker i.
  auto at = [&](int i, size_t l) { return g.engines[i]->params()[l * kLayer + 1]; };
  EXPECT_THAT(g.Step(0), ::testing::Each(3u * 2 * kLayer * 4));  // layers 1, 3 exchanged
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    for (size_t l : {0, 2}) EXPECT_FLOAT_EQ(at(i, l), 0.1f * (i + 1)) << l;
    for (size_t l : {1, 3}) EXPECT_FLOAT_EQ(at(i, l), 0.25f) << l;
  }
  // A trainer's buffer bound between steps gets the model, and the steps go on in it.
  std::vector<float> bound(4 * kLayer, -1.0f);
  ASSERT_THAT(g.engines[3]->BindParams(absl::MakeSpan(bound)), IsOk());
  EXPECT_FLOAT_EQ(bound[1], 0.4f);
  EXPECT_FLOAT_EQ(bound[kLayer + 1], 0.25f);
  EXPECT_THAT(g.Step(1), ::testing::Each(3u * 2 * kLayer * 4));  // layers 0, 2
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    for (size_t l : {0, 2}) EXPECT_FLOAT_EQ(at(i, l), 0.5f) << l;
    for (size_t l : {1, 3}) EXPECT_FLOAT_EQ(at(i, l), 0.25f + 0.1f * (i + 1)) << l;
  }
  EXPECT_FLOAT_EQ(bound[2 * kLayer], 0.5f);
  EXPECT_FLOAT_EQ(bound[3 * kLayer], 0.25f + 0.4f);
  EngineOptions unfragmented;
  DilocoGroup::Configure(unfragmented, /*fragments=*/0);
  unfragmented.num_workers = DilocoGroup::kWorkers;
  unfragmented.fragment_cut = FragmentCut::kStrided;
  EXPECT_THAT(RoundEngine::Create(unfragmented, &g.registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fragments")));
}

// A message of fragments cut another way (here contiguous: blocks 0-1 and 2-3, the same sizes as
// the strided 0, 2 and 1, 3) is refused before it is parsed, where it would be mixed into the
// wrong layers; the same message with the receiver's cut is taken.
TEST(RoundEngine, DilocoRefusesAMessageOfFragmentsCutAnotherWay) {
  std::vector<ParamTensor> layout;
  for (size_t l = 0; l < 4; ++l) {
    layout.push_back(
        {.name = absl::StrCat("blocks.", l, ".w"), .shape = {4}, .offset = l * 4, .numel = 4});
  }
  DilocoGroup g(layout, /*fragments=*/2,
                [](EngineOptions& o) { o.fragment_cut = FragmentCut::kStrided; });
  ASSERT_EQ(g.engines.size(), static_cast<size_t>(DilocoGroup::kWorkers));
  GossipMessage m;
  EncodedTensor t;
  const std::vector<float> u(8, 0.5f);
  ASSERT_THAT((*g.registries.codecs->Create("none"))->Encode(u, {}, &t), IsOk());
  m.parts.emplace_back("u", std::move(t));
  v1::TensorBundle b = GossipToBundle(std::move(m), "tern", /*step=*/0, /*sender=*/1);
  b.set_bucket(1);
  b.set_buckets(2);
  b.set_cut(CutFingerprint({{{0, 8}}, {{8, 8}}}));
  EXPECT_THAT(g.engines[0]->Deliver(b, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fragment_cut")));
  b.set_cut(CutFingerprint({{{0, 4}, {8, 4}}, {{4, 4}, {12, 4}}}));
  EXPECT_THAT(g.engines[0]->Deliver(b, 0), IsOk());
}

// Streaming DiLoCo's overlap and merge: with overlap_steps = 2 the exchange pushed at step 3
// (H = 4) is mixed at the start of step 5, step 4 taking its local update only; the model then
// becomes α × the local one + (1 − α) × the group's.
TEST(RoundEngine, DilocoMixesAnExchangeOverlapStepsLaterAndMergesWithAlpha) {
  constexpr size_t kDim = 4;
  for (const double alpha : {0.0, 0.5}) {
    SCOPED_TRACE(alpha);
    DilocoGroup g(Layout(kDim), /*fragments=*/0, [alpha](EngineOptions& o) {
      o.algorithm_options.local_steps = 4;
      o.overlap = true;
      o.overlap_steps = 2;
      o.algorithm_options.merge_alpha = alpha;
    });
    // A round's bytes are counted when it is mixed.
    for (int64_t s = 0; s < 5; ++s) EXPECT_THAT(g.Step(s), ::testing::Each(0u));
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {  // still local: 5 steps of 0.1 (i + 1)
      EXPECT_FLOAT_EQ(g.engines[i]->params()[0], 0.5f * (i + 1));
    }
    EXPECT_THAT(g.Step(5), ::testing::Each(3u * kDim * 4));
    // The group's outer model is the mean of 0.4 (i + 1): 1.0.
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      const double merged = alpha * 0.5 * (i + 1) + (1 - alpha) * 1.0;
      EXPECT_NEAR(g.engines[i]->params()[0], merged + 0.1 * (i + 1), 1e-5) << i;
    }
  }
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  o.overlap_steps = 2;  // without --overlap
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--overlap")));
  o.overlap = true;  // H = 2: the next round would start first
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(2)")));
  o.algorithm = "dpsgd";
  o.topology = "ring";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("(1)")));
}

// The run's last exchange is not merged: with α = 0.5 the workers differ after each exchange but
// end on one model, the group's.
TEST(RoundEngine, DilocoEndsTheRunOnTheGroupsModelWhateverAlpha) {
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.algorithm_options.local_steps = 4;
    o.overlap = true;
    o.overlap_steps = 2;
    o.algorithm_options.merge_alpha = 0.5;
    o.final_step = 7;
  });
  for (int64_t s = 0; s < 6; ++s) g.Step(s);
  EXPECT_NE(g.engines[0]->params()[0], g.engines[3]->params()[0]);  // merged at step 5
  g.Step(6);  // the last: exchanged and mixed at once
  for (const auto& e : g.engines) EXPECT_EQ(e->params()[0], g.engines[0]->params()[0]);
}

// keep_overlap: an exchange overlapped by a step ends on θ plus that step (H = 2, the plain
// average: worker i sent 0.2 (i + 1) after step 1 and moved 0.1 (i + 1) more in step 2, while
// it ran), where α = 0 would drop the step; it replaces α, which it is refused beside.
TEST(RoundEngine, DilocoKeepOverlapPutsTheOverlappedStepsOnTheGroupsModel) {
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.overlap = true;
    o.algorithm_options.keep_overlap = true;
  });
  for (int64_t s = 0; s < 3; ++s) g.Step(s);
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_NEAR(g.engines[i]->params()[0], 0.5 + 0.1 * (i + 1), 1e-6) << i;
  }
  // The next update is measured from θ = 0.5, the kept step in it: 0.2 (i + 1) again, a mean of
  // 0.5; mixed after step 4, which is kept in turn.
  g.Step(3);
  g.Step(4);
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_NEAR(g.engines[i]->params()[0], 1.0 + 0.1 * (i + 1), 1e-6) << i;
  }
  // Two steps overlapped (H = 3, --overlap_steps=2): 0.3 (i + 1) sent after step 2, a mean of
  // 0.75, mixed after step 4 with both overlapped steps kept.
  DilocoGroup tau2(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.overlap = true;
    o.overlap_steps = 2;
    o.algorithm_options.local_steps = 3;
    o.algorithm_options.keep_overlap = true;
  });
  for (int64_t s = 0; s < 5; ++s) tau2.Step(s);
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_NEAR(tau2.engines[i]->params()[0], 0.75 + 0.2 * (i + 1), 1e-6) << i;
  }
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  o.algorithm_options.keep_overlap = true;
  o.algorithm_options.merge_alpha = 0.5;
  EXPECT_THAT(RoundEngine::Create(o, &g.registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--merge_alpha")));
}

// With H = 40, three workers run a whole period ahead of the fourth (overlap lets them go on
// after pushing): their messages for the round 40 steps on must be kept for it, not refused as
// too far ahead (32 rounds of one step), or its outer model would leave them out and split
// from theirs.
TEST(RoundEngine, DilocoKeepsMessagesFromNeighboursAPeriodAhead) {
  constexpr int64_t kH = 40;
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.algorithm_options.local_steps = kH;
    o.overlap = true;
  });
  for (int64_t s = 0; s < kH; ++s) g.Step(s);
  for (int64_t s = kH; s < 2 * kH; ++s) g.Step(s, {true, true, true, false});
  for (int64_t s = kH; s < 2 * kH; ++s) g.Step(s, {false, false, false, true});
  g.Step(2 * kH);
  // Two exchanges of 40 steps of the mean move, 0.25: 20; then step 80's own 0.1 (i + 1).
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
    EXPECT_NEAR(g.engines[i]->params()[0], 20 + 0.1 * (i + 1), 1e-3) << i;
  }
}

// One-step-delayed outer steps (H = 2, the plain average, every worker's round moving it
// 0.2 (i + 1): a mean of 0.5): round r's exchange is mixed at the end of round r + 1. Delayed, a
// round starts from θ, one outer step behind; eager, from θ stepped with the worker's own update
// weighed 1/4. The last exchange ends the run on the group's model either way.
TEST(RoundEngine, DilocoDelayedAndEagerTakeEachOuterStepARoundLate) {
  for (const OuterDelay delay : {OuterDelay::kDelayed, OuterDelay::kEager}) {
    SCOPED_TRACE(OuterDelayName(delay));
    DilocoGroup g(Layout(2), /*fragments=*/0, [delay](EngineOptions& o) {
      o.overlap = true;
      o.algorithm_options.outer_delay = delay;
      o.final_step = 6;
    });
    const float eager = delay == OuterDelay::kEager ? 1.0f : 0.0f;
    g.Step(0);
    EXPECT_THAT(g.Step(1), ::testing::Each(0u));  // pushed; its bytes count when it is mixed
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_NEAR(g.engines[i]->params()[0], eager * 0.05 * (i + 1), 1e-6) << i;
    }
    g.Step(2);
    EXPECT_THAT(g.Step(3), ::testing::Each(3u * 2 * 4));  // round 1 mixed: θ = 0.5
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_NEAR(g.engines[i]->params()[0], 0.5 + eager * 0.05 * (i + 1), 1e-6) << i;
    }
    g.Step(4);
    g.Step(5);  // the last: round 3 mixed, round 5 exchanged and mixed at once
    for (const auto& e : g.engines) EXPECT_NEAR(e->params()[0], 1.5, 1e-6);
  }
}

// Eager's stand-in step leaves the outer optimizer's momentum as it was: with Nesterov's
// momentum and every round's update the same whichever round it starts from (constant
// gradients), the run ends on the model the undelayed run ends on.
TEST(RoundEngine, DilocoEagerEndsOnTheUndelayedRunsModel) {
  std::vector<float> ends;
  for (const OuterDelay delay : {OuterDelay::kNone, OuterDelay::kDelayed, OuterDelay::kEager}) {
    DilocoGroup g(Layout(2), /*fragments=*/0, [delay](EngineOptions& o) {
      o.overlap = true;
      o.algorithm_options.outer = "nesterov";
      o.algorithm_options.outer_delay = delay;
      o.final_step = 8;
    });
    for (int64_t s = 0; s < 8; ++s) g.Step(s);
    for (const auto& e : g.engines) EXPECT_EQ(e->params()[0], g.engines[0]->params()[0]);
    ends.push_back(g.engines[0]->params()[0]);
  }
  EXPECT_NEAR(ends[1], ends[0], 1e-5);
  EXPECT_NEAR(ends[2], ends[0], 1e-5);
}

// The warm-up (--sync_steps 2, H = 4, τ = 2, Nesterov): steps 0 and 1 exchange and each is
// mixed at the next step on the plain mean (0.25 a step) with the steps taken since kept; the
// period's exchange at step 3 mixes round 1, whose step 2 stays in x, and the first outer step
// (step 5) is a fresh Nesterov's, its momentum untouched by the warm-up. Refused with an outer
// delay and for an algorithm without an outer loop.
TEST(RoundEngine, DilocoSyncStepsAverageEveryStepThenRunTheOuterLoop) {
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.algorithm_options.local_steps = 4;
    o.algorithm_options.outer = "nesterov:lr=0.7,momentum=0.9";
    o.algorithm_options.sync_steps = 2;
    o.overlap = true;
    o.overlap_steps = 2;
  });
  const auto expect = [&g](int64_t step, double theta, double own_steps) {
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_NEAR(g.engines[i]->params()[0], theta + own_steps * 0.1 * (i + 1), 1e-5)
          << "step " << step << ", worker " << i;
    }
  };
  EXPECT_THAT(g.Step(0), ::testing::Each(0u));  // pushed; counted when mixed
  expect(0, 0, 1);
  EXPECT_THAT(g.Step(1), ::testing::Each(3u * 2 * 4));  // round 0 mixed: θ = 0.25
  expect(1, 0.25, 1);
  EXPECT_THAT(g.Step(2), ::testing::Each(0u));  // round 1 still in flight
  expect(2, 0.25, 2);
  g.Step(3);  // round 1 mixed (θ = 0.5, step 2 kept), then the period's exchange
  expect(3, 0.5, 2);
  g.Step(4);
  g.Step(5);  // mixed: u = 0.2 (i + 1), a mean of 0.5; Nesterov's first step 0.7 (0.5 + 0.45)
  expect(5, 0.5 + 0.665, 1);

  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  o.algorithm_options.sync_steps = 2;
  o.overlap = true;
  o.algorithm_options.outer_delay = OuterDelay::kEager;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--outer_delay=eager")));
  o.algorithm_options.outer_delay = OuterDelay::kNone;
  o.algorithm = "local-sgd";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--sync_steps")));
}

// The norm guard (on, factor 10) judges the outer rounds apart from the warm-up: the first outer
// round moves the model by 5 steps, 20x a warm-up exchange's move for worker 3 against worker 0's
// warm-up, and is still taken by everyone.
TEST(RoundEngine, DilocoTheNormGuardTakesTheFirstOuterRoundAfterTheWarmUp) {
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.algorithm_options.local_steps = 8;
    o.algorithm_options.sync_steps = 3;
    o.round_timeout = absl::Seconds(2);
  });
  for (int64_t s = 0; s < 8; ++s) g.Step(s);
  // θ: 3 warm-up steps and one outer round of 5, each a mean move of 0.25.
  for (const auto& e : g.engines) {
    EXPECT_NEAR(e->params()[0], 8 * 0.25, 1e-5);
    EXPECT_EQ(e->Stats().messages_refused(), 0u);
    EXPECT_EQ(e->Stats().neighbours_dropped(), 0u);
  }
}

// --codec_ladder: over a link whose pushes take 20 ms, against steps of no compute, each worker
// moves its updates one rung narrower every three exchanges (none, int8, fp4), its messages
// shrinking with it, and the group stays on one model (receivers decode each message by the codec
// it names). Refused for an algorithm without an outer loop and for a --codec off the ladder.
TEST(RoundEngine, DilocoNarrowsItsUpdatesWhenTheLinkCannotKeepUp) {
  const auto ladder = [](EngineOptions& o) {
    o.algorithm_options.codec = "none";
    o.codec_ladder = {"none", "int8", "fp4"};
  };
  DilocoGroup g(Layout(4096), /*fragments=*/0, ladder);
  g.transport.latency = absl::Milliseconds(20);
  std::vector<uint64_t> sent;  // worker 0's bytes at each exchange (odd steps: H = 2)
  for (int64_t s = 0; s < 14; ++s) {
    const std::vector<uint64_t> step = g.Step(s);
    if (s % 2 == 1) sent.push_back(step[0]);
  }
  ASSERT_EQ(sent.size(), 7u);
  EXPECT_EQ(sent[0], 3u * 4096 * 4) << "none, to three peers";
  EXPECT_EQ(sent[2], sent[0]) << "the first window: three exchanges";
  EXPECT_LT(sent[3], sent[0] / 3) << "int8";
  EXPECT_EQ(sent[5], sent[3]);
  EXPECT_LT(sent[6], sent[3] * 2 / 3) << "fp4";
  for (const auto& e : g.engines) {
    const LinkState link = e->link_tuner()->Snapshot();
    EXPECT_EQ(link.codec, "fp4");
    EXPECT_EQ(link.changes, 2u);
    EXPECT_LT(link.cu, 0.9);
    EXPECT_GE(link.push_seconds, 0.02);
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(e->params()[i], g.engines[0]->params()[i]) << i;
  }

  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  ladder(o);
  o.algorithm_options.codec = "bf16";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not on --codec_ladder")));
  o.algorithm = "local-sgd";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keeps one codec")));
}

// --local_steps_max: over a link whose pushes take 20 ms, against steps of almost no compute,
// every worker proposes the range's top after its first window (three exchanges), each update
// carries the proposal, and the group moves H at the mix of the next exchange, all at once: the
// exchanges come at steps 1, 3, 5, 7, then 8 apart (15, 23) on every worker, the group's model
// stays the same bytes everywhere, and a restarted worker takes the schedule with the state.
TEST(RoundEngine, DilocoMovesHTogetherWhenTheLinkCannotKeepUp) {
  const auto range = [](EngineOptions& o) {
    o.algorithm_options.local_steps = 2;
    o.algorithm_options.local_steps_min = 2;
    o.algorithm_options.local_steps_max = 8;
    o.cu_target = 0.9;
  };
  DilocoGroup g(Layout(64), /*fragments=*/0, range);
  g.transport.latency = absl::Milliseconds(20);
  std::vector<int64_t> exchanges;
  for (int64_t s = 0; s < 24; ++s) {
    const std::vector<uint64_t> sent = g.Step(s);
    for (int i = 1; i < DilocoGroup::kWorkers; ++i) {
      ASSERT_EQ(sent[i] > 0, sent[0] > 0) << "worker " << i << ", step " << s;
    }
    if (sent[0] > 0) exchanges.push_back(s);
  }
  EXPECT_THAT(exchanges, ::testing::ElementsAre(1, 3, 5, 7, 15, 23));
  for (const auto& e : g.engines) {
    EXPECT_EQ(e->Stats().local_steps(), 8u);
    EXPECT_EQ(e->Stats().local_steps_changes(), 1u);
    EXPECT_EQ(e->steps_tuner()->Snapshot().proposed, 8);
    EXPECT_GT(e->steps_tuner()->Snapshot().need, 8);
    EXPECT_TRUE(std::equal(e->params().begin(), e->params().end(), g.engines[0]->params().begin()));
  }

  // Refused: a range that does not hold --local_steps, one for another algorithm, one with a
  // delayed outer step, and an H as short as the overlap.
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  range(o);
  o.algorithm_options.local_steps = 16;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--local_steps_max=8")));
  o.algorithm_options.local_steps = 4;
  o.algorithm = "local-sgd";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keeps its H")));
  o.algorithm = "diloco";
  o.overlap = true;
  o.overlap_steps = 2;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("H > 2")));
  o.overlap_steps = 1;
  o.algorithm_options.outer_delay = OuterDelay::kDelayed;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("keep H fixed")));
}

// --fragments_min: four fragments, each exchanged in its own turn, over a link whose pushes take
// 20 ms whatever they carry, against steps of about 4 ms: the round trip is what each turn
// waits for. Every worker proposes one turn after its first window, the group moves together,
// and from then on each exchange carries all four fragments at once, on every worker at the
// same steps, the group's model the same bytes everywhere.
TEST(RoundEngine, DilocoTakesFewerFragmentTurnsWhenTheRoundTripIsTheCost) {
  constexpr size_t kTensor = 16;
  std::vector<ParamTensor> layout;
  for (size_t l = 0; l < 4; ++l) {
    layout.push_back({.name = absl::StrCat("w", l),
                      .shape = {kTensor},
                      .offset = l * kTensor,
                      .numel = kTensor});
  }
  DilocoGroup g(layout, /*fragments=*/4, [](EngineOptions& o) {
    o.algorithm_options.local_steps = 4;
    o.algorithm_options.local_steps_min = 2;
    o.algorithm_options.local_steps_max = 64;
    o.algorithm_options.fragments_min = 1;
    o.cu_target = 0.9;
  });
  g.transport.latency = absl::Milliseconds(20);
  constexpr uint64_t kLane = 3 * kTensor * 4;  // one fragment's bytes to the three others
  std::vector<uint64_t> sizes;
  for (int64_t s = 0; s < 400 && (sizes.size() < 8 || sizes.back() != 4 * kLane ||
                                  sizes[sizes.size() - 2] != 4 * kLane);
       ++s) {
    absl::SleepFor(absl::Milliseconds(4));  // the step's compute, as the engine measures it
    const std::vector<uint64_t> sent = g.Step(s);
    for (int i = 1; i < DilocoGroup::kWorkers; ++i) {
      ASSERT_EQ(sent[i], sent[0]) << "worker " << i << ", step " << s;
    }
    if (sent[0] > 0) sizes.push_back(sent[0]);
  }
  ASSERT_GE(sizes.size(), 8u);
  EXPECT_EQ(sizes.front(), kLane) << "one fragment a turn to start with";
  EXPECT_EQ(sizes.back(), 4 * kLane) << "all four at once in the end";
  EXPECT_EQ(sizes[sizes.size() - 2], 4 * kLane);
  for (const auto& e : g.engines) {
    EXPECT_EQ(e->Stats().fragments(), 1u);
    EXPECT_GE(e->Stats().local_steps_changes(), 4u) << "each lane's move counted";
    EXPECT_EQ(e->steps_tuner()->Snapshot().fragments, 1);
    EXPECT_TRUE(std::equal(e->params().begin(), e->params().end(), g.engines[0]->params().begin()));
  }

  // Refused: a count range without a range of H, one wider than the cut.
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  DilocoGroup::Configure(o, 4);
  o.num_workers = DilocoGroup::kWorkers;
  o.algorithm_options.fragments_min = 1;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--local_steps_max")));
  o.algorithm_options.local_steps_max = 8;
  o.algorithm_options.fragments_min = 5;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--fragments_min=5")));
}

// A worker restarted into a run whose group moved H takes the schedule with θ: after the group
// went to H = 8 (exchanges at 15, 23, ...), the restarted worker exchanges with it at 31 and on,
// not every 2 steps from the start as its flags say, and holds the others' model bit for bit.
TEST(RoundEngine, DilocoARestartedWorkerTakesTheGroupsH) {
  const auto range = [](EngineOptions& o) {
    o.algorithm_options.local_steps = 2;
    o.algorithm_options.local_steps_min = 2;
    o.algorithm_options.local_steps_max = 8;
    o.rejoin_timeout = absl::Minutes(5);
    // Worker 3 moves 4x as far a step as worker 0 here, and its first update carries the two
    // rounds it sat out too: 11x worker 0's own, past the guard, which is not what this is about.
    o.norm_guard.factor = 0;
  };
  DilocoGroup g(Layout(8), /*fragments=*/0, range);
  g.transport.latency = absl::Milliseconds(20);
  for (int64_t step = 0; step < 16; ++step) g.Step(step);
  ASSERT_EQ(g.engines[0]->Stats().local_steps(), 8u);
  g.transport.dead[3] = true;  // killed
  const std::vector<bool> live = {true, true, true, false};
  g.Step(16, live);
  auto restarted = g.Restart(3, range);
  ASSERT_THAT(restarted, IsOk());
  ASSERT_THAT(g.Rejoin(**restarted, Layout(8), /*at=*/17, live), IsOk());
  EXPECT_EQ((*restarted)->next_step(), 18);
  g.engines[3] = *std::move(restarted);
  std::vector<int64_t> joiner_sent;
  for (int64_t step = 18; step < 48; ++step) {
    const std::vector<uint64_t> sent = g.Step(step);
    if (sent[3] > 0) joiner_sent.push_back(step);
    if (sent[0] == 0) continue;
    for (int i = 0; i < DilocoGroup::kWorkers; ++i) {
      EXPECT_TRUE(std::equal(g.engines[i]->params().begin(), g.engines[i]->params().end(),
                             g.engines[0]->params().begin()))
          << "worker " << i << ", step " << step;
    }
  }
  // It sits out the exchanges up to two periods past the group (23, and 31 or not), then sends
  // at each of the group's.
  ASSERT_FALSE(joiner_sent.empty());
  EXPECT_THAT(joiner_sent.back(), 47);
  for (int64_t s : joiner_sent) EXPECT_EQ((s + 1) % 8, 0) << s;
  // The group's H taken with the state counts as this worker's one move.
  EXPECT_EQ(g.engines[3]->Stats().local_steps_changes(), 1u);
  EXPECT_EQ(g.engines[3]->Stats().local_steps(), 8u);
  EXPECT_EQ(g.engines[1]->Stats().messages_refused(), 0u);
}

// A trainer that averages its gradients through the worker (tern.optim's DDP warm-up) reads the
// group's mean in the step's reply: mix_now mixes the round at once, --overlap or not; the steps
// after it overlap as before.
TEST(RoundEngine, DilocoMixesAStepAtOnceWhenTheTrainerAsks) {
  DilocoGroup g(Layout(2), /*fragments=*/0, [](EngineOptions& o) {
    o.algorithm_options.local_steps = 4;
    o.algorithm_options.sync_steps = 3;
    o.overlap = true;
  });
  EXPECT_THAT(g.Step(0, {}, /*mix_now=*/true), ::testing::Each(3u * 2 * 4));
  for (const auto& e : g.engines) EXPECT_FLOAT_EQ(e->params()[0], 0.25f);
  EXPECT_THAT(g.Step(1, {}, /*mix_now=*/true), ::testing::Each(3u * 2 * 4));
  for (const auto& e : g.engines) EXPECT_FLOAT_EQ(e->params()[0], 0.5f);
  EXPECT_THAT(g.Step(2), ::testing::Each(0u));  // pushed, mixed at step 3
  EXPECT_THAT(g.Step(3), ::testing::Each(3u * 2 * 4));
  for (int i = 0; i < DilocoGroup::kWorkers; ++i) {  // θ 0.75, and step 3's own move
    EXPECT_NEAR(g.engines[i]->params()[0], 0.75 + 0.1 * (i + 1), 1e-6) << i;
  }
}

TEST(RoundEngine, DilocoOuterDelayNeedsOverlapAndNoMerge) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  DilocoGroup::Configure(o, 0);
  o.num_workers = DilocoGroup::kWorkers;
  o.algorithm_options.outer_delay = OuterDelay::kEager;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--overlap")));
  o.overlap = true;
  o.overlap_steps = 2;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--overlap_steps")));
  o.overlap_steps = 1;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr), IsOk());
  o.algorithm_options.merge_alpha = 0.5;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--merge_alpha")));
  o.algorithm_options.merge_alpha = 0;
  o.algorithm = "local-sgd";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("diloco")));
  ASSERT_THAT(ParseOuterDelay("eager"), IsOk());
  EXPECT_EQ(*ParseOuterDelay("eager"), OuterDelay::kEager);
  EXPECT_THAT(ParseOuterDelay("late").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("none, delayed or eager")));
}

TEST(RoundEngine, CreateRejectsBadConfiguration) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  EngineOptions o;
  o.num_workers = 4;
  o.worker_id = 4;
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o.worker_id = 0;
  o.algorithm = "nope";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o.algorithm = "dpsgd";
  o.topology = "hypercube";
  EXPECT_FALSE(RoundEngine::Create(o, &registries, nullptr).ok());
  o.topology = "ring";
  o.round_timeout = absl::ZeroDuration();
  EXPECT_FALSE(RoundEngine::Create(o, &registries, nullptr).ok());
  // CHOCO's copies of its neighbours need the same graph every round (a scheduler's members
  // repairing a static one are fine).
  o.round_timeout = absl::Seconds(1);
  o.algorithm = "choco";
  o.topology = "one-peer-exponential";
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("same every round")));
  o.topology = "ring";
  o.members = [](int64_t) { return std::optional<std::vector<int>>(); };
  EXPECT_THAT(RoundEngine::Create(o, &registries, nullptr).status(), IsOk());
}

}  // namespace
}  // namespace tern
