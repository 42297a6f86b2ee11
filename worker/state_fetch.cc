#include "worker/state_fetch.h"

#include <algorithm>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace tern {
namespace {

// A refusal that is the source's own (it is gone, or sent bytes that are not a state), which
// another source would not give; the rest (FailedPrecondition: no state to hand over;
// OutOfRange: the step asked for is far ahead; a deadline; a permission) every source would.
bool SourceFault(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

absl::Status Of(int source, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("worker ", source, ": ", s.message()));
}

// One fetch's slices, each driven by a thread of its own (Run), so a slice waiting for its source
// to come to the step, or a long one, holds up no other.
//
// Thread-safety: thread-safe; the slices' threads share it under mu_.
class SliceFetch {
 public:
  SliceFetch(PeerTransport& transport, const StateFetchOptions& options, std::vector<int> sources,
             uint32_t count, int64_t min_step, absl::Time deadline)
      : transport_(transport),
        options_(options),
        count_(count),
        deadline_(deadline),
        sources_(std::move(sources)),
        from_(count),
        got_(count),
        want_(min_step) {
    for (uint32_t k = 0; k < count; ++k) from_[k] = sources_[k];
  }

  // Runs every slice not had yet to its end: had, or a refusal every source would give.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<uint32_t> pending;
    {
      absl::MutexLock lock(&mu_);
      for (uint32_t k = 0; k < count_; ++k) {
        if (!got_[k].has_value()) pending.push_back(k);
      }
    }
    std::vector<std::thread> threads;
    threads.reserve(pending.size());
    for (uint32_t k : pending) threads.emplace_back([this, k] { Slice(k); });
    for (std::thread& t : threads) t.join();
    absl::MutexLock lock(&mu_);
    return fatal_;
  }

