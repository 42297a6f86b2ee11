// RoundEngine's side of a worker rejoining a running diloco group (worker/state_share.h): asking
// (Rejoin) and answering (SharedState, PublishState).
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/engine.h"

namespace tern {
namespace {

// How long a peer may take to say where it is; one that does not answer is left out.
constexpr absl::Duration kPositionTimeout = absl::Seconds(2);
// How often a peer is asked again for a state it has not reached yet.
constexpr absl::Duration kStatePoll = absl::Milliseconds(50);
// How far past its step a worker waits to hand a state over: an epoch's first round is at most
// the scheduler's lag (4,096 rounds and a few) past the furthest member.
constexpr int64_t kStateHorizon = 1 << 16;

// Every peer's position (entry `me`: none), asked all at once, so a peer behind a black hole
// costs one kPositionTimeout, not one each.
std::vector<absl::StatusOr<PeerTransport::Position>> AskEveryPeer(PeerTransport& transport,
                                                                  int num_workers, int me,
                                                                  const std::string& run_id,
                                                                  int64_t back_from) {
  std::vector<absl::StatusOr<PeerTransport::Position>> at(static_cast<size_t>(num_workers),
                                                          absl::NotFoundError("this worker"));
  const absl::Time deadline = absl::Now() + kPositionTimeout;
  std::vector<std::thread> asks;
  for (int j = 0; j < num_workers; ++j) {
    if (j == me) continue;
    asks.emplace_back([&, j] {
      at[static_cast<size_t>(j)] = transport.AskPosition(j, run_id, back_from, deadline);
    });
  }
  for (std::thread& t : asks) t.join();
  return at;
}

// The peer to take the state from: the furthest of those that mixed an exchange, or, for a
// joiner (whose peers may not have mixed yet: the run just started), the furthest that answered;
// -1 when none. `*furthest` gets its next step.
int PickSource(const std::vector<absl::StatusOr<PeerTransport::Position>>& positions, bool joining,
               int64_t* furthest) {
  int source = -1;
  *furthest = 0;
  for (size_t j = 0; j < positions.size(); ++j) {
    const absl::StatusOr<PeerTransport::Position>& at = positions[j];
    if (at.ok() && at->rounds_mixed > 0 && at->next_step > *furthest) {
      *furthest = at->next_step;
      source = static_cast<int>(j);
    }
  }
  // Not one that is joining itself, while one that has mixed is there.
  for (size_t j = 0; j < positions.size() && source < 0 && joining; ++j) {
    const absl::StatusOr<PeerTransport::Position>& at = positions[j];
    if (at.ok() && at->next_step >= *furthest) {
      *furthest = at->next_step;
      source = static_cast<int>(j);
    }
  }
  return source;
}

// `source` (PickSource's) and up to `most` - 1 others that hold the state as it does (they mixed
// an exchange; or, when it has not, they answered), furthest first.
std::vector<int> PickSources(const std::vector<absl::StatusOr<PeerTransport::Position>>& positions,
                             int source, int most) {
  std::vector<int> sources = {source};
  const bool mixed = positions[static_cast<size_t>(source)]->rounds_mixed > 0;
  std::vector<int> others;
  for (size_t j = 0; j < positions.size(); ++j) {
    const absl::StatusOr<PeerTransport::Position>& at = positions[j];
    if (static_cast<int>(j) != source && at.ok() && (!mixed || at->rounds_mixed > 0)) {
      others.push_back(static_cast<int>(j));
    }
  }
  std::stable_sort(others.begin(), others.end(), [&](int a, int b) {
    return positions[static_cast<size_t>(a)]->next_step >
           positions[static_cast<size_t>(b)]->next_step;
  });
  for (size_t i = 0; i < others.size() && static_cast<int>(sources.size()) < most; ++i) {
    sources.push_back(others[i]);
  }
  return sources;
}

// The furthest next step among the peers that answered, and `at_least`.
int64_t FurthestStep(const std::vector<absl::StatusOr<PeerTransport::Position>>& positions,
                     int64_t at_least) {
  for (const absl::StatusOr<PeerTransport::Position>& at : positions) {
    if (at.ok()) at_least = std::max(at_least, at->next_step);
  }
  return at_least;
}

// The peers a state came from, each once, in the order of its slices.
std::string SourceList(const std::vector<int>& sources) {
  std::vector<int> once;
  for (int s : sources) {
    if (std::find(once.begin(), once.end(), s) == once.end()) once.push_back(s);
  }
  return absl::StrJoin(once, ",");
}

// Whether a state asked for was refused because its source is gone (its channel failed), not
// because it has not come to the step yet.
bool SourceGone(const absl::Status& s) { return absl::IsUnavailable(s) && !StateNotYet(s); }

}  // namespace

absl::StatusOr<std::shared_ptr<const PublishedState>> RoundEngine::SharedState(int64_t min_step) {
  // Without a state shared by the group, the model is this worker's own: a joiner of an elastic
  // run starts from it (within the run's consensus distance of every member's).
  if (!shares_state_ && (asynchronous_ || !options_.member_from)) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.algorithm, " keeps no state shared by the group to hand over"));
  }
  if (const OuterDelay delay = options_.algorithm_options.outer_delay; delay != OuterDelay::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("--outer_delay=", OuterDelayName(delay),
                     " always has an exchange in flight: no worker can rejoin this run"));
  }
  if (!initialized()) return absl::UnavailableError("this worker has no model registered yet");
  // A joiner asks for one a few rounds ahead at most (its epoch's first round): one far past
  // this worker is not waited for (it would hold the asker to its deadline).
  if (const int64_t next = next_step(); min_step > next + kStateHorizon) {
    return absl::OutOfRangeError(absl::StrCat("worker ", options_.worker_id, " is at step ", next,
                                              "; the state after step ", min_step, " is more than ",
                                              kStateHorizon, " steps ahead of it"));
  }
  // A worker that has run its last step publishes no later state: an asker past it would wait
  // its whole --rejoin_timeout for nothing.
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = FinishedLocked();
  }
  if (finished && min_step >= options_.final_step) {
    return absl::OutOfRangeError(
        absl::StrCat("worker ", options_.worker_id, " has finished the run (", options_.final_step,
                     " steps): no state after step ", min_step, " will come"));
  }
  return share_.Get(min_step);
}

