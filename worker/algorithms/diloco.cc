#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/finite.h"
#include "common/simd.h"
#include "worker/algorithms/algorithms.h"
#include "worker/algorithms/base.h"

namespace tern {
namespace {

// The per-value passes, on plain pointers: through the members GCC reloaded the vector's data
// pointer every value and left the loops scalar (a tenth of a daemon's CPU in the LM race's
// profile). Element-wise, so every version gives the same bits.

// out = decay r + (x - from): the update with the residual's decayed remainder.
TERN_MULTIVERSION void UpdateWithResidual(size_t n, float decay, const float* __restrict r,
                                          const float* __restrict x, const float* __restrict from,
                                          float* __restrict out) {
  for (size_t i = 0; i < n; ++i) out[i] = decay * r[i] + (x[i] - from[i]);
}

// r = u - d: what the others will not decode of u (d, u as they decode it).
TERN_MULTIVERSION void Difference(size_t n, const float* __restrict u, const float* __restrict d,
                                  float* __restrict r) {
  for (size_t i = 0; i < n; ++i) r[i] = u[i] - d[i];
}

// x = θ + (x - sent): the steps taken since the send, kept on the new θ.
TERN_MULTIVERSION void Rebase(size_t n, const float* __restrict theta, const float* __restrict sent,
                              float* __restrict x) {
  for (size_t i = 0; i < n; ++i) x[i] = theta[i] + (x[i] - sent[i]);
}

// x = α x + (1 − α) θ: Streaming DiLoCo's merge.
TERN_MULTIVERSION void Merge(size_t n, float alpha, const float* __restrict theta,
                             float* __restrict x) {
  for (size_t i = 0; i < n; ++i) x[i] = alpha * x[i] + (1 - alpha) * theta[i];
}

// Every H steps from the start, lane k of P H·k/P steps early; with fragments_min, every fragment
// its own turn to start with.
StepSchedule FirstSchedule(const AlgorithmOptions& o) {
  const int64_t h = std::max(1, o.local_steps);
  return {.period = h,
          .from = -(h * o.lane / std::max(1, o.lanes)),
          .fragments = o.fragments_min > 0 ? o.fragments_max : 0};
}

// What a worker proposes for the group's schedule: H, and with fragments_min the fragment count
// (0: none). The group takes the largest, H first, so every worker that mixes the same updates
// takes the same pair.
struct Proposal {
  int64_t h = 0;
  int64_t fragments = 0;
  auto operator<=>(const Proposal&) const = default;
};

// DiLoCo's outer loop without a server. Between exchanges the worker takes the trainer's own
// steps on its model x (the built-in trainer's are plain SGD; a PyTorch trainer's are its AdamW).
// Every H steps (local_steps) each worker sends its update over those steps, u_i = x_i − θ (the
// negative of DiLoCo's pseudo-gradient), compressed with the codec (any: dense_ here) and error
// feedback — the residual first decays by the outer optimizer's residual_decay(), SparseLoCo's
// momentum — and every worker averages the group's decoded updates ū = (1/k) Σ_j D(C(u_j)) over
// the k it heard, its own among them, takes the outer step θ += Outer(ū) and starts again from x =
// θ (or, with merge_alpha α, from α x + (1 − α) θ: Streaming DiLoCo's merge of the steps taken
// while an overlapped exchange ran; or, keep_overlap, from θ plus those steps, as the warm-up
// below does).
//
// The run's first sync_steps steps are synchronous data parallelism (PostLocalSGD's warm-up): every
// step exchanges, θ takes the plain mean ū without the outer optimizer (its momentum starts at the
// first outer step), and x ← θ plus whatever steps x took since it sent (overlap_steps − 1 of them
// at the last, when the next exchange is a period away), so no local step is lost or counted
// twice.
//
// With a delayed outer step (outer_delay, the engine's overlap mixing each round at the next
// exchange) a round's exchange runs during the next round's inner steps: at the end of round r
// the worker sends u_r measured from where round r started, takes round r − 1's outer step (the
// group's mean, heard meanwhile) and starts round r + 1 at once from θ (delayed) or from θ
// stepped with its own u_r weighed as its share of the mean (eager: a stand-in that the group's
// mean replaces a round later, so every update is in θ exactly once and θ stays the same on
// every worker).
//
// Every worker hears every other (AllToAll: the engine refuses any graph but the complete one)
// and sums the same decoded messages with the same weights in the same order (by worker id), so
// θ and the outer momentum are the same bytes on every worker: the state an aggregator would
// otherwise hold. A worker that dies drops out of every survivor's mean in the same round (its
// messages stop), and the survivors go on with one θ. For that reason no clipping either (a
// worker's ū must not depend on who computes it); the engine's norm guard still refuses outsized
// messages.
class Diloco final : public AlgorithmBase {
 public:
  Diloco(const AlgorithmOptions& options, const CodecRegistry* codecs,
         std::unique_ptr<OuterOptimizer> outer)
      : AlgorithmBase(options, codecs),
        outer_(std::move(outer)),
        schedule_(FirstSchedule(options)) {}