  // With one state: whether the slices are of one. If not, the state most of them are of (the
  // newest of those as many) is kept, the others asked again of the sources that sent it, and
  // false is returned (Run again).
  bool OneState() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::map<std::optional<uint32_t>, std::pair<int, int64_t>> states;  // crc -> slices, step
    for (const std::optional<StateSlice>& s : got_) {
      auto& [n, step] = states[s->crc];
      ++n;
      step = std::max(step, s->step);
    }
    if (states.size() == 1) return true;
    auto kept = states.begin();
    for (auto it = states.begin(); it != states.end(); ++it) {
      if (std::tie(it->second.first, it->second.second) >
          std::tie(kept->second.first, kept->second.second)) {
        kept = it;
      }
    }
    // Asked again of the sources that sent it after its latest step, for that step: they hold it
    // (a source of it after an earlier step would make a new one, the group having moved on).
    std::vector<int> agree;
    for (uint32_t k = 0; k < count_; ++k) {
      if (got_[k]->crc == kept->first && got_[k]->step == kept->second.second) {
        agree.push_back(from_[k]);
      }
    }
    for (uint32_t k = 0; k < count_; ++k) {
      if (got_[k]->crc == kept->first) continue;
      got_[k].reset();
      from_[k] = agree[k % agree.size()];
    }
    want_ = kept->second.second;
    return false;
  }

  FetchedState Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FetchedState out;
    out.sources = from_;
    out.bytes = bytes_;
    out.transfer = first_start_.has_value() ? last_end_ - *first_start_ : absl::ZeroDuration();
    return out;
  }
  std::vector<StateSlice> TakeSlices() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::vector<StateSlice> slices;
    slices.reserve(count_);
    for (std::optional<StateSlice>& s : got_) slices.push_back(*std::move(s));
    return slices;
  }

 private:
  // Slice k's loop: ask its source; on "not yet" ask again a poll later (or of a source that had
  // one, once it is a straggler); on the source's own fault, of another.
  void Slice(uint32_t k) ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      int source;
      int64_t want;
      const bool stopped = options_.stopped && options_.stopped();
      {
        absl::MutexLock lock(&mu_);
        if (!fatal_.ok()) return;
        if (stopped) {
          fatal_ = absl::CancelledError("the worker is shutting down");
          return;
        }
        if (absl::Now() >= deadline_) {
          fatal_ = absl::DeadlineExceededError(absl::StrCat("no state after step ", want_,
                                                            " or later from workers ",
                                                            absl::StrJoin(from_, ","), " in time"));
          return;
        }
        source = from_[k];
        want = want_;
      }
      const absl::Time start = absl::Now();
      absl::StatusOr<v1::TensorBundle> b =
          transport_.FetchState(source, options_.run_id, want, k, count_, deadline_);
      const absl::Time end = absl::Now();
      absl::StatusOr<StateSlice> slice =
          b.ok() ? StateSliceFromBundle(*b, options_.run_id, options_.num_params, k, count_,
                                        *options_.codecs)
                 : absl::StatusOr<StateSlice>(b.status());
      if (!Settle(k, source, start, end, b.ok() ? b->ByteSizeLong() : 0, std::move(slice))) {
        return;
      }
      absl::SleepFor(options_.poll);
    }
  }

  // Slice k's answer from `source` (its call from `start` to `end`, `bytes` on the wire): whether
  // to ask again, a poll later.
  bool Settle(uint32_t k, int source, absl::Time start, absl::Time end, uint64_t bytes,
              absl::StatusOr<StateSlice> slice) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (slice.ok()) {
      got_[k] = *std::move(slice);
      bytes_ += bytes;
      first_start_ = std::min(first_start_.value_or(start), start);
      last_end_ = std::max(last_end_, end);
      not_yet_since_.erase(source);
      return false;
    }
    const absl::Status s = Of(source, slice.status());
    if (StateNotYet(s)) {
      const absl::Time since = not_yet_since_.emplace(source, end).first->second;
      if (end - since > options_.straggler) {
        // Stuck (waiting out a round deadline, say): to a source that has not said "not yet".
        for (int other : sources_) {
          if (other != source && !not_yet_since_.contains(other)) {
            from_[k] = other;
            break;
          }
        }
      }
      return true;
    }
    if (!SourceFault(s)) {
      fatal_ = s;
      return false;
    }
    // Gone, or bytes that are not a state: its slices go to the others.
    sources_.erase(std::remove(sources_.begin(), sources_.end(), source), sources_.end());
    if (sources_.empty()) {
      fatal_ = s;
      return false;
    }
    for (uint32_t j = 0; j < count_; ++j) {
      if (from_[j] == source) from_[j] = sources_[j % sources_.size()];
    }
    return true;
  }

  PeerTransport& transport_;
  const StateFetchOptions& options_;
  const uint32_t count_;
  const absl::Time deadline_;
  mutable absl::Mutex mu_;
  std::vector<int> sources_ ABSL_GUARDED_BY(mu_);  // those that have not failed
  std::vector<int> from_ ABSL_GUARDED_BY(mu_);     // each slice's source
  std::vector<std::optional<StateSlice>> got_ ABSL_GUARDED_BY(mu_);
  int64_t want_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::Time> first_start_ ABSL_GUARDED_BY(mu_);
  // Sources whose last answer was "not yet", since their first such.
  absl::flat_hash_map<int, absl::Time> not_yet_since_ ABSL_GUARDED_BY(mu_);
  absl::Time last_end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<FetchedState> FetchStateSlices(PeerTransport& transport,
                                              const StateFetchOptions& options,
                                              std::vector<int> sources, int64_t min_step,
                                              absl::Time deadline) {
  if (sources.empty()) return absl::InvalidArgumentError("no peer to take the state from");
  // One slice a source, one stream each: more streams would take more of the joiner's link from
  // its peers' pushes of the rounds under way, which it must have too (docs/worker.md).
  const uint32_t count = static_cast<uint32_t>(std::min<uint64_t>(
      {sources.size(), kMaxStateSlices, std::max<uint64_t>(options.num_params, 1)}));
  SliceFetch fetch(transport, options, std::move(sources), count, min_step, deadline);
  do {
    TERN_RETURN_IF_ERROR(fetch.Run());
  } while (options.one_state && !fetch.OneState());
  FetchedState out = fetch.Take();
  absl::StatusOr<GroupState> state =
      JoinStateSlices(fetch.TakeSlices(), options.num_params, options.one_state);
  if (!state.ok()) {
    return absl::Status(state.status().code(), absl::StrCat("the state's slices from workers ",
                                                            absl::StrJoin(out.sources, ","), ": ",
                                                            state.status().message()));
  }
  out.state = *std::move(state);
  return out;
}

std::vector<int> MembersAlreadyThere(
    const std::vector<int>& members_then,
    const std::vector<absl::StatusOr<PeerTransport::Position>>& positions, int me) {
  const bool any_mixed = std::any_of(positions.begin(), positions.end(), [](const auto& at) {
    return at.ok() && at->rounds_mixed > 0;
  });
  std::vector<int> there = {me};
  for (int j : members_then) {
    const bool known = j >= 0 && static_cast<size_t>(j) < positions.size();
    // Answered, but holds no exchange while another peer does: it is taking the state.
    const bool taking = known && any_mixed && positions[static_cast<size_t>(j)].ok() &&
                        positions[static_cast<size_t>(j)]->rounds_mixed == 0;
    if (!taking) there.push_back(j);
  }
  for (size_t j = 0; j < positions.size(); ++j) {
    if (positions[j].ok() && positions[j]->rounds_mixed > 0) there.push_back(static_cast<int>(j));
  }
  std::sort(there.begin(), there.end());
  there.erase(std::unique(there.begin(), there.end()), there.end());
  return there;
}

}  // namespace tern