absl::Status RoundEngine::PeerBack(int j, int64_t from) {
  if (!IsPeer(j)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", j, " is not a peer of worker ", options_.worker_id));
  }
  absl::MutexLock lock(&mu_);
  // Round r is pushed during step r: one not begun yet has not been started.
  if (next_step_ >= from) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", options_.worker_id, " is at step ", next_step_, ": round ", from,
                     " may be under way already; ask with a later one"));
  }
  peers_back_[j] = from;
  return absl::OkStatus();
}

void RoundEngine::PeerListening(int j) {
  if (!IsPeer(j)) return;
  {
    absl::MutexLock lock(&mu_);
    peers_listening_.insert(j);
  }
  PeerReplaced(j);
  // The rounds it sits out come next, and it must mix them: a push made once on a connection
  // still backing off from its death (up to 2 s) would fail, and it would wait a round_timeout.
  if (transport_ != nullptr) transport_->Reconnect(j);
}

void RoundEngine::PeerReplaced(int j) {
  if (!IsPeer(j)) return;
  std::vector<std::shared_ptr<GossipInbox>> inboxes;
  int64_t under_way;
  {
    absl::MutexLock lock(&mu_);
    // Round next_step_ may be under way (PeerBack's reasoning), later ones not yet.
    under_way = next_step_;
    for (const Registered::Route& r : registered_.lanes) inboxes.push_back(r.inbox);
  }
  for (const auto& inbox : inboxes) inbox->Replaced(j, under_way);
}

void RoundEngine::PublishWanted() {
  if (open_.has_value() || !initialized()) return;
  const int64_t last = next_step() - 1;
  if (last >= 0 && share_.Wanted(last)) PublishState(last);
}

