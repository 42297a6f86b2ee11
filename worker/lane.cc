#include "worker/lane.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace tern {

bool PeerUnreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled;
}

absl::Span<const float> Lane::Gather(absl::Span<const float> whole,
                                     std::vector<float>* into) const {
  if (!gathered()) return whole.subspan(offset, size);
  into->resize(size);
  float* out = into->data();
  for (const Piece& p : pieces) out = std::copy_n(whole.data() + p.offset, p.size, out);
  return *into;
}

void Lane::Scatter(absl::Span<float> whole) const {
  const absl::Span<const float> mine = algorithm->params();
  if (mine.data() == whole.data() + offset) return;  // bound in place
  Place(mine, whole);
}

void Lane::Place(absl::Span<const float> mine, absl::Span<float> whole) const {
  const float* in = mine.data();
  for (const Piece& p : pieces) {
    std::copy_n(in, p.size, whole.data() + p.offset);
    in += p.size;
  }
}

void PeerHealth::Judge(int me, int64_t step, const std::vector<int>& nbrs,
                       const std::map<int, absl::Status>& results,
                       const std::map<int, GossipMessage>& received, uint64_t* sent_to,
                       std::vector<int>* mixed, std::vector<int>* dropped, bool pushed,
                       bool deadline_passed) {
  for (int j : nbrs) {
    const size_t at = static_cast<size_t>(j);
    const bool was_up = up_[at];
    auto it = results.find(j);
    const absl::Status s =
        it == results.end() ? absl::DeadlineExceededError("push still running") : it->second;
    if (!pushed) {
      // No verdict on the peer from pushes never made.
    } else if (s.ok()) {
      ++*sent_to;
      up_[at] = true;  // reachable and in step with us: worth waiting for
    } else if (PeerUnreachable(s)) {
      if (was_up) {
        spdlog::warn("worker {}: round {}: push to {} failed: {}", me, step, j, s.ToString());
      }
      up_[at] = false;
    } else {
      // Refused (a round it already closed, or one too far ahead of it): it is alive, and worth
      // waiting for. After a partition heals the two sides run rounds apart; without the wait
      // the side ahead never lets the other catch up and they never mix again.
      up_[at] = true;
      spdlog::warn("worker {}: round {}: worker {} refused our message: {}", me, step, j,
                   s.ToString());
    }
    if (received.count(j)) {
      if (!was_up) spdlog::info("worker {}: round {}: worker {} is back", me, step, j);
      up_[at] = true;
      heard_[at] = true;
      returning_[at] = false;
      mixed->push_back(j);
    } else {
      // A slow neighbour that took our message stays awaited next round (it is behind, not
      // gone); one that is unreachable was marked down above.
      if (was_up && deadline_passed) {
        spdlog::warn("worker {}: round {}: no message from {} by the deadline; dropped this round",
                     me, step, j);
      } else if (was_up) {
        spdlog::warn(
            "worker {}: round {}: no message from {}, and none will come (replaced, its push "
            "failed, or it went on past this round); dropped this round",
            me, step, j);
      }
      dropped->push_back(j);
    }
  }
}

void Lane::Push(InFlight& r, const PeerTransport::Chunks& chunks, const PeerHealth& health,
                PeerTransport* transport) {
  r.pushes = std::make_shared<RoundPushes>();
  r.pushes->sent = absl::Now();
  {
    absl::MutexLock lock(&r.pushes->mu);
    for (int j : r.nbrs) {
      if (health.up(j)) r.pushes->awaited.insert(j);
    }
  }
  for (int j : r.nbrs) {
    std::deque<HeldPush>& queue = held[static_cast<size_t>(j)];
    SendHeld(j, health, transport);
    if (queue.empty() && Room(j, health)) {
      Send(j, r.step, chunks, r.deadline, r.lasting_deadline, r.pushes, health, transport);
      continue;
    }
    inbox->GiveUp(r.step, j);
    // To a neighbour gone (not rejoining) the probe under way is enough: its state, once it
    // rejoins, covers the rounds it missed.
    if (health.ReachOf(j) != PeerTransport::Reach::kWaitForReady) continue;
    // After the held ones, in order: a joiner stops waiting for a sender's round once a later
    // one of its came (GossipInbox::kPassedBy).
    if (queue.size() == kMaxHeld) queue.pop_front();
    queue.push_back({.step = r.step,
                     .chunks = chunks,
                     .deadline = r.deadline,
                     .lasting_deadline = r.lasting_deadline,
                     .pushes = r.pushes});
  }
}

bool Lane::Room(int j, const PeerHealth& health) const {
  if (health.up(j)) return true;
  const std::shared_ptr<RoundPushes>& last = last_push[static_cast<size_t>(j)];
  if (last == nullptr || last->Finished(j)) return true;
  if (health.ReachOf(j) != PeerTransport::Reach::kWaitForReady) return false;
  const std::shared_ptr<RoundPushes>& before = push_before[static_cast<size_t>(j)];
  return before == nullptr || before->Finished(j);
}