  std::string Name() const override { return "diloco"; }
  std::vector<std::string> MessageParts() const override { return {"u"}; }
  bool AllToAll() const override { return true; }
  // Every H steps, a fragment (lane k of P) H·k/P steps early so fragments take turns (the
  // schedule's start, before step 0), and at the run's last step. When the group moves H (below,
  // Combine), the new period counts from the step after the lane's last exchange; when it moves
  // the fragment count too, lane k exchanges in turn k mod q of q (AlignedSchedule).
  bool Communicates(int64_t step) const override {
    return step < options_.sync_steps || step + 1 == options_.final_step ||
           (step >= schedule_.from && (step + 1 - schedule_.from) % schedule_.period == 0);
  }
  int64_t StepsPerRound() const override { return schedule_.period; }
  int64_t FragmentCount() const override { return schedule_.fragments; }
  void ProposeSchedule(int64_t h, int64_t fragments) override {
    if (!tuned()) return;
    proposal_.h = std::clamp<int64_t>(h, min_h(), max_h());
    if (fragments_tuned()) proposal_.fragments = ClampFragments(fragments);
  }
  // The residual carries over: it is what the others have not decoded of the updates yet,
  // whichever codec sent them.
  absl::Status SetCodec(const std::string& spec) override {
    TERN_ASSIGN_OR_RETURN(dense_, codecs_->Create(spec));
    return absl::OkStatus();
  }

  absl::StatusOr<SharedState> ExportShared() const override {
    if (own_.numel != 0) {
      return absl::FailedPreconditionError("diloco: an exchange is sent and not yet mixed");
    }
    if (delayed()) {
      // θ then lags a round behind the updates sent: a newcomer would need the round in flight.
      return absl::FailedPreconditionError(
          absl::StrCat("diloco with --outer_delay=", OuterDelayName(options_.outer_delay),
                       " always has an exchange in flight: a worker cannot rejoin it"));
    }
    const absl::Span<const float> momentum = outer_->momentum();
    SharedState state{.model = anchor_,
                      .momentum = std::vector<float>(momentum.begin(), momentum.end())};
    if (tuned()) state.schedule = schedule_;
    return state;
  }