void RoundEngine::PublishState(int64_t step) {
  // A group's state between exchanges only: a round pushed and not yet mixed would be missing
  // from it, and its messages went out before the newcomer was there to get them. A gossip
  // worker's model is its own, as good a start for a joiner with a round in flight (--overlap)
  // as without.
  for (const Lane& lane : lanes_) {
    if (shares_state_ && lane.round.has_value()) return;
  }
  const absl::Span<const float> model = params();
  GroupState state;
  state.step = step;
  state.theta.resize(model.size());
  for (const Lane& lane : lanes_) {
    // A gossip worker's: its model and its own momentum (a joiner's start for both).
    absl::StatusOr<Algorithm::SharedState> mine =
        shares_state_
            ? lane.algorithm->ExportShared()
            : Algorithm::SharedState{.model = std::vector<float>(lane.algorithm->params().begin(),
                                                                 lane.algorithm->params().end()),
                                     .momentum = lane.algorithm->LocalMomentum()};
    if (!mine.ok()) {
      spdlog::warn("worker {}: step {}: no state to hand over: {}", options_.worker_id, step,
                   mine.status().ToString());
      return;
    }
    lane.Place(mine->model, absl::MakeSpan(state.theta));
    if (mine->schedule.has_value()) state.schedules.push_back(*mine->schedule);
    if (!mine->momentum.empty()) {
      state.momentum.resize(model.size());
      lane.Place(mine->momentum, absl::MakeSpan(state.momentum));
    }
  }
  if (!state.momentum.empty() && state.momentum.size() != state.theta.size()) {
    spdlog::warn("worker {}: step {}: a momentum of {} values for a model of {}",
                 options_.worker_id, step, state.momentum.size(), state.theta.size());
    return;
  }
  if (!state.schedules.empty() && state.schedules.size() != lanes_.size()) {
    spdlog::warn("worker {}: step {}: {} exchange schedules for {} lanes", options_.worker_id, step,
                 state.schedules.size(), lanes_.size());
    return;
  }
  auto published = std::make_shared<PublishedState>();
  published->crc = GroupStateCrc(state);
  published->state = std::move(state);
  share_.Publish(std::move(published));
}

StateFetchOptions RoundEngine::FetchOptions(bool one_state) const {
  return StateFetchOptions{.run_id = options_.run_id,
                           .num_params = params().size(),
                           .codecs = &*registries_->codecs,
                           .one_state = one_state,
                           .stopped = [this] { return stopping(); }};
}

absl::Status RoundEngine::AdoptLaneState(Lane& lane, const GroupState& state) {
  const size_t k = static_cast<size_t>(&lane - lanes_.data());
  std::vector<float> theta, momentum;
  absl::Span<const float> m;
  if (!state.momentum.empty()) m = lane.Gather(state.momentum, &momentum);
  std::optional<StepSchedule> schedule;
  if (!state.schedules.empty()) {
    if (state.schedules.size() != lanes_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a state of ", state.schedules.size(),
                                                     " exchange schedules for ", lanes_.size(),
                                                     " lanes"));
    }
    schedule = state.schedules[k];
  }
  const int64_t h = lane.algorithm->StepsPerRound();
  const int64_t turns = lane.algorithm->FragmentCount();
  TERN_RETURN_IF_ERROR(lane.algorithm->AdoptShared(lane.Gather(state.theta, &theta), m, schedule));
  if (lane.gathered()) lane.Scatter(params_);
  // A schedule taken with the state is a move like one agreed in an exchange.
  NoteScheduleMove(k, h, turns,
                   [&] { return absl::StrCat(" with the group's state after step ", state.step); });
  return absl::OkStatus();
}