void Lane::SendHeld(int j, const PeerHealth& health, PeerTransport* transport) {
  std::deque<HeldPush>& queue = held[static_cast<size_t>(j)];
  while (!queue.empty() && Room(j, health)) {
    HeldPush p = std::move(queue.front());
    queue.pop_front();
    Send(j, p.step, p.chunks, p.deadline, p.lasting_deadline, p.pushes, health, transport);
  }
}

void Lane::Send(int j, int64_t step, const PeerTransport::Chunks& chunks, absl::Time deadline,
                absl::Time lasting_deadline, const std::shared_ptr<RoundPushes>& pushes,
                const PeerHealth& health, PeerTransport* transport) {
  const PeerTransport::Reach reach = health.ReachOf(j);
  const bool returning = reach == PeerTransport::Reach::kWaitForReady;
  const absl::Time until = returning ? std::max(deadline, lasting_deadline) : deadline;
  if (until <= absl::Now()) return;  // a held one nobody would take now
  push_before[static_cast<size_t>(j)] = std::move(last_push[static_cast<size_t>(j)]);
  last_push[static_cast<size_t>(j)] = pushes;
  transport->Send(j, chunks, until, reach, [pushes, box = inbox, j, step](absl::Status s) {
    if (PeerUnreachable(s)) box->GiveUp(step, j);
    absl::MutexLock lock(&pushes->mu);
    pushes->ended[j] = {std::move(s), absl::Now()};
  });
}

absl::StatusOr<RoundReport> Lane::Finish(InFlight r, int me, PeerHealth& health) {
  RoundReport report;
  // Wait for the neighbours believed up; take whatever the others sent too.
  const absl::Time t_wait = absl::Now();
  std::vector<int> wait_for;
  for (int j : r.nbrs) {
    if (health.up(j)) wait_for.push_back(j);
  }
  // A wait of more than a second says in the log whom it waits for, and until when.
  const absl::Time patience = std::min(r.deadline, t_wait + absl::Seconds(1));
  if (std::vector<int> missing = inbox->Await(r.step, wait_for, patience);
      !missing.empty() && patience < r.deadline) {
    spdlog::info("worker {}: round {}: waiting for peers {} (up to {:.1f} s more)", me, r.step,
                 absl::StrJoin(missing, ", "), absl::ToDoubleSeconds(r.deadline - absl::Now()));
  }
  std::map<int, GossipMessage> received = inbox->Take(r.step, wait_for, r.nbrs, r.deadline);
  const absl::Time t_recv = absl::Now();
  for (const auto& [j, m] : received) {
    if (!r.group_crc.has_value() || !m.group_crc.has_value()) continue;
    report.group_crcs[j] = *m.group_crc;
    if (*m.group_crc != *r.group_crc) report.group_mismatch.push_back(j);
  }
  {
    absl::MutexLock lock(&r.pushes->mu);
    r.pushes->mu.AwaitWithDeadline(absl::Condition(r.pushes.get(), &RoundPushes::Done),
                                   r.deadline + absl::Seconds(1));
    for (const auto& [j, e] : r.pushes->ended) report.results[j] = e.status;
    absl::Time last = r.pushes->sent;
    bool all = !r.pushes->awaited.empty();
    for (int j : r.pushes->awaited) {
      const auto it = r.pushes->ended.find(j);
      all = all && it != r.pushes->ended.end() && it->second.status.ok();
      if (all) last = std::max(last, it->second.at);
    }
    if (all) report.push_seconds = absl::ToDoubleSeconds(last - r.pushes->sent);
  }
  report.wait_seconds = absl::ToDoubleSeconds(t_recv - t_wait);
  report.transfer_seconds = absl::ToDoubleSeconds(absl::Now() - t_recv);
  health.Judge(me, r.step, r.nbrs, report.results, received, &report.sent_to, &report.mixed,
               &report.dropped, /*pushed=*/!r.sat_out, /*deadline_passed=*/t_recv >= r.deadline);

  report.combine_started = absl::Now();
  MixingRow row = DropNeighbours(r.row, report.dropped);
  std::map<int, const GossipMessage*> ptrs;
  for (const auto& [j, m] : received) ptrs[j] = &m;
  absl::Status s = algorithm->Combine(row, ptrs);
  if (!s.ok()) {
    // Messages were checked on arrival, so this is unexpected; keep the local model rather than
    // stop training.
    spdlog::error("worker {}: round {}: combine failed ({}); keeping the local model", me, r.step,
                  s.ToString());
    MixingRow alone;
    TERN_RETURN_IF_ERROR(algorithm->Combine(alone, {}));
    report.mixed.clear();
    report.dropped = r.nbrs;
  }
  return report;
}

}  // namespace tern