  absl::Status AdoptShared(absl::Span<const float> model, absl::Span<const float> momentum,
                           const std::optional<StepSchedule>& schedule) override {
    const size_t n = x_.size();
    if (model.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("diloco: a shared model of ", model.size(), " values for ", n));
    }
    // The group's H and where it counts from, or this worker would exchange at other steps.
    if (tuned() && !schedule.has_value()) {
      return absl::InvalidArgumentError(
          "diloco: a shared state without its exchange schedule (H moves in this run)");
    }
    if (schedule.has_value() &&
        (schedule->period < 1 || schedule->period > static_cast<int64_t>(kMaxLocalSteps))) {
      return absl::InvalidArgumentError(
          absl::StrCat("diloco: a shared schedule of ", schedule->period, " steps per exchange"));
    }
    // The group's fragment count, within this worker's range (0 where it does not move).
    if (schedule.has_value() &&
        schedule->fragments != (fragments_tuned() ? ClampFragments(schedule->fragments) : 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "diloco: a shared schedule in ", schedule->fragments, " fragments; this worker's are ",
          fragments_tuned() ? absl::StrCat(min_fragments(), " to ", options_.fragments_max)
                            : std::string("fixed")));
    }
    if (delayed()) {
      return absl::FailedPreconditionError(
          absl::StrCat("diloco with --outer_delay=", OuterDelayName(options_.outer_delay),
                       " cannot take a shared state: a worker cannot rejoin it"));
    }
    // Restore checks the size before it changes anything.
    TERN_RETURN_IF_ERROR(outer_->Restore(momentum));
    anchor_.assign(model.begin(), model.end());
    x_ = anchor_;
    residual_.assign(n, 0.0f);
    own_ = EncodedTensor();
    withdrawn_ = false;
    sent_ = std::vector<float>();
    if (schedule.has_value()) {
      schedule_ = *schedule;
      // The group's H until this worker has measured its link: its own start would pull a group
      // that moved H back to it.
      if (tuned()) proposal_ = sent_proposal_ = {schedule_.period, schedule_.fragments};
    }
    return absl::OkStatus();
  }

  void WithdrawOwn() override { withdrawn_ = true; }

  absl::Span<const float> GroupModel() const override { return anchor_; }

  absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> g, float lr,
                                        int64_t step) override {
    const size_t n = x_.size();
    // x - lr g as y + (-lr) g: the same bits.
    Axpy(n, -lr, g.data(), x_.data());
    GossipMessage msg;
    if (!Communicates(step)) return msg;
    const float decay = outer_->residual_decay();
    // Delayed, x moved from start_, which θ has since passed by a round's outer step.
    const std::vector<float>& from = delayed() ? start_ : anchor_;
    scratch_.resize(n);
    UpdateWithResidual(n, decay, residual_.data(), x_.data(), from.data(), scratch_.data());
    TERN_RETURN_IF_ERROR(AddPart(&msg, "u", scratch_, /*codec=*/nullptr, step));
    last_sent_ = step;
    sent_proposal_ = proposal_;
    if (tuned()) msg.propose_local_steps = static_cast<uint32_t>(proposal_.h);
    if (fragments_tuned()) msg.propose_fragments = static_cast<uint32_t>(proposal_.fragments);
    // The residual keeps what the others will not decode of it.
    own_ = msg.parts.back().second;
    mean_.resize(n);
    TERN_RETURN_IF_ERROR(DecodeChecked(worker_, own_, "u", absl::MakeSpan(mean_)));
    Difference(n, scratch_.data(), mean_.data(), residual_.data());
    last_round_ = step + 1 == options_.final_step;
    sync_round_ = step < options_.sync_steps;
    if (sync_round_ || options_.keep_overlap) {
      const absl::Span<const float> x = x_;
      sent_.assign(x.begin(), x.end());
    } else if (!sent_.empty()) {
      sent_ = std::vector<float>();  // the warm-up is over
    }
    if (delayed() && !last_round_) StartNextRound();
    return msg;
  }

  absl::Status Combine(const MixingRow& row,
                       const std::map<int, const GossipMessage*>& received) override {
    const size_t n = x_.size();
    if (own_.numel != n) {
      return absl::FailedPreconditionError("diloco: Combine before a communicating Prepare");
    }
    TERN_RETURN_IF_ERROR(CheckReceived(row, received));
    // The plain mean of the updates heard, own included, whatever the row's weights: a worker
    // that was dropped leaves its share to all the others (the gossip rule gives it to the
    // receiver alone, which here would split θ), so workers that heard the same ones stay on one
    // model. Every part checked before any is summed, and the sum in worker-id order. An update
    // withdrawn (not sent) is in no one's mean: it goes back into the residual, sent later.
    const bool own = !withdrawn_;
    std::map<int, const EncodedTensor*> by_id;
    if (own) by_id[worker_] = &own_;
    // H (and the fragment count) from now on: the largest proposed among the updates in the
    // mean, the same set (so the same schedule, from the same step) on every worker that takes
    // the same θ.
    Proposal agreed = own ? sent_proposal_ : Proposal();
    for (const auto& [j, unused] : row.neighbours) {
      const GossipMessage& m = *received.at(j);
      TERN_ASSIGN_OR_RETURN(by_id[j], FindValid(j, m, "u"));
      agreed = std::max(agreed, Proposal{.h = m.propose_local_steps.value_or(0),
                                         .fragments = m.propose_fragments.value_or(0)});
    }
    if (!own) {
      mean_.resize(n);
      TERN_RETURN_IF_ERROR(DecodeChecked(worker_, own_, "u", absl::MakeSpan(mean_)));
      Axpy(n, 1.0f, mean_.data(), residual_.data());
      withdrawn_ = false;
      if (by_id.empty()) {  // no update anywhere: θ stays, and x starts again from it
        x_ = anchor_;
        own_ = EncodedTensor();
        return absl::OkStatus();
      }
    }
    const float w = 1.0f / static_cast<float>(by_id.size());
    mean_.assign(n, 0.0f);
    // Summed in one pass where the codec can (the sign codec: a block of each before the next).
    const std::vector<std::pair<int, const EncodedTensor*>> parts(by_id.begin(), by_id.end());
    const std::vector<float> weights(parts.size(), w);
    TERN_RETURN_IF_ERROR(AccumulateMany(parts, "u", weights, absl::MakeSpan(mean_)));
    if (!AllFinite(mean_)) {
      return absl::InvalidArgumentError(
          "diloco: the group's mean update is not finite; the outer step is not taken");
    }
    self_weight_ = w;
    if (sync_round_) {
      Axpy(n, 1.0f, mean_.data(), anchor_.data());
      // θ exactly where no step was taken since the send: the same bytes on every worker.
      Rebase(n, anchor_.data(), sent_.data(), x_.data());
      own_ = EncodedTensor();
      return absl::OkStatus();
    }
    scratch_.resize(n);
    outer_->Step(mean_, absl::MakeSpan(scratch_));
    Axpy(n, 1.0f, scratch_.data(), anchor_.data());
    if (tuned() && agreed.h > 0) {
      const int64_t h = std::clamp<int64_t>(agreed.h, min_h(), max_h());
      const int64_t q = fragments_tuned() ? ClampFragments(agreed.fragments) : 0;
      if (h != schedule_.period || q != schedule_.fragments) {
        // With a moving fragment count the lanes take their turns anew, each at its turn nearest
        // a period after its last exchange; with H alone each lane keeps its place in the
        // stagger.
        schedule_ = fragments_tuned() ? AlignedSchedule(h, q, options_.lane, last_sent_ + 1)
                                      : StepSchedule{.period = h, .from = last_sent_ + 1};
      }
    }
    // Delayed, x is the next round's, begun when this exchange was sent: it stays. Otherwise,
    // and at the run's last exchange (which ends the run on θ all the same), x takes θ, merged
    // as Streaming DiLoCo merges when the exchange overlapped steps: x ← α x + (1 − α) θ. The
    // run's last exchange is not merged: the run ends on the group's model, the same on every
    // worker.
    if (!delayed() || last_round_) {
      const float alpha = last_round_ ? 0.0f : static_cast<float>(options_.merge_alpha);
      if (options_.keep_overlap && !last_round_) {
        Rebase(n, anchor_.data(), sent_.data(), x_.data());
      } else if (alpha == 0) {
        x_ = anchor_;
      } else {
        Merge(n, alpha, anchor_.data(), x_.data());
      }
    }
    own_ = EncodedTensor();
    return absl::OkStatus();
  }

 protected:
  absl::Status InitState() override {
    const absl::Span<const float> x0 = params();
    anchor_.assign(x0.begin(), x0.end());
    residual_.assign(x_.size(), 0.0f);
    outer_->Reset(x_.size());
    own_ = EncodedTensor();
    if (delayed()) start_ = anchor_;
    self_weight_ = 1.0f / static_cast<float>(options_.workers);
    schedule_ = FirstSchedule(options_);
    proposal_ = tuned() ? Proposal{schedule_.period, schedule_.fragments} : Proposal();
    sent_proposal_ = Proposal();
    last_sent_ = -1;
    return absl::OkStatus();
  }

 private:
  bool delayed() const { return options_.outer_delay != OuterDelay::kNone; }
  bool tuned() const { return options_.local_steps_max > 0; }
  int64_t min_h() const { return std::max(1, options_.local_steps_min); }
  int64_t max_h() const { return std::max(min_h(), int64_t{options_.local_steps_max}); }
  bool fragments_tuned() const { return tuned() && options_.fragments_min > 0; }
  int64_t min_fragments() const { return std::max(1, options_.fragments_min); }
  int64_t ClampFragments(int64_t q) const {
    return std::clamp<int64_t>(q, min_fragments(),
                               std::max<int64_t>(min_fragments(), options_.fragments_max));
  }

  // The next round starts now, before this one's exchange is heard: from θ, which holds the
  // outer steps of every round before this one, or (eager) from θ moved as the outer optimizer
  // would move it for this worker's own update (mean_, as the others decode it) weighed as its
  // share of the mean, its state untouched: the group's mean replaces that step when it comes.
  void StartNextRound() {
    const size_t n = x_.size();
    start_ = anchor_;
    if (options_.outer_delay == OuterDelay::kEager) {
      for (size_t i = 0; i < n; ++i) scratch_[i] = self_weight_ * mean_[i];
      outer_->Preview(scratch_, absl::MakeSpan(mean_));
      for (size_t i = 0; i < n; ++i) start_[i] += mean_[i];
    }
    x_ = start_;
  }

  const std::unique_ptr<OuterOptimizer> outer_;
  std::vector<float> anchor_;    // θ, the same on every worker
  std::vector<float> residual_;  // error feedback: what earlier messages did not deliver
  EncodedTensor own_;            // this round's message, summed with the others'
  bool last_round_ = false;      // own_ is the run's last exchange (final_step)
  bool sync_round_ = false;      // own_ is a warm-up exchange (sync_steps)
  std::vector<float> sent_;      // a warm-up exchange's x as it was sent
  std::vector<float> mean_;      // ū (and, in Prepare, the own message decoded)
  std::vector<float> scratch_;   // u + decayed residual; then the outer step
  // Delayed or eager: where this round's inner steps started (u is measured from it).
  std::vector<float> start_;
  float self_weight_ = 1;   // this worker's weight in the last round's mean (1 / workers heard)
  StepSchedule schedule_;   // when this lane exchanges (H; moved by the group with local_steps_max)
  Proposal proposal_;       // what this worker proposes (ProposeSchedule; 0: none)
  Proposal sent_proposal_;  // what its last exchange carried
  int64_t last_sent_ = -1;  // the step of the last exchange sent
  bool withdrawn_ = false;  // the next Combine leaves own_ out (WithdrawOwn)
};

}  // namespace

std::unique_ptr<Algorithm> NewDiloco(const AlgorithmOptions& options, const CodecRegistry* codecs,
                                     std::unique_ptr<OuterOptimizer> outer) {
  return std::make_unique<Diloco>(options, codecs, std::move(outer));
}

}  // namespace tern