void RoundEngine::RepairGroupModels(int64_t step) {
  std::vector<Repair> todo;
  todo.swap(repairs_);
  const int me = options_.worker_id;
  for (const Lane& lane : lanes_) {
    if (lane.round.has_value()) {
      // --overlap: an exchange is always in flight, and no peer hands a state over.
      spdlog::warn(
          "worker {}: step {}: this worker's group model is not the group's; not "
          "repaired with an exchange in flight (--overlap)",
          me, step);
      return;
    }
  }
  if (transport_ == nullptr) return;
  const StateFetchOptions fetch = FetchOptions(/*one_state=*/true);
  for (Repair& repair : todo) {
    Lane& lane = lanes_[repair.lane];
    if (static_cast<int>(repair.sources.size()) > options_.state_sources) {
      repair.sources.resize(static_cast<size_t>(options_.state_sources));
    }
    const absl::Time t0 = absl::Now();
    // The peers publish it at their next step's end (or their round loop's next turn): well
    // before the next exchange, which this worker's wait would hold up.
    absl::StatusOr<FetchedState> got =
        FetchStateSlices(*transport_, fetch, repair.sources, step, t0 + options_.round_timeout);
    if (got.ok()) {
      // θ and the outer momentum move only at an exchange: a state after a later step is this
      // one's, unless this lane exchanged again in between, which this worker has not yet.
      for (int64_t t = step + 1; t <= got->state.step; ++t) {
        if (lane.algorithm->Communicates(t)) {
          got = absl::FailedPreconditionError(
              absl::StrCat("their state is after step ", got->state.step,
                           ", past the lane's next exchange (", t, ")"));
          break;
        }
      }
    }
    const absl::Status s = got.ok() ? AdoptLaneState(lane, got->state) : got.status();
    if (!s.ok()) {
      spdlog::warn(
          "worker {}: round {}: this worker's group model (lane {}) is not the one {} of the "
          "workers heard hold; not repaired: {} (tried again at the next exchange that shows it)",
          me, repair.round, repair.lane, repair.holders, s.ToString());
      continue;
    }
    counters_.CountGroupRepair();
    spdlog::warn(
        "worker {}: round {}: this worker's group model (lane {}, held by {} of the workers "
        "heard) was not the one {} held: repaired with the state of workers {} after step {} "
        "({:.1f} MB in {:.2f} s)",
        me, repair.round, repair.lane, repair.ours, repair.holders, SourceList(got->sources),
        got->state.step, static_cast<double>(got->bytes) / 1e6,
        absl::ToDoubleSeconds(absl::Now() - t0));
  }
}

absl::Status RoundEngine::Rejoin() {
  const absl::Time t0 = absl::Now();
  const int me = options_.worker_id;
  // In an elastic run, a worker that joins after the start is a member from a later step: the
  // state it takes must cover every round before it, which the group mixed without it.
  int64_t joins_at = 0;
  if (options_.member_from) {
    std::optional<int64_t> from = options_.member_from();
    for (; !from.has_value(); from = options_.member_from()) {
      if (stopping()) return absl::CancelledError("the worker is shutting down");
      if (absl::Now() - t0 > options_.rejoin_timeout) {
        return absl::DeadlineExceededError(
            "the scheduler did not say from which step this worker is a member");
      }
      absl::SleepFor(kStatePoll);
    }
    joins_at = *from;
  }
  if (!shares_state_ && joins_at == 0) {
    // A gossip worker the run started with: its own x0 is the run's start.
    absl::MutexLock lock(&mu_);
    rejoin_asking_ = false;
    return absl::OkStatus();
  }
  // The furthest peer's next step, among those that mixed an exchange (until one has, the
  // group's state is everyone's start, and a peer ahead is only quicker to start). Every message
  // still to come is for a round at or past it: a round's messages go out at the end of its
  // step, before its sender's next step begins.
  int64_t furthest = 0;
  std::vector<absl::StatusOr<PeerTransport::Position>> positions =
      AskEveryPeer(*transport_, options_.num_workers, me, options_.run_id, /*back_from=*/0);
  const int source = PickSource(positions, joins_at > 0, &furthest);
  if (source < 0) {  // a run starting (or nobody there): from x0
    if (joins_at > 0) {
      return absl::UnavailableError(
          absl::StrCat("this worker joins the run at step ", joins_at,
                       " and no peer answered to hand it the group's state; restart it"));
    }
    absl::MutexLock lock(&mu_);
    rejoin_asking_ = false;
    return absl::OkStatus();
  }
  if (const OuterDelay delay = options_.algorithm_options.outer_delay; delay != OuterDelay::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the group is at step ", furthest, ", and a run with --outer_delay=", OuterDelayName(delay),
        " always has an exchange in flight: a worker cannot rejoin it; start the run again"));
  }
  if (shares_state_ && options_.overlap) {
    // Its first update would span the steps since the state, not the group's H: over the norm
    // guard for some peers and not others, which then mix the round apart.
    return absl::FailedPreconditionError(
        absl::StrCat("the group is at step ", furthest,
                     ", and a diloco run with --overlap cannot take a worker back yet; start the "
                     "run again"));
  }
  std::vector<int> sources = PickSources(positions, source, options_.state_sources);
  std::optional<std::vector<int>> there;
  if (options_.members && options_.member_from) {
    if (std::optional<std::vector<int>> then = options_.members(joins_at); then.has_value()) {
      there = MembersAlreadyThere(*then, positions, me);
    }
  }
  spdlog::info("worker {}: the group is at step {}: rejoining with the state of workers {}", me,
               furthest, absl::StrJoin(sources, ","));
  // Take those messages from now on (the inbox keeps them until this worker gets there), with
  // no peer waiting for this worker's own until it says from when (AnnounceBack)...
  for (Lane& lane : lanes_) lane.inbox->Skip(furthest);
  {
    absl::MutexLock lock(&mu_);
    next_step_ = furthest;
    sit_out_below_ = std::numeric_limits<int64_t>::max();
    rejoin_asking_ = false;
    members_at_rejoin_ = std::move(there);
  }
  // ... and the state after a step that mixed every round before them.
  const absl::Time deadline = t0 + options_.rejoin_timeout;
  int64_t min_step = std::max(furthest, joins_at) - 1;
  {
    absl::MutexLock lock(&mu_);
    min_step = std::max(min_step, rejoin_refused_);
  }
  const StateFetchOptions fetch = FetchOptions(/*one_state=*/shares_state_);
  absl::StatusOr<FetchedState> got = absl::UnknownError("no state asked for");
  for (;;) {
    got = FetchStateSlices(*transport_, fetch, sources, min_step, deadline);
    if (SourceGone(got.status())) {
      // Every source died or left while this worker waited for its state: others will do.
      positions =
          AskEveryPeer(*transport_, options_.num_workers, me, options_.run_id, /*back_from=*/0);
      for (int j : sources) positions[static_cast<size_t>(j)] = got.status();
      int64_t at = 0;
      if (const int next = PickSource(positions, joins_at > 0, &at); next >= 0) {
        sources = PickSources(positions, next, options_.state_sources);
        spdlog::info("worker {}: {}; taking the state from workers {}", me, got.status().ToString(),
                     absl::StrJoin(sources, ","));
      }
      if (absl::Now() + kStatePoll < deadline) {
        absl::SleepFor(kStatePoll);
        continue;
      }
    }
    if (got.ok() && got->state.step < min_step) {
      got = absl::InvalidArgumentError(absl::StrCat(
          "a state after step ", got->state.step, ", before the step asked for (", min_step, ")"));
    }
    if (!got.ok() || !shares_state_) break;
    // A message refused meanwhile as too far ahead (the group ran more than the inbox's window
    // while the state came) is one of a round this state must cover too: a later one, then.
    absl::MutexLock lock(&mu_);
    if (rejoin_refused_ <= got->state.step || absl::Now() + kStatePoll >= deadline) break;
    min_step = rejoin_refused_;
  }
  if (absl::IsCancelled(got.status())) return got.status();  // shutting down
  if (!got.ok()) {
    // Past the run's end (its peers finished before the step it is a member from) a restart
    // would not help.
    const bool ended = absl::IsOutOfRange(got.status()) &&
                       absl::StrContains(got.status().message(), "has finished the run");
    return absl::Status(
        got.status().code(),
        absl::StrCat("rejoining the run at step ", furthest,
                     ": the state: ", got.status().message(),
                     ended ? "; the run ended before this worker's first step"
                           : "; this worker cannot go on from its own start: restart it"));
  }
  if (!shares_state_) return TakeModel(*got, t0, deadline);
  const GroupState& state = got->state;
  for (Lane& lane : lanes_) {
    TERN_RETURN_IF_ERROR(AdoptLaneState(lane, state));
    lane.inbox->Skip(state.step + 1);
  }
  {
    absl::MutexLock lock(&mu_);
    next_step_ = state.step + 1;
  }
  const double mb = static_cast<double>(got->bytes) / 1e6;
  const double took = absl::ToDoubleSeconds(absl::Now() - t0);
  // The peers went on meanwhile and may be in, or past, this worker's next exchanges: it sits
  // them out (sends nothing, mixes the others' updates) until a round none of its peers has
  // started, from which they wait for it. Without that a late message could be mixed by some
  // peers and not others, and θ would split.
  absl::StatusOr<int64_t> from = AnnounceBack(state.step + 1, deadline);
  if (!from.ok()) return from.status();
  {
    absl::MutexLock lock(&mu_);
    sit_out_below_ = *from;
  }
  spdlog::info(
      "worker {}: rejoined at step {} with the state of workers {} ({:.1f} MB in {:.2f} s, {:.2f} "
      "s of it on the wire); sends its updates from round {} on",
      me, state.step + 1, SourceList(got->sources), mb, took, absl::ToDoubleSeconds(got->transfer),
      *from);
  return absl::OkStatus();
}

absl::Status RoundEngine::TakeModel(const FetchedState& got, absl::Time t0, absl::Time deadline) {
  const GroupState& state = got.state;
  // A gossip method's state is the worker's own: it starts again from the peers' models and
  // momentum (CHOCO's public copies come in step in its first rounds; error feedback and the
  // like from zero). Nothing of a round is shared, so it sits nothing out: it goes on from a
  // round none of its peers has started yet, from which they wait for it (AnnounceBack), with a
  // model the transfer's worth of rounds old, which mixing pulls in.
  // Behind where the group is, its peers' messages of the rounds it still had to run would have
  // been refused as too far ahead, or never sent (a newcomer gets one push at a time), and each
  // side would have waited a round deadline for the other. Waited for only once its first
  // message came, a peer with no other neighbour up runs on alone meanwhile and may have closed
  // that round already: the two would never mix again.
  absl::StatusOr<int64_t> from = AnnounceBack(state.step + 1, deadline);
  if (!from.ok()) return from.status();
  std::vector<float> mine;
  for (Lane& lane : lanes_) {
    TERN_RETURN_IF_ERROR(
        lane.algorithm->Init(lane.Gather(state.theta, &mine), options_.worker_id, lane.blocks));
    if (!state.momentum.empty()) {
      TERN_RETURN_IF_ERROR(lane.algorithm->AdoptLocalMomentum(lane.Gather(state.momentum, &mine)));
    }
    lane.algorithm->JoinedLate();
    lane.inbox->Skip(*from);
  }
  if (lanes_.size() > 1) {
    // The lanes hold their values again: back onto one buffer, the model's.
    own_params_ = state.theta;
    params_ = {};
    TERN_RETURN_IF_ERROR(BindParams(absl::MakeSpan(own_params_)));
  }
  {
    absl::MutexLock lock(&mu_);
    next_step_ = *from;
    // A message for an earlier round is one its sender must not wait for this worker's in.
    sit_out_below_ = *from;
  }
  spdlog::info(
      "worker {}: joined at step {} with the model of workers {} after step {} ({:.1f} MB in "
      "{:.2f} s, {:.2f} s of it on the wire)",
      options_.worker_id, *from, SourceList(got.sources), state.step,
      static_cast<double>(got.bytes) / 1e6, absl::ToDoubleSeconds(absl::Now() - t0),
      absl::ToDoubleSeconds(got.transfer));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RoundEngine::AnnounceBack(int64_t next, absl::Time deadline) {
  const int me = options_.worker_id;
  // Two periods past the furthest peer: time enough for the question to reach them all, unless
  // a peer runs rounds faster than the question goes round (one with no neighbour to wait for):
  // twice the room on each try.
  int64_t margin = 2 * lanes_[0].algorithm->StepsPerRound();
  absl::Status last;
  while (absl::Now() < deadline) {
    if (stopping()) return absl::CancelledError("the worker is shutting down");
    const int64_t from = FurthestStep(AskEveryPeer(*transport_, options_.num_workers, me,
                                                   options_.run_id, /*back_from=*/0),
                                      next) +
                         margin;
    bool all = true;
    for (const absl::StatusOr<PeerTransport::Position>& at :
         AskEveryPeer(*transport_, options_.num_workers, me, options_.run_id, from)) {
      // One that went past `from` meanwhile: ask everyone again, later. One that does not
      // answer is gone (or partitioned): it waits for nobody, as for any dead peer.
      if (absl::IsFailedPrecondition(at.status())) {
        all = false;
        last = at.status();
      }
    }
    if (all) return from;
    margin = std::min<int64_t>(2 * margin, int64_t{1} << 30);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker ", me, ": no round every peer had still to start before the rejoin's deadline (",
      last.ToString(), ")"));
}

}  // namespace tern
